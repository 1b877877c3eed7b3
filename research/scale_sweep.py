"""The softmax scale swept from 1e-3 to 1e3 on the inputs of the issue "never a wrong number" (GPU).

    python research/scale_sweep.py 20 21 22 .gpu/22_before_fix.cu

Unit-normal bf16 q, k, v (2 batches, 3 heads, 300 queries over 500 keys), causal and not, each
variant (as research/compare.py takes them: stage numbers, .cu files) at 13 scales against float64,
with the bound a float32 computation on the same inputs sets (tests/gpu_cases.numeric_check's): a
row the kernel gets wrong stands out as an error of the size of |v|. Each launch runs under a
watchdog that names it. Exits non-zero if any case is above its bound.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import compare  # noqa: E402  (research/compare.py: building variants, launching them)
import gpu_cases  # noqa: E402  (tests/gpu_cases.py: the reference)
from softmax_ranges import watchdog  # noqa: E402

SCALES = [10.0 ** (e / 2) for e in range(-6, 7)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+")
    args = parser.parse_args(argv)
    import torch

    variants = [compare.build_variant(spec) for spec in args.variants]
    failures = 0
    for var in variants:
        print(f"{var.name}: {var.note}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(20261201)
    q, k, v = (torch.randn(2, 3, n, 128, generator=gen, device="cuda").to(torch.bfloat16) for n in (300, 500, 500))
    v_max = v.double().abs().max().item()
    print(f"{'scale':>8s} {'mask':6s} {'bound':>8s}  " + "  ".join(f"{var.name[-24:]:>24s}" for var in variants))
    for causal in (False, True):
        for scale in SCALES:
            ref = gpu_cases.reference(q, k, v, causal=causal, scale=scale)
            e32 = (gpu_cases.reference(q, k, v, causal=causal, scale=scale, dtype=torch.float32).double() - ref)
            bound = 2 * e32.abs().max().item() + 2.0 ** -7 * v_max + gpu_cases.SMALLEST_NORMAL
            cells = []
            for var in variants:
                timer = watchdog(f"{var.name} scale {scale:.3g} causal={causal}")
                out = torch.full_like(q, float("nan"))
                compare.launcher(var, q, k, v, out, causal, scale)()
                torch.cuda.synchronize()
                timer.cancel()
                err = (out.double() - ref).abs().max().item()
                ok = math.isfinite(err) and err <= bound
                failures += not ok
                cells.append(f"{err:>15.3g} {'ok' if ok else 'WRONG':>8s}")
            print(f"{scale:8.3g} {'causal' if causal else 'full':6s} {bound:8.3g}  " + "  ".join(cells), flush=True)
    print("all within the bound" if not failures else f"{failures} cases above the bound")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
