"""The RMSNorm lineage's GPU cases as data (pure Python, no torch): fixed lengths from 1 to past
262144 columns, odd ones and the edges of every stage's configurations, then a seeded fuzz of
shapes, dtypes, views and magnitudes. tests/test_rmsnorm_gpu.py runs them; tests/test_rmsnorm_fuzz.py
checks their spread on the CPU. The backward's (backward_cases) add whether rstd reached the loss
(drstd) and whether dw is wanted; tests/test_rmsnorm_backward_gpu.py runs them. The softmax lineages'
(softmax_cases) are the same lengths, views and magnitudes, some with masked (−inf) columns;
tests/test_softmax_gpu.py runs them."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

DTYPES = ("bf16", "fp16", "fp32")
# contiguous; a column slice of a wider tensor (rows further apart); the same at a 1-element offset
# (no row on a 16-byte boundary: the element-at-a-time path); an odd row stride; a 3-d tensor whose
# two leading axes fold into the rows
VIEWS = ("contiguous", "wide", "offset", "odd-stride", "3d")
MAX_ELEMENTS = 1 << 23  # per case: 16 MB of bf16 input, a 64 MB float64 reference
EDGES = (1, 2, 3, 7, 8, 9, 31, 255, 256, 257, 1023, 1024, 1025, 2047, 2048, 2049, 4095, 4096, 4097, 8191, 8192, 8193,
         16384, 16385, 32767, 32768, 32769, 65535, 65536, 65537, 131072, 131073, 262143, 262144, 262145, 524288,
         524289)


@dataclass(frozen=True)
class Case:
    rows: int
    cols: int
    dtype: str
    weight: bool
    view: str
    magnitude: float  # x's scale: N(0, 1) times it
    eps: float

    def asdict(self) -> dict:
        return asdict(self)

    def label(self) -> str:
        return (f"{self.rows}x{self.cols} {self.dtype} {self.view}{'' if self.weight else ' no-weight'} "
                f"|x|~{self.magnitude:g} eps={self.eps:g}")


def _rows_for(cols: int, rng: random.Random) -> int:
    most = max(1, min(300, MAX_ELEMENTS // cols))
    return rng.choice([1, 2, 3, rng.randint(1, most), most])


def _magnitude(dtype: str, rng: random.Random) -> float:
    # fp16 tops out at 65504; bf16 and fp32 share fp32's range, where the sum of 2^19 squares of
    # 1e15 still fits. Small magnitudes make eps matter.
    choices = [1.0, 1.0, 1e-3, 30.0] + ([1e4] if dtype == "fp16" else [1e15, 1e-15])
    return rng.choice(choices)


def edge_cases() -> list[Case]:
    """Every edge length in bf16, contiguous with a weight; then each dtype and view once at a few."""
    out = [Case(max(1, min(64, MAX_ELEMENTS // c)), c, "bf16", True, "contiguous", 1.0, 1e-6) for c in EDGES]
    for cols in (1, 1000, 4097, 65536, 262144):
        for dtype in DTYPES:
            for view in VIEWS:
                out.append(Case(max(1, min(24, MAX_ELEMENTS // cols)), cols, dtype, view != "3d", view, 1.0, 1e-5))
    # past what a cluster holds, and not aligned: the element-at-a-time two-pass path
    out += [Case(4, 524289, "bf16", True, "offset", 1.0, 1e-6), Case(3, 262145, "fp32", True, "odd-stride", 1.0, 1e-6)]
    return out


def fuzz_cases(seed: int, count: int = 80) -> list[Case]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        cols = rng.choice(EDGES) if rng.random() < 0.3 else int(round(2 ** rng.uniform(0, 18.2)))
        dtype = rng.choice(DTYPES)
        out.append(Case(_rows_for(cols, rng), cols, dtype, rng.random() < 0.8, rng.choice(VIEWS),
                        _magnitude(dtype, rng), rng.choice([1e-6, 1e-5, 0.0, 0.1])))
    return out


@dataclass(frozen=True)
class BackwardCase(Case):
    drstd: bool = False       # rstd reached the loss: its gradient enters dx
    weight_grad: bool = True  # dw is wanted (with a weight)

    def label(self) -> str:
        return (super().label() + (" drstd" if self.drstd else "")
                + ("" if self.weight_grad or not self.weight else " no-dw"))


def backward_cases(seed: int, fuzz: int = 60) -> list[BackwardCase]:
    """The forward's edge lengths and views, as backward cases (every fourth with drstd, every
    seventh with a weight that needs no gradient), then a seeded fuzz of the same spread."""
    out = [BackwardCase(**c.asdict(), drstd=i % 4 == 3, weight_grad=i % 7 != 6) for i, c in enumerate(edge_cases())]
    rng = random.Random(seed)
    out += [BackwardCase(**c.asdict(), drstd=rng.random() < 0.3, weight_grad=rng.random() < 0.85)
            for c in fuzz_cases(seed, fuzz)]
    return out


@dataclass(frozen=True)
class SoftmaxCase(Case):
    masked: bool = False  # a random half of each row's columns (never the first) set to -inf

    def label(self) -> str:  # weight and eps mean nothing to a softmax
        return f"{self.rows}x{self.cols} {self.dtype} {self.view} |x|~{self.magnitude:g}" + (" masked" if self.masked else "")


def softmax_cases(seed: int, fuzz: int = 40) -> list[SoftmaxCase]:
    """The edge lengths and views (every fifth case masked), then a seeded fuzz of the same spread."""
    out = [SoftmaxCase(**c.asdict(), masked=i % 5 == 4) for i, c in enumerate(edge_cases())]
    rng = random.Random(seed ^ 0x50F7)
    out += [SoftmaxCase(**c.asdict(), masked=rng.random() < 0.25) for c in fuzz_cases(seed ^ 0x50F7, fuzz)]
    return out
