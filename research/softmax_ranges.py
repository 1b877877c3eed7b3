"""Checks kernels on scores whose row maxima move far (GPU): the paths a softmax takes only when they do.

    python research/softmax_ranges.py 20 research/variants/20_nomax.cu

A kernel that defers or skips part of its running maximum (stage 20's lazy rescale, or a variant
that takes the exponentials against a stale reference and checks the row sums afterwards) has slow
paths that random inputs never reach. These inputs reach them:

  rising   every key block scores higher than the last: each row's maximum grows by
           `step` (log2 units) per 128-key block, so the reference must move again and again
  jump     one key block scores ~160 log2 units above the rest: an exponential taken against the
           old reference overflows (2^160 > fp32's range), so the tile must be recomputed
  falling  the first block scores highest: the reference never moves, later blocks underflow

Each case is checked against float64 (outputs poisoned with NaN first), causal and not, at an even
and an odd length. Each launch runs under a watchdog that names it and ends the process if it hangs. Exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hopattn.records import runs

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import compare  # noqa: E402  (research/compare.py: building variants, launching them)
import gpu_cases  # noqa: E402  (tests/gpu_cases.py: the inputs of test_row_maxima_that_move_far, the reference)

CASE_SECONDS = 60


def watchdog(case: str):
    """A timer that names the case and ends the process if it runs past CASE_SECONDS (a kernel that
    hangs inside a CUDA call never returns to Python, so an exception could not stop it)."""
    def fire():
        print(f"WATCHDOG: {case} ran past {CASE_SECONDS} s: a hang until proven otherwise", flush=True)
        os._exit(3)
    timer = threading.Timer(CASE_SECONDS, fire)
    timer.daemon = True
    timer.start()
    return timer


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+", help="as research/compare.py takes them (stage numbers, .cu files)")
    args = parser.parse_args(argv)
    import torch

    with ThreadPoolExecutor(8) as pool:
        variants = list(pool.map(compare.build_variant, args.variants))
    failures = 0
    for var in variants:
        print(f"{var.name}: {var.note}", flush=True)
        failures += var.library is None
    variants = [var for var in variants if var.library is not None]
    for kind in gpu_cases.MAXIMA_PROFILES:
        for b, h, lq, lk in ((1, 4, 2048, 2048), (2, 2, 1000, 3001)):
            for causal in (False, True):
                shape = f"{kind} {b}x{h}x{lq}x{lk} {'causal' if causal else 'full'}"
                q, k, v = gpu_cases.maxima_inputs(kind, (b, h, lq, lk), seed=lq + lk + causal)
                ref = gpu_cases.reference(q, k, v, causal=causal, scale=1 / math.sqrt(128))
                for var in variants:
                    case = f"{var.name} {shape}"
                    timer = watchdog(case)
                    out = torch.full_like(q, float("nan"))
                    compare.launcher(var, q, k, v, out, causal)()
                    torch.cuda.synchronize()
                    timer.cancel()
                    err = ((out.double() - ref).norm() / ref.norm()).item()
                    ok = math.isfinite(err) and err < 1e-2
                    failures += not ok
                    print(f"  {case:66s} rel. error {err:.2e} {'ok' if ok else 'FAILED'}", flush=True)
    print("all ok" if not failures else f"{failures} FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    print(runs.log_header(runs.script_command()), flush=True)  # first: a log kept under bench/logs says what made it
    sys.exit(main())
