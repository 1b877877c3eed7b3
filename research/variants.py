"""Experiment: time variants of a stage (constants overridden, or another .cu file) side by side.

A development tool, not the benchmark harness: numbers from it go into notes as such, never into
bench/results. Run on the GPU machine: python3 research/variants.py s06,s06_lb3
"""
import math
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import torch
import triton
from hopattn import api, build, lineage
from hopattn.records import runs

print(runs.log_header(runs.script_command()), flush=True)  # first: a log kept under bench/logs says what made it

VARIANTS = {  # name: (stage folder or .cu file, {constant: value}, min blocks per SM for __launch_bounds__)
    "s05": ("05_cp-async", {}, None),
    "s06": ("06_softmax-arith", {}, None),
    "s06_n32": ("06_softmax-arith", {"BLOCK_N": 32}, None),
    "s08": ("08_wgmma", {}, None),
    # Stage 18's scheduler: head-group size for L2, dynamic claims against a static order (snaked or not).
    "s16": ("16_tile-shape", {}, None),
    "s17": ("17_causal", {}, None),
    "s18": ("18_causal-scheduling", {}, None),
    "s18_g8": ("18_causal-scheduling", {"HEAD_GROUP_BYTES": 8 << 20}, None),
    "s18_g96": ("18_causal-scheduling", {"HEAD_GROUP_BYTES": 96 << 20}, None),
    "s18_lpt": ("18_causal-scheduling", {"HEAD_GROUP_BYTES": 2000000000}, None),
    "s18_static": ("research/variants/18_static.cu", {}, None),
    "s18_snake": ("research/variants/18_static.cu", {"SNAKE": 1}, None),
    "s18_snake_g8": ("research/variants/18_static.cu", {"SNAKE": 1, "HEAD_GROUP_BYTES": 8 << 20}, None),
    # Where stage 18's time goes: one part of the work taken away at a time (make_ablate.py), and wider K/V tiles.
    "ab_none": ("research/variants/18_ablate.cu", {}, None),
    "ab_softmax": ("research/variants/18_ablate.cu", {"ABLATE_SOFTMAX": 1}, None),
    "ab_exp": ("research/variants/18_ablate.cu", {"ABLATE_EXP": 1}, None),
    "ab_pingpong": ("research/variants/18_ablate.cu", {"ABLATE_PINGPONG": 1}, None),
    "ab_kv_loads": ("research/variants/18_ablate.cu", {"ABLATE_KV_LOADS": 1}, None),
    "ab_uni": ("research/variants/18_ablate.cu", {"UNIFORM_CONSUMER": 1}, None),
    "ab_tree": ("research/variants/18_ablate.cu", {"MAX_TREE": 1}, None),
    "ab_unitree": ("research/variants/18_ablate.cu", {"UNIFORM_CONSUMER": 1, "MAX_TREE": 1}, None),
    # One Q buffer (needed for shared memory at 144 or 160 keys); the first version of these hung:
    # the last V of a tile was issued only after the Q wait that its PV releases.
    "ab_q1": ("research/variants/18_ablate.cu", {"Q_STAGES": 1}, None),
    "ab_n144": ("research/variants/18_ablate.cu", {"BLOCK_N": 144, "Q_STAGES": 1}, None),
    "ab_n160": ("research/variants/18_ablate.cu", {"BLOCK_N": 160, "Q_STAGES": 1}, None),
    "ab_uni_n160": ("research/variants/18_ablate.cu", {"UNIFORM_CONSUMER": 1, "BLOCK_N": 160, "Q_STAGES": 1}, None),
    # Is it the loads' latency? A deeper V ring. (A variant whose consumers never waited for the
    # loads was tried and dropped: a CTA could exit with its copies in flight, an invalid launch.)
    "ab_v3": ("research/variants/18_ablate.cu", {"V_STAGES": 3, "Q_STAGES": 1}, None),
    "ab_uni_v3": ("research/variants/18_ablate.cu", {"UNIFORM_CONSUMER": 1, "V_STAGES": 3, "Q_STAGES": 1}, None),
    # ncu: stage 18 moves twice FA4's bytes through L2 (lts__t_bytes) — the tensor maps' 256-byte promotion?
    "ab_l2_128": ("research/variants/18_ablate.cu", {"L2_PROMO": 128}, None),
    "ab_l2_none": ("research/variants/18_ablate.cu", {"L2_PROMO": 0}, None),
    # ab_no_ring and ab_hoist* (s12/diet.log) were stage 18 with the switches that became stage
    # 18's non-causal path and stage 19: those are s18 and s19 now.
    # Stage 19 without the L2 promotion, and with the warp-uniform consumer index (make_19_variants.py).
    "s19": ("19_descriptor-offsets", {}, None),
    "s19_l2n": ("research/variants/19_l2none.cu", {}, None),
    "s19_uni": ("research/variants/19_uni.cu", {}, None),
    # Two P buffers: P rounded inside the softmax, off the path between a PV's retirement and the next turn.
    "s19_p2": ("research/variants/19_p2.cu", {}, None),
    # Part of the exponentials on the FMA pipe (make_poly.py): 8, 16 or 20 of 64.
    "s19_poly8": ("research/variants/19_poly.cu", {"POLY_EVERY": 8}, None),
    "s19_poly4": ("research/variants/19_poly.cu", {"POLY_EVERY": 4}, None),
    "s19_poly3": ("research/variants/19_poly.cu", {"POLY_EVERY": 3}, None),
    # 2-CTA clusters multicasting K and V on non-causal launches (make_cluster.py); CLUSTER 1 = stage 18.
    "cluster": ("research/variants/18_cluster.cu", {}, None),
    "cluster1": ("research/variants/18_cluster.cu", {"CLUSTER": 1}, None),
}
if len(sys.argv) > 1:
    VARIANTS = {k: v for k, v in VARIANTS.items() if k in sys.argv[1].split(",")}
