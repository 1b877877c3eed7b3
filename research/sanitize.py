"""One launch per (stage, shape), for compute-sanitizer: racecheck, synccheck and memcheck.

    compute-sanitizer --tool racecheck --racecheck-report hazard python research/sanitize.py 19 --shapes hung
    compute-sanitizer --tool memcheck python research/sanitize.py 18,19 --shapes 9,15,512,256,1

Shapes are B,H,Lq,Lk,causal (';'-separated), or `hung`: the causal shapes with more queries than
keys that deadlocked stages 18 and 19 before the fix, cut to a size the sanitizers finish in
minutes (the tools slow kernels down 10-1000x), plus the neighbouring cases (one tile with work, most
CTAs with only empty tiles). Each output is poisoned (NaN) before the launch and checked against an
fp32 reference after it; the script prints one line per launch and exits non-zero on a wrong one.
Stage 18's and 19's notes cite its results.
"""

from __future__ import annotations

import argparse
import math
import sys

HUNG = [  # (B, H, Lq, Lk, causal): many output tiles, many of them with rows that see no key
    (9, 15, 512, 256, 1),
    (1, 2, 131072, 128, 1),
    (1, 3, 12817, 1056, 1),
    (1, 1, 40000, 1, 1),
    (3, 100, 1024, 1, 1),
    (2, 3, 1000, 200, 1),
    (2, 3, 1000, 1200, 0),
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stages", help="stage numbers, comma-separated")
    parser.add_argument("--shapes", default="hung")
    args = parser.parse_args(argv)

    import hopattn
    import torch

    shapes = HUNG if args.shapes == "hung" else [tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";")]
    bad = 0
    for stage in (int(s) for s in args.stages.split(",")):
        for b, h, lq, lk, causal in shapes:
            gen = torch.Generator(device="cuda").manual_seed(lq * 31 + lk)
            q = torch.randn(b, h, lq, 128, generator=gen, device="cuda").to(torch.bfloat16)
            k, v = (torch.randn(b, h, lk, 128, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
            out = torch.full_like(q, float("nan"))
            print(f"stage {stage:02d} {(b, h, lq, lk)} causal={bool(causal)}: launching", flush=True)
            hopattn.attention(q, k, v, causal=bool(causal), stage=stage, out=out)
            torch.cuda.synchronize()
            # fp32 reference in chunks of heads; rows that see no key are 0
            err_num = err_den = 0.0
            for bi in range(b):
                for hi in range(h):
                    s = (q[bi, hi].float() @ k[bi, hi].float().T) / math.sqrt(128)
                    if causal:
                        i = torch.arange(lq, device="cuda")[:, None]
                        s.masked_fill_(torch.arange(lk, device="cuda")[None, :] > i + lk - lq, float("-inf"))
                    seen = torch.isfinite(s).any(-1, keepdim=True)
                    ref = (torch.softmax(s.masked_fill(~seen, 0), -1) * seen) @ v[bi, hi].float()
                    err_num += (out[bi, hi].float() - ref).norm().item() ** 2
                    err_den += ref.norm().item() ** 2
            err = math.sqrt(err_num / max(err_den, 1e-30))
            ok = not out.isnan().any().item() and err < 1e-2
            bad += not ok
            print(f"stage {stage:02d} {(b, h, lq, lk)} causal={bool(causal)}: {'ok' if ok else 'WRONG'} "
                  f"(rel. error {err:.2e})", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
