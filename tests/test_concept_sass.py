"""The instruction counts that stages 21's and 22's concept figures draw
(site_gen/diagrams/concepts/sass_counts.py) are the SASS's: this compiles stages 20, 21 and 22 for
sm_90a (needs nvcc and cuobjdump, no GPU; the build cache keeps the libraries) and counts the same
stretches. A figure that drifts from the compiler's output fails here, naming the number."""

from __future__ import annotations

from collections import Counter

import pytest
from hopattn import build, lineage

from site_gen.diagrams.concepts.sass_counts import DEFERRED_MAX, TILE_BOUNDARY

WHY = "nvcc compiles it otherwise now: update site_gen/diagrams/concepts/sass_counts.py (and the notes that quote it)"


def _functions(stage_id: str) -> dict:
    from hopattn import cuda_tools
    from hopattn.compiler import sass

    try:
        build.nvcc()
    except build.BuildError:
        pytest.skip("nvcc not found (install the CUDA toolkit or pip's nvidia-cuda-nvcc)")
    if cuda_tools.find("cuobjdump") is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    stage = next(s for s in lineage.discover() if s.id == stage_id)
    return sass.parse_sass(sass.dump_sass(build.compile_stage(stage).library))


def _kernel(functions: dict, computed_order: bool) -> list:
    """attention_kernel<COMPUTED_ORDER>: true is the non-causal kernel, false the causal one."""
    tag = "ILb1E" if computed_order else "ILb0E"
    return next(ins for name, ins in functions.items() if tag in name)


def common_path(body: list) -> list:
    """The instructions one iteration of a loop body executes on its common path, in order: the
    branch after each vote (to the slow paths) and the branch around the rescale's FMULs (32 or
    more) are taken; every other forward branch falls through. The rule of
    research/trace_variants/count_stamps.py."""
    at = {ins.addr: k for k, ins in enumerate(body)}
    k, path = 0, []
    while k < len(body):
        ins = body[k]
        path.append(ins)
        target = at.get(int(ins.operands.split(",")[-1].strip(), 16)) if ins.opcode == "BRA" and ins.pred else None
        if target is not None and target > k:
            after_vote = k > 0 and body[k - 1].opcode.startswith("VOTE")
            if after_vote or sum(1 for i in body[k + 1:target] if i.opcode == "FMUL") >= 32:
                k = target
                continue
        k += 1
    return path


def _unmasked_loop(stage_id: str) -> list:
    """The non-causal kernel's first K/V loop (the one with the QK's and PV's 16 HGMMA): the unmasked one."""
    from hopattn.compiler import sass

    loops = [lp.body for lp in sass.loops(_kernel(_functions(stage_id), True))
             if sum(i.opcode.startswith("HGMMA") for i in lp.body) == 16]
    return list(loops[0])


def _to_first_exp(body: list) -> dict:
    """The loop's code from the QK's wait (the last WARPGROUP.DEPBAR before the first MUFU.EX2,
    counted) to that exponential (not counted), in program order, by what it is."""
    first = next(k for k, i in enumerate(body) if i.opcode == "MUFU.EX2")
    wait = max(k for k, i in enumerate(body[:first]) if i.opcode.startswith("WARPGROUP.DEPBAR"))
    kinds = Counter(i.opcode.split(".")[0] for i in body[wait:first])
    maxima = kinds.pop("FMNMX", 0) + kinds.pop("SHFL", 0)
    test = kinds.pop("FSETP", 0) + kinds.pop("VOTE", 0) + kinds.pop("BRA", 0)
    ffma = kinds.pop("FFMA", 0)
    return {"maxima": maxima, "test": test, "ffma": ffma, "other": sum(kinds.values())}


@pytest.mark.nvcc
@pytest.mark.parametrize("stage_id", sorted(DEFERRED_MAX))
def test_the_deferred_maximum_figure_draws_the_counted_path(stage_id):
    body = _unmasked_loop(stage_id)
    drawn = DEFERRED_MAX[stage_id]
    executed = len(common_path(body))
    assert executed == drawn["per_iteration"], f"stage {stage_id}: {executed} per iteration; {WHY}"
    assert _to_first_exp(body) == drawn["to_first_exp"], f"stage {stage_id}: {WHY}"


@pytest.mark.nvcc
@pytest.mark.parametrize("stage_id", sorted(TILE_BOUNDARY))
def test_the_tile_coordinates_figure_draws_the_counted_stretch(stage_id):
    """A consumer's stretch in the causal kernel: the SHFL that hands it the tile id, to the first
    SYNCS wait after it (for the tile's Q), both counted."""
    ins = _kernel(_functions(stage_id), False)
    start = next(k for k, i in enumerate(ins) if i.opcode.startswith("SHFL.IDX"))
    end = next(k for k in range(start, len(ins)) if ins[k].opcode.startswith("SYNCS.PHASECHK"))
    stretch = ins[start:end + 1]
    counted = {"instructions": len(stretch), "cs2r": sum(i.opcode.startswith("CS2R") for i in stretch),
               "rcp": sum(i.opcode == "MUFU.RCP" for i in stretch), "call": sum(i.opcode.startswith("CALL") for i in stretch)}
    assert counted == TILE_BOUNDARY[stage_id], f"stage {stage_id}: {counted}; {WHY}"


def test_the_figures_draw_these_counts():
    """No nvcc needed: the two figures' texts are the counts above, not numbers of their own."""
    import xml.etree.ElementTree as ET

    from site_gen.diagrams import concept_diagrams

    stages = lineage.discover()
    by = {s.number: s for s in stages}

    def texts(number, did):
        d = next(d for d in concept_diagrams(by[number], stages) if d.id == did)
        return " ".join(t.text or "" for t in ET.fromstring(d.svg).iter("{http://www.w3.org/2000/svg}text"))

    before, after = DEFERRED_MAX["20"], DEFERRED_MAX["21"]
    deferred = texts(21, "c-deferred-max")
    lead_b, lead_a = sum(before["to_first_exp"].values()), sum(after["to_first_exp"].values())
    assert f"{before['per_iteration']} → {after['per_iteration']} instructions an iteration: " \
           f"{before['per_iteration'] - after['per_iteration']} fewer" in deferred
    assert f"first exponential: {lead_b} instructions after the QK's wait" in deferred
    assert f"first exponential: {lead_a} after the wait" in deferred
    tiles = texts(22, "c-tile-coordinates")
    b, a = TILE_BOUNDARY["21"], TILE_BOUNDARY["22"]
    assert f"{b['instructions']} instructions" in tiles and f"{a['instructions']} instructions" in tiles
    assert f"{b['instructions'] - b['cs2r']}: the divisions ({b['rcp']} MUFU.RCP, a CALL)" in tiles
    assert f"{a['instructions'] - a['cs2r']}: the same, no division" in tiles
