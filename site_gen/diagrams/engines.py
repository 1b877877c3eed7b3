"""Instruction families named by a spec's `engine` strings, and what the diagrams need to know of them.

Specs write engines freely ("cp.async", "cp.async.cg", "tma", "cp.async.bulk.tensor", "wgmma.rs",
"ex2.approx", ...); ``family`` folds them into the few families the pictures and the schedule
model distinguish. Order matters: "cp.async.bulk" is TMA, not cp.async.
"""

from __future__ import annotations

_RULES = (
    # PTX names the destination first: cp.async.bulk.tensor...global.shared::cta is a store.
    ("tma-store", ("tma.store", "tma-store", "tma_store", ".global.shared")),
    ("tma", ("tma", "cp.async.bulk")),
    ("cp.async", ("cp.async",)),
    ("wgmma", ("wgmma",)),
    ("mma.sync", ("mma",)),
    ("ldmatrix", ("ldmatrix",)),
    ("stmatrix", ("stmatrix",)),
    ("ld.shared", ("ld.shared", "lds")),
    ("st.global", ("st.global", "stg")),
    ("ld.global", ("ld.global", "ldg")),
    ("ex2", ("ex2", "exp2")),
    ("expf", ("exp",)),
)

# Issue returns at once; completion is awaited later (barrier, wait_group, wgmma.wait_group).
ASYNC = frozenset({"cp.async", "tma", "tma-store", "wgmma"})

LABEL = {
    "ld.global": "ld.global",
    "cp.async": "cp.async 16 B",
    "tma": "TMA bulk tensor copy",
    "tma-store": "TMA store",
    "wgmma": "wgmma",
    "mma.sync": "mma.sync m16n8k16",
    "ldmatrix": "ldmatrix",
    "stmatrix": "stmatrix",
    "ld.shared": "ld.shared",
    "st.shared": "st.shared",
    "st.global": "st.global",
    "ex2": "ex2 (MUFU) + FFMA",
    "expf": "expf (MUFU + FMUL)",
}


def family(engine: str) -> str:
    e = engine.lower()
    for fam, keys in _RULES:
        if any(k in e for k in keys):
            return fam
    return e


def is_async(engine: str) -> bool:
    return family(engine) in ASYNC


def multicast(engine: str) -> bool:
    return "multicast" in engine.lower()
