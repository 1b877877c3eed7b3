"""Instruction counts that the concept figures of stages 21 and 22 draw, as nvcc 13.0 compiles the
stages for sm_90a. The generator never compiles (producers do), and the committed compiler facts
(kernels/compiler_facts/) hold a histogram and a bounded listing, not these stretches, so they are
written here; tests/test_concept_sass.py compiles the stages, counts the same stretches in their
SASS and fails, naming the number, when the compiler makes them otherwise.
"""

from __future__ import annotations

# The unmasked K/V loop of the non-causal kernel (stage 20 against stage 21): the instructions one
# iteration executes on the common path (no rescale of O, no slow path of the deferred maximum), and
# the stretch from the QK's wait (WARPGROUP.DEPBAR, counted) to the first MUFU.EX2 (not counted), by
# what it is: the row maxima (FMNMX and the quad's SHFL), the growth test and its vote (FSETP, VOTE,
# BRA), the exponents' FFMA, and the rest (the wait itself, moves, the new maxima's scale factors), in
# program order (the listing's distance, as stage 21's notes count it).
DEFERRED_MAX = {
    "20": {"per_iteration": 453, "to_first_exp": {"maxima": 74, "test": 6, "ffma": 0, "other": 18}},
    "21": {"per_iteration": 366, "to_first_exp": {"maxima": 0, "test": 0, "ffma": 6, "other": 1}},
}

# A consumer's stretch at the start of every output tile in the causal kernel (stage 21 against
# stage 22): from the SHFL that hands the warp its tile id to the SYNCS wait for the tile's Q, both
# counted; the CS2R among them zero registers (O's accumulators, and at times another pair); MUFU.RCP and CALL
# are the runtime divisions' reciprocals and the 64-bit division's call.
TILE_BOUNDARY = {
    "21": {"instructions": 220, "cs2r": 32, "rcp": 4, "call": 1},
    "22": {"instructions": 111, "cs2r": 33, "rcp": 0, "call": 0},
}
