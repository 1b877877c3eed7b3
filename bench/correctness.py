"""Correctness before timing: each arm's output against a float64 reference computed on the device.

The reference covers a sample of (batch, head) pairs and of query rows (all of them for small shapes):
float64 attention at the large shapes costs far more than the kernels, and a tiling or masking bug
shows in any head. Every output element is still checked for NaN/Inf: the output's memory is poisoned
with NaN before the launch, so a tile the kernel never writes cannot pass.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

TOLERANCE = 1e-2
MAX_PAIRS = 4  # (batch, head) pairs checked per shape
MAX_ROWS = 2048  # query rows checked per pair
EDGE_ROWS = 64  # first and last rows always checked: causal diagonals and tails live there
ROW_CHUNK = 512  # float64 score rows computed at once (bounds the reference's memory)


@dataclass(frozen=True)
class Sample:
    pairs: tuple[tuple[int, int], ...]
    rows: tuple[int, ...]

    def describe(self, batch: int, heads: int, len_q: int) -> str:
        if len(self.pairs) == batch * heads and len(self.rows) == len_q:
            return "all heads, all rows"
        return f"{len(self.pairs)} of {batch * heads} heads, {len(self.rows)} of {len_q} rows each"


def choose_sample(batch: int, heads: int, len_q: int, rng, max_pairs: int = MAX_PAIRS,
                  max_rows: int = MAX_ROWS) -> Sample:
    """Which (batch, head) pairs and query rows to check; rng is a random.Random (fresh per run)."""
    all_pairs = [(b, h) for b in range(batch) for h in range(heads)]
    if len(all_pairs) <= max_pairs:
        pairs = all_pairs
    else:
        # first and last pair (grid edges) plus random others
        rest = rng.sample(all_pairs[1:-1], max_pairs - 2)
        pairs = sorted({all_pairs[0], all_pairs[-1], *rest})
    if len_q <= max_rows:
        rows = list(range(len_q))
    else:
        edge = min(EDGE_ROWS, max_rows // 4)
        fixed = set(range(edge)) | set(range(len_q - edge, len_q))
        middle = [r for r in range(edge, len_q - edge)]
        rows = sorted(fixed | set(rng.sample(middle, max_rows - len(fixed))))
    return Sample(tuple(pairs), tuple(rows))


class Reference:
    """float64 softmax(scale·q kᵀ) v for the sampled pairs and rows (BHSD inputs), computed once per shape."""

    def __init__(self, torch, q, k, v, causal: bool, scale: float, sample: Sample):
        self.torch, self.sample = torch, sample
        rows = torch.tensor(sample.rows, device=q.device, dtype=torch.long)
        self.rows = rows
        self.values = {}
        len_k = k.shape[2]
        cols = torch.arange(len_k, device=q.device)
        group = q.shape[1] // k.shape[1]  # grouped-query: query head h reads K/V head h // group
        for b, h in sample.pairs:
            kk = k[b, h // group].double()
            vv = v[b, h // group].double()
            parts = []
            for start in range(0, len(rows), ROW_CHUNK):
                idx = rows[start:start + ROW_CHUNK]
                s = (q[b, h].index_select(0, idx).double() @ kk.T) * scale
                if causal:
                    # bottom-right aligned, as FlashAttention and hopattn: query i sees keys
                    # j <= i + Lk - Lq (the same as top-left when Lq == Lk, as in every bench shape)
                    s.masked_fill_(cols[None, :] > idx[:, None] + (len_k - q.shape[2]), -math.inf)
                parts.append(torch.softmax(s, dim=-1) @ vv)
            self.values[(b, h)] = torch.cat(parts)

    def rel_err(self, out) -> float:
        """‖out − ref‖ / ‖ref‖ (Frobenius, float64) over the sample; inf when any output is NaN/Inf."""
        torch = self.torch
        if not bool(torch.isfinite(out).all()):
            return math.inf
        num = 0.0
        den = 0.0
        for (b, h), ref in self.values.items():
            got = out[b, h].index_select(0, self.rows).double()
            num += float(((got - ref) ** 2).sum())
            den += float((ref ** 2).sum())
        return math.sqrt(num / den) if den > 0 else math.inf


def verdict(rel_err: float, tolerance: float = TOLERANCE) -> str | None:
    """None when the error is acceptable, otherwise the reason the arm is reported wrong."""
    if not math.isfinite(rel_err):
        return "output has NaN or Inf (a part of the output not written, or an overflow)"
    if rel_err >= tolerance:
        return f"relative error {rel_err:.3g} vs the float64 reference (tolerance {tolerance:g})"
    return None


def poisoned_call(torch, fn, out_numel: int, dtype, device):
    """Run fn once with the caching allocator primed with a NaN block of the output's size.

    The APIs under test allocate their own output; freeing a NaN-filled block of exactly that size
    just before the call makes the allocator hand it back, so unwritten elements read as NaN.
    Returns (result, poisoned) where poisoned says whether the output landed on the NaN block.
    """
    bait = torch.full((out_numel,), float("nan"), dtype=dtype, device=device)
    ptr = bait.data_ptr()
    del bait
    result = fn()
    out = result[0] if isinstance(result, (tuple, list)) else result
    return result, out.data_ptr() == ptr


def _why(err: BaseException) -> str:
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    return f"{type(err).__name__}: {lines[0].strip()[:300]}" if lines else type(err).__name__


def explained(fn):
    """fn(), where an SDPA "No available kernel" error gets the first warning as its reason: SDPA
    explains why a backend refused only through warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return fn()
        except Exception as err:
            hints = [str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()]
            if hints and "no available kernel" in str(err).lower():
                raise RuntimeError(f"{_why(err)} ({hints[0][:200]})") from err
            raise
