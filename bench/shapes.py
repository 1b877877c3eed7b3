"""The parsing of --stages / --shapes / --causal. The shapes themselves, and the FLOP count, are
defined in hopattn.records.shapes (the site describes a record's shapes from there too); they are
imported here for the harness's modules."""

from __future__ import annotations

from hopattn import lineage
from hopattn.records.shapes import (
    ALL_SHAPES,
    HEAD_DIM_SHAPES,
    KNOWN_SHAPES,
    SHAPES,
    USER_SHAPES,
    Shape,
    backward_flops,
    backward_tflops,
    flops,
    is_head_dim_shape,
    is_user_shape,
    tflops,
)

__all__ = ["ALL_SHAPES", "HEAD_DIM_SHAPES", "KNOWN_SHAPES", "SHAPES", "USER_SHAPES", "Shape", "backward_flops",
           "backward_tflops", "flops", "is_head_dim_shape", "is_user_shape", "tflops", "QUICK_SHAPE",
           "CAUSAL_CHOICES", "DETERMINISTIC_CHOICES", "parse_shapes", "parse_stages", "backward_shapes"]

QUICK_SHAPE = "8k"
CAUSAL_CHOICES = {"both": (False, True), "off": (False,), "on": (True,)}
# --deterministic: the backward stages' modes (the default one, and the deterministic one where a stage has it)
DETERMINISTIC_CHOICES = {"both": (False, True), "off": (False,), "on": (True,)}


def parse_shapes(text: str) -> list[Shape]:
    """'4k,8k' names, or the sets 'core' (4k, 8k, 16k), 'users' (the shapes beyond them), 'all' (both),
    'head-dims' (the head-dim points: 4k, 8k and 16k at head dims 64, 96, 128, 192 with v 128 and 256,
    H·D = 2048; not in 'all') and 'head-dims-8k' (their 8k column, the issue's table)."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ValueError("--shapes: expected a comma-separated list of " + ", ".join(ALL_SHAPES))
    sets = {"core": list(SHAPES), "users": list(USER_SHAPES), "all": list(ALL_SHAPES),
            "head-dims": list(HEAD_DIM_SHAPES), "head-dims-8k": [n for n in HEAD_DIM_SHAPES if n.startswith("8k-")]}
    names = [n for name in names for n in sets.get(name, [name])]
    unknown = [n for n in names if n not in KNOWN_SHAPES]
    if unknown:
        raise ValueError(f"--shapes: unknown shape {unknown[0]!r}; expected some of {', '.join(ALL_SHAPES)}, "
                         f"a head-dim point ({', '.join(HEAD_DIM_SHAPES)}) or a set: core, users, all, head-dims, "
                         f"head-dims-8k")
    return [KNOWN_SHAPES[n] for n in dict.fromkeys(names)]


def parse_stages(text: str, available: list[int]) -> list[int]:
    """--stages: '1,2,5-6' -> [1, 2, 5, 6]; 'all' -> every available stage; 'none' -> [] (peers only)."""
    try:
        return lineage.parse_selection(text, available)
    except ValueError as err:
        raise ValueError(f"--stages: {err}") from None


def backward_shapes(shapes: list[Shape]) -> list[Shape]:
    """The shapes the backward runs among those selected: the three points of the issue (4k, 8k,
    16k: B·L = 32k tokens), the ones its peers are compared on; the others are the forward's."""
    return [s for s in shapes if s.name in SHAPES]
