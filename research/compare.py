"""Times variants of a stage against each other in one process: interleaved rounds, medians, spread.

A variant is
  19                     stage 19 as it is in the working tree
  19@2985d32             stage 19 (kernel.cu and the shared headers) as it was at a git revision
  19+BLOCK_N=176         stage 19 with `constexpr int` constants overridden (several: +A=1+B=2)
  path/to/kernel.cu      a kernel file (its "../common/..." includes resolve to kernels/attention/common)
  fa3, fa4, cudnn        a peer, where importable (FlashAttention-3/-4 BSHD, SDPA's cuDNN backend)

Every variant is first checked against float64 on the shape's inputs (rel. error < 1e-2, outputs
poisoned), then timed with the benchmark harness's timer (L2 flushed before each launch, an untimed
warm-up per arm, arm order rotated every round). Ratios are each variant's time over the first
variant's, per round, so the clock drift of a shared machine cancels; the table gives their median
and the spread (min..max) over the rounds.

    python research/compare.py 19@2985d32 19 --shapes 4k,8k,16k --causal both --rounds 5
    python research/compare.py 19 19+BLOCK_N=176 fa3 --shapes 8k --causal off

Numbers from it go into stage notes as measurements of that experiment; published numbers come from
`python -m bench` into bench/results/.
"""

from __future__ import annotations

import argparse
import math
import re
import shutil
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hopattn import build, lineage
from hopattn.records import runs

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "build" / "compare"
SHAPES = {  # name: (batch, heads, len_q, len_k)
    "4k": (8, 16, 4096, 4096), "8k": (4, 16, 8192, 8192), "16k": (2, 16, 16384, 16384),
    "32k": (1, 16, 32768, 32768), "2k": (16, 16, 2048, 2048), "1k": (32, 16, 1024, 1024),
    "512x32k": (4, 16, 512, 32768),
}
PEERS = ("fa3", "fa4", "cudnn")


@dataclass
class Variant:
    name: str
    library: Path | None = None  # a stage-like shared library, or None for a peer
    note: str = ""


def _stage_folder(number: int) -> Path:
    return next(s.dir for s in lineage.discover() if s.number == number)


def _source(spec: str) -> tuple[Path, dict[str, str]]:
    """The kernel.cu a variant compiles, written under build/compare/<name>/attention/<folder>/."""
    base, *overrides = spec.split("+")
    consts = dict(o.split("=", 1) for o in overrides)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", spec)
    tree = WORK / safe / "attention"
    if tree.exists():
        shutil.rmtree(tree)
    if base.endswith(".cu"):
        folder = tree / "variant"
        folder.mkdir(parents=True)
        shutil.copytree(lineage.ATTENTION_DIR / "common", tree / "common")
        (folder / "kernel.cu").write_text(Path(base).read_text())
    else:
        number, _, rev = base.partition("@")
        name = _stage_folder(int(number)).name
        folder = tree / name
        folder.mkdir(parents=True)
        if rev:  # the stage and the headers at that revision
            for rel in [f"kernels/attention/{name}/kernel.cu"]:
                (folder / "kernel.cu").write_bytes(_git_show(rev, rel))
            listing = subprocess.run(["git", "ls-tree", "--name-only", rev, "kernels/attention/common/"], cwd=REPO,
                                     capture_output=True, text=True, check=True).stdout.split()
            (tree / "common").mkdir()
            for rel in listing:
                (tree / "common" / Path(rel).name).write_bytes(_git_show(rev, rel))
        else:
            shutil.copytree(lineage.ATTENTION_DIR / "common", tree / "common")
            shutil.copy(lineage.ATTENTION_DIR / name / "kernel.cu", folder / "kernel.cu")
    src = (folder / "kernel.cu").read_text()
    for const, value in consts.items():
        src, n = re.subn(rf"(constexpr int {const} = )[^;]+;", rf"\g<1>{value};", src)
        if n != 1:
            raise SystemExit(f"{spec}: no `constexpr int {const} = ...;` in the kernel")
    (folder / "kernel.cu").write_text(src)
    return folder / "kernel.cu", consts


def _git_show(rev: str, path: str) -> bytes:
    return subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, capture_output=True, check=True).stdout


def build_variant(spec: str) -> Variant:
    if spec in PEERS:
        return Variant(spec)
    kernel, _ = _source(spec)
    hopper = any(word in kernel.read_text() for word in ("wgmma", "cp.async.bulk", "tma"))
    flags = build.nvcc_flags(lineage.load_stage(lineage.ATTENTION_DIR / ("08_wgmma" if hopper else "06_softmax-arith")))
    library = kernel.with_suffix(".so")
    proc = subprocess.run([build.nvcc(), *flags, "-o", str(library), str(kernel)], capture_output=True, text=True)
    if proc.returncode:
        return Variant(spec, None, "BUILD FAILED\n" + proc.stderr[-3000:])
    log = proc.stdout + proc.stderr
    regs = re.findall(r"Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores", log)
    return Variant(spec, library, f"regs {'/'.join(regs)} spill {'/'.join(spills)}")


