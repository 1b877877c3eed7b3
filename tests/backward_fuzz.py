"""The backward's shape fuzz: cases across the contract, drawn from a seed (no torch needed).

``fuzz_cases(seed)`` draws COUNT cases: query and key lengths from 1 to 20 000 either way round
(most short, some across the 64-row tiles, a few long), causal or not, grouped-query and
multi-query heads, both layouts, contiguous, strided (one slice of a packed qkv tensor) and offset
views, the deterministic mode, and a gradient for the log-sum-exp too (a loss that used it).
The float64 reference costs batch x heads x len_q x len_k, so long cases get few heads.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

COUNT = 320
MAX_LEN = 20_000
WORK_LIMIT = 4e8  # batch x heads x len_q x len_k of one case


@dataclass(frozen=True)
class FuzzCase:
    batch: int
    heads: int
    kv_heads: int
    len_q: int
    len_k: int
    causal: bool
    layout: str
    view: str
    deterministic: bool
    dlse: bool

    def asdict(self) -> dict:
        return asdict(self)

    def label(self) -> str:
        group = "" if self.kv_heads == self.heads else f" kv{self.kv_heads}"
        return (f"B{self.batch} H{self.heads}{group} Lq{self.len_q} Lk{self.len_k} "
                f"{'causal' if self.causal else 'full'} {self.layout} {self.view}"
                f"{' deterministic' if self.deterministic else ''}{' dlse' if self.dlse else ''}")


def _length(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.45:
        return rng.randint(1, 200)
    if r < 0.85:
        return rng.randint(200, 3000)
    return rng.randint(3000, MAX_LEN)


def fuzz_cases(seed: int, count: int = COUNT) -> list[FuzzCase]:
    rng = random.Random(seed)
    cases = []
    while len(cases) < count:
        len_q, len_k = _length(rng), _length(rng)
        kv_heads = rng.choice((1, 1, 2, 3, 4))
        group = rng.choice((1, 1, 2, 4, 8))  # 1: plain multi-head; kv_heads 1 with a group: multi-query
        batch = rng.choice((1, 1, 2, 3))
        while batch * kv_heads * group * len_q * len_k > WORK_LIMIT:
            if batch > 1:
                batch -= 1
            elif group > 1:
                group //= 2
            elif kv_heads > 1:
                kv_heads -= 1
            else:
                len_q = max(1, len_q // 2)
        cases.append(FuzzCase(batch, kv_heads * group, kv_heads, len_q, len_k, rng.random() < 0.5,
                              rng.choice(("bhsd", "bshd")), rng.choice(("contiguous", "strided", "offset")),
                              rng.random() < 0.25, rng.random() < 0.2))
    return cases
