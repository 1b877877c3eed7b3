"""GPU check for the persistent stages (14, 15), beyond tests/test_kernels_gpu.py's shapes.

Those shapes give most CTAs of a persistent kernel one output tile (45 or 48 tiles on 132 SMs)
and the only many-tile shape has long rows (256 K/V tiles), where the K/V ring alone orders the Q
buffers. These shapes give every CTA several tiles, with rows shorter than the ring (1-3 K/V
tiles: the Q empty barriers and the O staging reuse do the work) and longer. Run once the stages
are in kernels/attention/ (or in a scratch copy with them moved in):

    python3 research/gpu_persistent.py 14 15

Symptoms and where to look: a hang only on shapes with more tiles than SMs -> the pingpong's last
arrival across tiles (consumer 1 must arrive after its last turn of every tile but the last); wrong
rows only in a CTA's second and later tiles -> per-tile reset or stage_of(); wrong results only
for short rows (len_k 64-192) -> the Q ring (q_empty); stage 15 only: columns permuted inside
128-byte rows -> the staging XOR, rows 64-127 of a tile wrong -> o_row / o_stage per consumer.
"""
import sys

import hopattn
import torch
from hopattn.records import runs

SHAPES = [  # (batch, heads, len_q, len_k): output tiles = batch * heads * len_q / 128
    (4, 33, 1024, 64),    # 1,056 tiles, 8 per CTA, one K/V tile each
    (4, 33, 1024, 128),   # two K/V tiles: shorter than the ring of four
    (2, 17, 2048, 192),   # 544 tiles, three K/V tiles
    (3, 11, 1280, 320),   # 330 tiles: 2-3 per CTA, five K/V tiles
    (2, 16, 4096, 1024),  # 1,024 tiles, 16 K/V tiles
    (1, 3, 128 * 133, 256),  # 399 tiles: CTAs get 3 or 4, not a multiple of 132
]


def reference(q, k, v):
    s = (q.double() @ k.double().transpose(-1, -2)) / 128**0.5
    return torch.softmax(s, dim=-1) @ v.double()


def main(stages):
    gen = torch.Generator(device="cuda").manual_seed(14)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ok = True
    for stage in stages:
        for b, h, lq, lk in SHAPES:
            if lk % hopattn.stages()[stage - 1].block_n:
                continue  # the stage takes whole K/V tiles only
            q = (torch.randn(b, h, lq, 128, generator=gen, device="cuda") * 4).to(torch.bfloat16)
            k = (torch.randn(b, h, lk, 128, generator=gen, device="cuda") * 4).to(torch.bfloat16)
            v = torch.randn(b, h, lk, 128, generator=gen, device="cuda").to(torch.bfloat16)
            out = hopattn.attention(q, k, v, stage=stage)
            # Only the tile order changed from stage 13: the same tiles computed by the same
            # instructions must give the same bits, so any difference is a scheduling bug, not rounding.
            # Stages past 15 change the arithmetic (the tile shape): their error must stay within
            # stage 13's on the same inputs instead.
            base = hopattn.attention(q, k, v, stage=13)
            base_err = (base.double() - reference(q, k, v)).abs().max().item()
            same = torch.equal(out, base) if stage <= 15 else None
            torch.cuda.synchronize()
            ref = reference(q, k, v)
            err = (out.double() - ref).abs().max().item()
            tiles = b * h * lq // 128
            bad = (same is False) or err > max(5e-2, 1.5 * base_err) or not torch.isfinite(out).all()
            ok &= not bad
            where = ""
            if bad:  # which tiles are wrong, by tile index and the CTA that ran it
                diff = (out != base) if same is False else ((out.double() - ref).abs() > 1.5 * base_err)
                per_tile = diff.reshape(b * h, lq // 128, 128 * 128).any(-1).flatten()
                wrong = per_tile.nonzero().flatten().tolist()
                grid = min(sms, tiles)
                where = f"  wrong tiles {wrong[:8]}, their (CTA, round) {[(t % grid, t // grid) for t in wrong[:8]]}"
            print(f"stage {stage:02d} {(b, h, lq, lk)}: {tiles} tiles, max abs err {err:.2e}, bitwise equal to stage 13: {same}"
                  f"{'  FAIL' if bad else ''}{where}", flush=True)
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    print(runs.log_header(runs.script_command()), flush=True)  # first: a log kept under bench/logs says what made it
    sys.exit(main([int(s) for s in sys.argv[1:]] or [14, 15, 16]))
