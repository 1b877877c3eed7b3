"""The numeric-range fuzz: the score ranges real models reach, drawn from a seed (no torch needed).

Random unit-normal inputs are the easy case for a softmax: every score lies within a few units of
the row's maximum. ``numeric_cases(seed)`` draws cases that reach the other ranges, each a
``NumericCase`` that ``gpu_cases.numeric_inputs`` turns into tensors:

  normal        unit-normal q, k, v times an input scale (log-uniform 1e-3 .. 1e2)
  student_t     heavy-tailed entries (Student's t with 1 to 5 degrees of freedom), times the input scale
  outlier_*     one key per head whose score stands far above the rest (20 to 400 log2 units), in
                the first, a middle or the last K/V tile
  rising        every 128-key block scores `step` log2 units above the one before
  falling       the first block scores highest, the rest fall away
  jump          one block scores 160 log2 units above the rest: an exponential taken against an
                earlier reference overflows fp32
  jump_window   one block about 127 log2 units above the rest: finite exponentials between 2^126 and
                2^128, where a rebase factor of 2^-127 is below fp32's smallest normal number (the
                window stage 21's first rebase fell into)
  equal         every key of a head the same vector: all of a row's scores equal
  subnormal_qk  q and k of bf16 subnormal size: every score underflows to 0
  subnormal_v   v of bf16 subnormal size

Every case also draws a softmax scale (log-uniform 1e-3 .. 1e3; the profiles are calibrated to it),
causal or not, lengths that cross the 128-row and 128-key tile boundaries, and grouped K/V heads.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

KINDS = ("normal", "student_t", "outlier_first", "outlier_middle", "outlier_last", "rising", "falling", "jump",
         "jump_window", "equal", "subnormal_qk", "subnormal_v")
PROFILE_KINDS = ("rising", "falling", "jump", "jump_window")  # several K/V tiles needed
SCALES = (1e-3, 1e3)  # softmax scale, log-uniform
MAGNITUDES = (1e-3, 1e2)  # input scale, log-uniform
WORK_LIMIT = 3e7  # batch x heads x len_q x len_k: keeps the float64 reference to milliseconds
TILE = 128


@dataclass(frozen=True)
class NumericCase:
    kind: str
    scale: float  # the softmax scale passed to the kernel
    magnitude: float  # the inputs' scale (kinds that take one)
    causal: bool
    batch: int
    heads: int
    kv_heads: int
    len_q: int
    len_k: int
    dof: int = 0  # student_t: degrees of freedom
    block: int = 0  # outlier_* / jump*: the K/V tile that stands out
    step: float = 0.0  # rising / falling: log2 units per tile; jump*: the jump

    def label(self) -> str:
        extra = {"student_t": f" dof={self.dof}", "rising": f" step={self.step:g}", "falling": f" step={self.step:g}",
                 "jump": f" block={self.block}", "jump_window": f" block={self.block}"}.get(self.kind, "")
        if self.kind.startswith("outlier"):
            extra = f" block={self.block} height={self.step:g}"
        return (f"{self.kind}{extra} scale={self.scale:.3g} magnitude={self.magnitude:.3g} "
                f"(B, H, Hkv, Lq, Lk)=({self.batch}, {self.heads}, {self.kv_heads}, {self.len_q}, {self.len_k}) "
                f"causal={self.causal}")

    def asdict(self) -> dict:
        return asdict(self)


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _length(rng: random.Random, at_least: int = 1) -> int:
    pick = rng.random()
    if pick < 0.3:  # on a tile edge, or one off it
        n = TILE * rng.randint(1, 12) + rng.choice((-1, 0, 1))
    elif pick < 0.5:
        n = rng.randint(1, 300)
    else:
        n = int(_log_uniform(rng, 1, 2000))
    return max(at_least, n)


def numeric_cases(seed: int, count: int = 320) -> list[NumericCase]:
    """`count` cases, the same for the same seed; every kind appears, in turn, with random ranges."""
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        kind = KINDS[i % len(KINDS)]
        scale = _log_uniform(rng, *SCALES)
        magnitude = _log_uniform(rng, *MAGNITUDES)
        causal = rng.random() < 0.5
        min_k = 3 * TILE + 1 if kind in PROFILE_KINDS or kind.startswith("outlier") else 1
        len_k = _length(rng, min_k)
        len_q = _length(rng)
        if causal and rng.random() < 0.7:
            len_q = min(len_q, len_k)  # most causal calls have no more queries than keys
        group = rng.choice((1, 1, 2, 4, 8))
        kv_heads = rng.randint(1, 3)
        heads = kv_heads * group
        batch = rng.randint(1, 3)
        while batch * heads * len_q * len_k > WORK_LIMIT and batch > 1:
            batch -= 1
        while batch * heads * len_q * len_k > WORK_LIMIT:
            len_q = max(1, len_q // 2)
        tiles = math.ceil(len_k / TILE)
        dof, block, step = 0, 0, 0.0
        if kind == "student_t":
            dof = rng.choice((1, 2, 3, 5))
        elif kind.startswith("outlier"):
            block = {"outlier_first": 0, "outlier_middle": tiles // 2, "outlier_last": tiles - 1}[kind]
            step = _log_uniform(rng, 20, 400)
        elif kind == "rising":
            step = rng.choice((5.0, 30.0, 100.0))
        elif kind == "falling":
            step = rng.choice((8.0, 40.0))
        elif kind == "jump":
            block, step = rng.randint(1, tiles - 1), 160.0
        elif kind == "jump_window":
            block, step = rng.randint(1, tiles - 1), 127.0
        cases.append(NumericCase(kind, scale, magnitude, causal, batch, heads, kv_heads, len_q, len_k, dof, block,
                                 step))
    return cases
