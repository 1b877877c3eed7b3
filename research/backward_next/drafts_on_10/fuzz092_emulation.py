"""Fuzz #92 of run 2026-12-03T1220 (B3 H1 Lq3 Lk18209, full), on the CPU: how far from float64 the
float32 algorithm itself is on such inputs (P and dS rounded to bf16, D from the bf16 output: the bound's
``reference_grads(..., like_kernel=True)``), and what relative error of dq each lost piece of its sum
would give, to set against the 0.0217 the drafts on stage 10 gave (README.md here).

    PYTHONPATH=kernels:. python research/backward_next/drafts_on_10/fuzz092_emulation.py [MAGNITUDE]

MAGNITUDE scales the normal inputs: 1 (the default, as first run), or 4, the GPU tests' draw
(gpu_cases.draw: scores with extremes past ±50, so a row's probability sits on a few keys).
"""
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
import backward_cases as bc  # noqa: E402

B, H, LQ, LK, D = 3, 1, 3, 18209, 128
SCALE = 1 / math.sqrt(D)
TAIL = LK // 128 * 128  # the first key of the 33-key tail block
MAGNITUDE = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0


def part(ds, k, lo: int, hi: int):
    """dq's sum over keys lo..hi alone."""
    return (ds[..., lo:hi] @ k[..., lo:hi, :]) * SCALE


print(f"# python {' '.join(sys.argv)}: B{B} H{H} Lq{LQ} Lk{LK} d{D}, full, inputs N(0, {MAGNITUDE:g}²); relative errors as the test's",
      "_check_grads reads them (the norm of the error over |dq| + 2^-8 |its cancellation size|), three draws",
      flush=True)
torch.manual_seed(0)
rows = {"the float32 algorithm (like_kernel)": [], "without the tail block (33 keys)": [],
        "without half the tail block's columns (one consumer's share)": [],
        "without the first 128-key block": [], "without one 64-key half of a block": []}
for _ in range(3):
    q, k, v = (torch.randn(B, H, n, D).mul(MAGNITUDE).to(torch.bfloat16) for n in (LQ, LK, LK))
    dout = torch.randn(B, H, LQ, D).to(torch.bfloat16)
    s = (q.double() @ k.double().transpose(-1, -2)) * SCALE
    p = torch.softmax(s, -1)
    out, lse = (p @ v.double()).to(torch.bfloat16), torch.logsumexp(s, -1).float()
    dq, _, _, size, *_ = bc.reference_grads(q, k, v, dout, causal=False, scale=SCALE, cancellation=True)
    alg = bc.reference_grads(q, k, v, dout, causal=False, scale=SCALE, dtype=torch.float32, out=out, lse=lse,
                             like_kernel=True)[0]
    scale_of = (dq.norm() + 2.0 ** -8 * size.norm()).item()
    ds = p * (dout.double() @ v.double().transpose(-1, -2) - (dout.double() * (p @ v.double())).sum(-1, keepdim=True))
    kd = k.double()
    tail = part(ds, kd, TAIL, LK)
    rows["the float32 algorithm (like_kernel)"].append((alg.double() - dq).norm().item() / scale_of)
    rows["without the tail block (33 keys)"].append(tail.norm().item() / scale_of)
    rows["without half the tail block's columns (one consumer's share)"].append(tail[..., :64].norm().item() / scale_of)
    rows["without the first 128-key block"].append(part(ds, kd, 0, 128).norm().item() / scale_of)
    rows["without one 64-key half of a block"].append(part(ds, kd, 128 * 70, 128 * 70 + 64).norm().item() / scale_of)
for name, values in rows.items():
    print(f"dq {name}: " + " ".join(f"{r:.4f}" for r in values))
