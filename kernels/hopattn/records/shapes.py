"""The benchmark shapes a results record names ('4k', '8k-gqa', ...), and the FLOP counts its TFLOP/s
are computed with (the forward's, and the backward's: 2.5 times as many).

The harness (bench/) times these shapes and the site describes them from here (the shape's
dimensions and why it is in the set), so both read one definition. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    heads: int
    len_q: int
    len_k: int
    head_dim: int = 128
    layout: str = "bhsd"  # how the inputs are stored: "bshd" for the layout-in-place shape
    kv_heads: int = 0     # K/V heads (grouped-query); 0: as many as q
    what: str = ""        # why the shape is in the set (the site shows it)
    head_dim_v: int = 0   # v's (and the output's) head dim; 0: head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def dv(self) -> int:
        return self.head_dim_v or self.head_dim

    @property
    def dims(self) -> dict:
        return {"batch": self.batch, "heads": self.heads, "len_q": self.len_q, "len_k": self.len_k,
                "head_dim": self.head_dim}

    def describe(self) -> str:
        lengths = f"L{self.len_q}" if self.len_q == self.len_k else f"Lq{self.len_q} Lk{self.len_k}"
        extra = (f" Hkv{self.kv_heads}" if self.kv_heads else "") + (" BSHD" if self.layout == "bshd" else "")
        dv = f" Dv{self.dv}" if self.dv != self.head_dim else ""
        return f"B{self.batch} H{self.heads} {lengths} D{self.head_dim}{dv}{extra}"


# The three points every stage runs: the same number of tokens per shape (B·L = 32k); the work
# doubles with each doubling of L.
SHAPES = {
    "4k": Shape("4k", 8, 16, 4096, 4096),
    "8k": Shape("8k", 4, 16, 8192, 8192),
    "16k": Shape("16k", 2, 16, 16384, 16384),
}
# The shapes users run beyond those, so that no stage is tuned to three points: the stages with the
# whole contract (any length, BSHD, strided) and the reference peers run them.
USER_SHAPES = {
    "32k": Shape("32k", 1, 16, 32768, 32768, what="a single long sequence"),
    "512x64": Shape("512x64", 64, 16, 512, 512, what="short sequences in a large batch"),
    "odd": Shape("odd", 3, 16, 7919, 7919, what="odd lengths: the last tile part full"),
    "512x32k": Shape("512x32k", 4, 16, 512, 32768, what="few queries over many keys"),
    "8k-bshd": Shape("8k-bshd", 4, 16, 8192, 8192, layout="bshd", what="BSHD input, read in place"),
    "8k-gqa": Shape("8k-gqa", 2, 32, 8192, 8192, kv_heads=8, what="grouped-query heads (Llama-3-8B's 32 over 8)"),
}
ALL_SHAPES = {**SHAPES, **USER_SHAPES}

# The head-dim points (issue #29, as the FlashAttention-3 paper): the core three lengths (B·L = 32k
# tokens) with H·D = 2048 — head dim 64 over 32 heads, 128 over 16, 256 over 8; 96 and 192 (v 128,
# DeepSeek's MLA prefill) over the nearest whole number of heads. Not in ALL_SHAPES: the default run
# stays as it is; `--shapes head-dims` (or a name such as 8k-d64) runs them.
HEAD_DIM_POINTS = ((64, 64, 32), (96, 96, 21), (128, 128, 16), (192, 128, 11), (256, 256, 8))  # (D, Dv, H)


def _head_dim_shape(base: Shape, d: int, dv: int, heads: int) -> Shape:
    name = f"{base.name}-d{d}" + (f"v{dv}" if dv != d else "")
    what = f"head dim {d}" + (f" (v {dv})" if dv != d else "") + f", H·D = {heads * d}"
    return Shape(name, base.batch, heads, base.len_q, base.len_k, head_dim=d, what=what,
                 head_dim_v=dv if dv != d else 0)


HEAD_DIM_SHAPES = {s.name: s for s in (_head_dim_shape(base, d, dv, h) for d, dv, h in HEAD_DIM_POINTS
                                       for base in SHAPES.values())}
KNOWN_SHAPES = {**ALL_SHAPES, **HEAD_DIM_SHAPES}  # every shape a record may name


def is_user_shape(shape: Shape) -> bool:
    return shape.name in USER_SHAPES


def is_head_dim_shape(shape: Shape) -> bool:
    return shape.name in HEAD_DIM_SHAPES


def flops(shape: Shape, causal: bool) -> float:
    """2·B·H·Lq·Lk·(D + Dv): QKᵀ over D and PV over Dv, 2 FLOP per multiply-add (4·B·H·Lq·Lk·D where v's
    head dim is q's), halved for causal (half the scores survive)."""
    n = 2.0 * shape.batch * shape.heads * shape.len_q * shape.len_k * (shape.head_dim + shape.dv)
    return n / 2 if causal else n


def tflops(shape: Shape, causal: bool, ms: float) -> float:
    return flops(shape, causal) / (ms * 1e-3) / 1e12


# The backward's five GEMMs per tile (S recomputed, dP, dV, dK, dQ) against the forward's two: 2.5x
# the forward's FLOPs, the causal half discounted alike (the convention FlashAttention reports with).
BACKWARD_FLOP_FACTOR = 2.5


def backward_flops(shape: Shape, causal: bool) -> float:
    """2.5 x flops(shape, causal): 10·B·H·Lq·Lk·D, halved for causal."""
    return BACKWARD_FLOP_FACTOR * flops(shape, causal)


def backward_tflops(shape: Shape, causal: bool, ms: float) -> float:
    """TFLOP/s of the backward alone, timed at ``ms``."""
    return backward_flops(shape, causal) / (ms * 1e-3) / 1e12
