"""Statistics over repetitions: medians, spread and same-run ratios (pure Python, no torch)."""

from __future__ import annotations

import statistics


def median(values) -> float:
    values = list(values)
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


def summarize(round_ms: list[float]) -> dict:
    """The results-file timing fields from one arm's per-round times (each a median of N launches)."""
    med = median(round_ms)
    lo, hi = min(round_ms), max(round_ms)
    return {"median_ms": med, "min_ms": float(lo), "max_ms": float(hi),
            "spread_pct": (hi - lo) / med * 100.0, "samples": len(round_ms)}


def ratio(arm_ms: list[float], ref_ms: list[float]) -> float:
    """Speed of the arm over the reference (>1 = faster): per round ref/arm, then the median.

    Pairing rounds cancels drifts (clocks, temperature) that affect both arms of the same round.
    """
    if len(arm_ms) != len(ref_ms) or not arm_ms:
        raise ValueError(f"ratio needs the same number of rounds for both arms (got {len(arm_ms)} and {len(ref_ms)})")
    return median(r / a for a, r in zip(arm_ms, ref_ms, strict=True))


def round_order(names: list, round_index: int) -> list:
    """Arm order of one round: as given on even rounds, reversed on odd ones (cancels order effects)."""
    return list(names) if round_index % 2 == 0 else list(reversed(names))