out_dir = Path(os.environ.get("VARIANT_DIR", "/tmp/variants"))

# Experiment sources that are not committed: written by their generator when missing.
GENERATED = {"18_ablate.cu": "make_ablate.py", "18_cluster.cu": "make_cluster.py",
             "19_p2.cu": "make_p2.py", "19_poly.cu": "make_poly.py",
             "19_l2none.cu": "make_19_variants.py", "19_uni.cu": "make_19_variants.py"}


def make(name, folder, consts, minb):
    path = Path(folder) if folder.endswith(".cu") else lineage.ATTENTION_DIR / folder / "kernel.cu"
    src = path.read_text().replace('"/work/main/kernels/attention/common/', '"../common/')
    for c, v in consts.items():
        src, n = re.subn(rf"(constexpr int {c} = )[^;]+;", rf"\g<1>{v};", src)
        assert n == 1, (name, c)
    if minb:
        src = src.replace("__launch_bounds__(NUM_THREADS)", f"__launch_bounds__(NUM_THREADS, {minb})")
    d = out_dir / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "kernel.cu").write_text(src.replace('"../common/', f'"{lineage.ATTENTION_DIR}/common/'))
    lib = d / "lib.so"
    # Flags of a stage with the same instruction set (wgmma and TMA need the sm_90a target alone).
    hopper = any(word in src for word in ("wgmma", "cp.async.bulk", "tma.cuh"))
    stage = lineage.load_stage(lineage.ATTENTION_DIR / ("08_wgmma" if hopper else "06_softmax-arith"))
    cmd = [build.nvcc(), *build.nvcc_flags(stage), "-o", str(lib), str(d / "kernel.cu")]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        return name, None, p.stderr[-2000:]
    regs = re.findall(r"Used (\d+) registers.*", p.stdout + p.stderr)
    spill = re.findall(r"(\d+) bytes spill stores", p.stdout + p.stderr)
    return name, lib, f"regs {regs[0] if regs else '?'} spill {spill[0] if spill else '?'}"

for folder, _, _ in VARIANTS.values():  # before the parallel builds, which read them
    path = Path(folder)
    if folder.endswith(".cu") and not path.exists() and path.name in GENERATED:
        subprocess.run([sys.executable, str(path.parent / GENERATED[path.name])], check=True)
with ThreadPoolExecutor(16) as ex:
    built = list(ex.map(lambda kv: make(kv[0], *kv[1]), VARIANTS.items()))

# Shapes "B,H,L,causal;..." (VARIANT_SHAPES), default the 8k non-causal one.
SHAPES = [tuple(int(x) for x in sh.split(",")) for sh in os.environ.get("VARIANT_SHAPES", "4,16,8192,0").split(";")]
native = api._native()
ROUNDS = int(os.environ.get("VARIANT_ROUNDS", "1"))  # the whole list again, for a spread (order effects, clocks)


def launcher(lib, q, k, v, o, st, B, H, L, causal):
    """One launch of a built variant, its tensors and sizes bound now (not the loop's variables)."""
    def run():
        lib.launch(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), st, st, st, st, B, H, L, L, 128,
                   1 / math.sqrt(128), bool(causal), 132, torch.cuda.current_stream().cuda_stream)
    return run


for B, H, L, causal in SHAPES:
    print(f"shape {B},{H},{L} {'causal' if causal else 'non-causal'}", flush=True)
    q, k, v = (torch.randn(B, H, L, 128, device="cuda", dtype=torch.bfloat16) * 2 for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=bool(causal))
    flops = 4 * B * H * L * L * 128 / (2 if causal else 1)
    for name, lib, info in [b for _ in range(ROUNDS) for b in built]:
        if lib is None:
            print(f"{name:16s} BUILD FAILED {info}")
            continue
        o = torch.full_like(q, float("nan"))
        L_ = native.StageLibrary(str(lib))
        st = (H * L * 128, L * 128, 128)
        run = launcher(L_, q, k, v, o, st, B, H, L, causal)
        try:
            run()
            torch.cuda.synchronize()
        except Exception as e:
            print(f"{name:16s} LAUNCH FAILED {e}", flush=True)
            continue
        err = ((o.float() - ref).norm() / ref.norm()).item()
        ms = triton.testing.do_bench(run, warmup=100, rep=400, return_mode="median")
        print(f"{name:16s} {info:22s} err {err:.1e}  {ms:7.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s", flush=True)
    if os.environ.get("VARIANT_FA4"):  # the peer, same process and inputs (its layout is BSHD)
        try:
            from flash_attn.cute import flash_attn_func
        except Exception as e:
            print(f"{'fa4':16s} NOT IMPORTABLE {e}", flush=True)
            continue
        qs, ks, vs = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        run = partial(flash_attn_func, qs, ks, vs, causal=bool(causal))
        out = run()
        out = out[0] if isinstance(out, tuple) else out
        err = ((out.transpose(1, 2).float() - ref).norm() / ref.norm()).item()
        ms = triton.testing.do_bench(run, warmup=100, rep=400, return_mode="median")
        print(f"{'fa4':16s} {'':22s} err {err:.1e}  {ms:7.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s", flush=True)