def launcher(variant: Variant, q, k, v, out, causal: bool, scale: float = 1 / math.sqrt(128)):
    """A zero-argument launch of the variant on BHSD q, k, v into out (BHSD); `scale`: the softmax's
    (a stage-like library only; the peers run at their default, 1/sqrt(128))."""
    import torch
    from hopattn import api

    b, h, lq, _ = q.shape
    lk = k.shape[2]
    if variant.library is not None:
        lib = api._native().StageLibrary(str(variant.library))
        st_q, st_k = (h * lq * 128, lq * 128, 128), (h * lk * 128, lk * 128, 128)
        sms = torch.cuda.get_device_properties(0).multi_processor_count

        def run():
            lib.launch(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), st_q, st_k, st_k, st_q, b, h, lq, lk,
                       128, scale, causal, sms, torch.cuda.current_stream().cuda_stream, h, 0)
        return run
    # A peer writes its own output tensor: the timed call is the peer's alone, and `fill_out` (run
    # once, for the correctness check) copies its result into `out` outside the timing.
    if variant.name == "cudnn":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def run():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def fill_out():
            out.copy_(run())
    else:
        qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        if variant.name == "fa3":
            from flash_attn_interface import flash_attn_func
        else:
            from flash_attn.cute import flash_attn_func

        def run():
            return flash_attn_func(qs, ks, vs, causal=causal)

        def fill_out():
            r = run()
            out.copy_((r[0] if isinstance(r, tuple) else r).transpose(1, 2))
    run.fill_out = fill_out
    return run


def reference(q, k, v, causal: bool):
    import torch

    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    lq, lk = q.shape[2], k.shape[2]
    rows = max(1, (1 << 30) // (8 * q.shape[0] * q.shape[1] * lk))
    for r0 in range(0, lq, rows):
        r1 = min(lq, r0 + rows)
        s = torch.matmul(q[:, :, r0:r1].double(), k.double().transpose(-1, -2)) / math.sqrt(128)
        if causal:
            i = torch.arange(r0, r1, device=q.device)[:, None]
            s.masked_fill_(torch.arange(lk, device=q.device)[None, :] > i + lk - lq, float("-inf"))
        out[:, :, r0:r1] = torch.matmul(torch.softmax(s, -1), v.double())
    return out


def parse_shapes(text: str) -> list[tuple[int, int, int, int]]:
    """'4k,8k' (names) or '1,16,32768,32768;4,16,512,32768' (B,H,Lq,Lk), pieces ';'-separated."""
    shapes = []
    for piece in text.split(";"):
        parts = [p.strip() for p in piece.split(",") if p.strip()]
        if all(p in SHAPES for p in parts):
            shapes += [SHAPES[p] for p in parts]
        elif len(parts) == 4:
            shapes.append(tuple(int(p) for p in parts))
        else:
            raise SystemExit(f"--shapes: {piece!r} is neither names ({', '.join(SHAPES)}) nor B,H,Lq,Lk")
    return shapes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("variants", nargs="+", help="the first is the baseline of the ratios")
    parser.add_argument("--shapes", default="8k", help=f"names ({', '.join(SHAPES)}) or B,H,Lq,Lk; ';'-separated")
    parser.add_argument("--causal", choices=("off", "on", "both"), default="off")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--launches", type=int, default=20, help="timed launches per arm and round")
    args = parser.parse_args(argv)

    import torch

    from bench import timing

    with ThreadPoolExecutor(8) as pool:
        variants = list(pool.map(build_variant, args.variants))
    for v in variants:
        print(f"{v.name:28s} {v.note}", flush=True)
    timer = timing.Timer(torch)
    shapes = parse_shapes(args.shapes)
    masks = {"off": (False,), "on": (True,), "both": (False, True)}[args.causal]
    print(f"\n{'shape':24s} {'variant':28s} {'TFLOP/s':>8s} {'ratio':>7s} {'spread':>15s} {'err':>8s}")
    for b, h, lq, lk in shapes:
        for causal in masks:
            gen = torch.Generator(device="cuda").manual_seed(b * 7 + h * 13 + lq + lk + causal)
            q = (torch.randn(b, h, lq, 128, generator=gen, device="cuda") * 2).to(torch.bfloat16)
            k, v = ((torch.randn(b, h, lk, 128, generator=gen, device="cuda") * 2).to(torch.bfloat16) for _ in range(2))
            ref = reference(q, k, v, causal)
            flops = 4 * b * h * lq * lk * 128 / (2 if causal else 1)
            arms, errors = {}, {}
            for var in variants:
                if var.library is None and var.name not in PEERS:
                    continue
                out = torch.full_like(q, float("nan"))
                try:
                    run = launcher(var, q, k, v, out, causal)
                    getattr(run, "fill_out", run)()
                    torch.cuda.synchronize()
                except Exception as err:  # noqa: BLE001  (a missing peer, a failed launch: reported, not fatal)
                    print(f"  {var.name}: {type(err).__name__}: {str(err)[:200]}", flush=True)
                    continue
                errors[var.name] = ((out.double() - ref).norm() / ref.norm()).item()
                if math.isnan(errors[var.name]) or errors[var.name] > 1e-2:
                    print(f"  {var.name}: WRONG (rel. error {errors[var.name]:.2e}), not timed", flush=True)
                    continue
                arms[var.name] = run
            del ref
            first = {n: timer.one(f) for n, f in arms.items()}
            rounds = timing.run_rounds(timer, arms, args.rounds, {n: args.launches for n in arms},
                                       warm={n: timing.warm_launches(first[n]) for n in arms})["round_ms"]
            base = args.variants[0]
            label = f"{b},{h},{lq},{lk} {'causal' if causal else 'full'}"
            for name, times in rounds.items():
                med = statistics.median(times)
                ratios = [rounds[base][i] / t for i, t in enumerate(times)] if base in rounds else [math.nan]
                print(f"{label:24s} {name:28s} {flops / med / 1e9:8.1f} {statistics.median(ratios):7.3f} "
                      f"{min(ratios):7.3f}..{max(ratios):.3f} {errors[name]:8.1e}", flush=True)
    return 0


if __name__ == "__main__":
    print(runs.log_header(runs.script_command()), flush=True)  # first: a log kept under bench/logs says what made it
    sys.exit(main())
