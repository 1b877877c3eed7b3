"""The seeded fuzz over the whole contract of the final stages: shapes, masks, layouts and views.

``fuzz_shapes(seed)`` draws the same list for the same seed (a run prints its seed; set
HOPATTN_TEST_SEED to repeat it). It covers causal and not; query and key lengths from 1 to 20 000
either way round (tile edges, single rows, long over short); batch and heads that make from one to
several thousand output tiles; BHSD and BSHD; contiguous tensors, strided views (q, k and v sliced
from one packed qkv tensor) and views at an offset into a larger buffer; and, for stages with
grouped-query attention, K/V head ratios 1, 2, 4, 8 and 32. The shapes that once hung stages 18
and 19 come first, with the neighbouring cases their cause covers.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, replace

MAX_LEN = 20_000
BLOCK_M = 128  # query rows per output tile of the final stages
WORK_LIMIT = 4e8  # batch x heads x len_q x len_k: keeps the float64 reference to milliseconds
ROW_LIMIT = 2_000_000  # batch x heads x max(len_q, len_k): each input under 0.5 GB
GQA_RATIOS = (1, 2, 4, 8, 32)
VIEWS = ("contiguous", "strided", "offset")


@dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    len_q: int
    len_k: int
    causal: bool
    layout: str = "bhsd"
    view: str = "contiguous"
    kv_heads: int = 0  # 0: as many as q
    head_dim: int = 128  # q's and k's
    head_dim_v: int = 0  # 0: as q's

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def tiles(self) -> int:
        return self.batch * self.heads * math.ceil(self.len_q / BLOCK_M)

    def label(self) -> str:
        gqa = f", kv_heads={self.kv}" if self.kv != self.heads else ""
        dims = "" if self.head_dim == 128 and not self.head_dim_v else (
            f", head dim {self.head_dim}" + (f" (v {self.head_dim_v})" if self.head_dim_v else ""))
        return (f"(B, H, Lq, Lk)=({self.batch}, {self.heads}, {self.len_q}, {self.len_k}){gqa}{dims}, "
                f"causal={self.causal}, layout={self.layout}, view={self.view}")

    def asdict(self) -> dict:
        return asdict(self)


# Causal with more queries than keys, many tiles, many of them empty: each of these deadlocked
# stages 18 and 19 before the fix (issue "never hang"), then the cases the same reasoning covers.
HUNG_BEFORE = [
    Shape(9, 15, 512, 256, True),
    Shape(4, 16, 4096, 2048, True),
    Shape(1, 2, 131072, 128, True),
    Shape(1, 3, 12817, 10562, True),
    Shape(1, 3, 18151, 3714, True),
    Shape(1, 2, 18410, 12689, True),
]
NEIGHBOURS = [
    Shape(1, 1, 20000, 1, True),  # exactly one output tile sees a key
    Shape(1, 1, 40000, 1, True),  # 313 tiles, one with work: most CTAs get only empty tiles
    Shape(3, 100, 1024, 1, True),  # 2400 tiles, 300 with work, more empty tiles than SMs
    Shape(1, 4, 65536, 64, True, "bshd"),  # long runs of empty tiles in BSHD
    Shape(2, 3, 1000, 200, True),  # few tiles (fewer than SMs): passed before, must still
    Shape(64, 16, 256, 128, True),  # one empty and one full q-block per head, 2048 tiles
]


def _length(rng: random.Random, tile: int = BLOCK_M) -> int:
    pick = rng.random()
    if pick < 0.25:
        return rng.randint(1, 300)
    if pick < 0.45:  # tile edges
        return max(1, min(MAX_LEN, tile * rng.randint(1, MAX_LEN // tile) + rng.choice((-1, 0, 1))))
    if pick < 0.55:
        return rng.choice((1, 2, tile - 1, tile, tile + 1, MAX_LEN - 1, MAX_LEN))
    return int(math.exp(rng.uniform(0, math.log(MAX_LEN))))  # log-uniform 1 .. 20 000


def fuzz_shapes(seed: int, count: int = 320, gqa: bool = False, head_dim: int = 128, head_dim_v: int = 0,
                tile: tuple[int, int] = (BLOCK_M, BLOCK_M)) -> list[Shape]:
    """The regression shapes, then `count` random ones, deterministic for a seed. ``head_dim``,
    ``head_dim_v`` (0: as q's) and ``tile``, that head dim's (BLOCK_M, BLOCK_N), for the stages that
    serve other head dims than 128: its query lengths fall on and off its BLOCK_M, its key lengths
    on and off its BLOCK_N."""
    rng = random.Random(seed)
    dims = {"head_dim": head_dim, "head_dim_v": head_dim_v if head_dim_v != head_dim else 0}
    shapes = [replace(s, **dims) for s in HUNG_BEFORE + NEIGHBOURS]
    while len(shapes) < len(HUNG_BEFORE) + len(NEIGHBOURS) + count:
        len_q, len_k = _length(rng, tile[0]), _length(rng, tile[1])
        q_blocks = math.ceil(len_q / tile[0])
        target_tiles = int(math.exp(rng.uniform(0, math.log(6000))))  # 1 .. 6000 output tiles
        pairs = max(1, target_tiles // q_blocks)
        pairs = max(1, min(pairs, int(WORK_LIMIT // (len_q * len_k)), ROW_LIMIT // max(len_q, len_k)))
        ratio = rng.choice(GQA_RATIOS) if gqa else 1
        kv_heads = max(1, round(pairs ** 0.5 / ratio)) if ratio > 1 else 0
        heads = (kv_heads * ratio) if ratio > 1 else max(1, min(pairs, rng.randint(1, 40)))
        batch = max(1, pairs // heads)
        if batch * heads * len_q * len_k > WORK_LIMIT and ratio > 1:
            continue  # a large GQA group on long sequences: drawn again
        shapes.append(Shape(batch, heads, len_q, len_k, rng.random() < 0.5, rng.choice(("bhsd", "bshd")),
                            rng.choice(VIEWS), kv_heads, **dims))
    return shapes
