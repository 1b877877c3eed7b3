"""The benchmark shapes, FLOP counting and the parsing of --stages / --shapes / --causal."""

from __future__ import annotations

from dataclasses import dataclass

from hopattn import lineage


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    heads: int
    len_q: int
    len_k: int
    head_dim: int = 128

    @property
    def dims(self) -> dict:
        return {"batch": self.batch, "heads": self.heads, "len_q": self.len_q, "len_k": self.len_k,
                "head_dim": self.head_dim}

    def describe(self) -> str:
        return f"B{self.batch} H{self.heads} L{self.len_q} D{self.head_dim}"


# The same number of tokens per shape (B·L = 32k); the work doubles with each doubling of L.
SHAPES = {
    "4k": Shape("4k", 8, 16, 4096, 4096),
    "8k": Shape("8k", 4, 16, 8192, 8192),
    "16k": Shape("16k", 2, 16, 16384, 16384),
}
QUICK_SHAPE = "8k"
CAUSAL_CHOICES = {"both": (False, True), "off": (False,), "on": (True,)}


def flops(shape: Shape, causal: bool) -> float:
    """4·B·H·Lq·Lk·D (QKᵀ and PV, 2 FLOP per multiply-add), halved for causal (half the scores survive)."""
    n = 4.0 * shape.batch * shape.heads * shape.len_q * shape.len_k * shape.head_dim
    return n / 2 if causal else n


def tflops(shape: Shape, causal: bool, ms: float) -> float:
    return flops(shape, causal) / (ms * 1e-3) / 1e12


def parse_shapes(text: str) -> list[Shape]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ValueError("--shapes: expected a comma-separated list of " + ", ".join(SHAPES))
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        raise ValueError(f"--shapes: unknown shape {unknown[0]!r}; expected some of {', '.join(SHAPES)}")
    return [SHAPES[n] for n in dict.fromkeys(names)]


def parse_stages(text: str, available: list[int]) -> list[int]:
    """--stages: '1,2,5-6' -> [1, 2, 5, 6]; 'all' -> every available stage; 'none' -> [] (peers only)."""
    try:
        return lineage.parse_selection(text, available)
    except ValueError as err:
        raise ValueError(f"--stages: {err}") from None
