"""Each stage's measured timeline looks where its change is (site_gen/diagrams/timeline_focus.py):
the tile-boundary stages magnify the boundary and set its stretches against the previous stage's,
the causal stages open on the causal trace, and the TMA store has a colour of its own."""

from __future__ import annotations

import json
import re

import pytest
from conftest import REPO
from hopattn import lineage

from site_gen import inputs
from site_gen.cache import DiskCache
from site_gen.diagrams import timeline_focus, timeline_section, trace_lanes, trace_timeline
from site_gen.diagrams.svg import color
from site_gen.site import Site

TRACES = REPO / "bench" / "results" / "traces" / "nvidia-h200"
STAGES = {s.id: s for s in lineage.discover()}


@pytest.fixture(scope="module")
def inp():
    return inputs.load(REPO)


def _record(name: str) -> dict:
    return json.loads((TRACES / f"{name}.json").read_text())


def _section(inp, sid: str) -> str:
    ids = sorted(STAGES)
    prev = STAGES[ids[ids.index(sid) - 1]] if ids.index(sid) else None
    site = Site()
    placeholder = timeline_section.stage_section(STAGES[sid], prev, inp, site, DiskCache(None))
    return next(html for name, html in site.fragments.items() if name.startswith("timeline-")) if placeholder else ""


def test_every_focus_names_its_reason_and_a_known_view():
    for sid, f in timeline_focus.FOCUS.items():
        assert sid in STAGES and f.why and f.view in ("loop", "boundary"), sid
    assert timeline_focus.focus(STAGES["16"]) == timeline_focus.LOOP  # the loop's stages keep the default


@pytest.mark.parametrize("name,prev", [("14", "13"), ("15", "14"), ("22", "21"), ("22-causal", "21-causal"),
                                       ("18-causal", "17-causal")])
def test_a_boundary_stage_magnifies_its_tile_boundary(name, prev):
    sid = name.split("-")[0]
    assert timeline_focus.focus(STAGES[sid]).view == "boundary"
    rec, before = _record(name), _record(prev)
    lay = trace_lanes.layout(rec)
    bd = trace_lanes.first_boundary(lay)
    zoom = trace_lanes.boundary_zoom(lay, rec["per_step_ns"])
    assert zoom is not None and zoom[0] < bd.t < zoom[1]
    # both consumers' last PV of the tile before and first QK of the next are inside the window
    for _role, retired, first_qk in trace_lanes._boundary_sides(lay):
        assert zoom[0] < retired < first_qk < zoom[1]
    against = (prev.split("-")[0], timeline_section.at_clock(before, rec), timeline_section.boundary_at_clock(before, rec))
    svg = trace_timeline.trace_diagram(STAGES[sid], rec, causal=rec["causal"], prev=against, view="boundary").svg
    assert "around the first tile boundary" in svg and "the tile boundary, stretch by stretch" in svg
    assert "last PV retired → next tile's first QKᵀ" in svg and "epilogue's end → wait for Q" in svg
    assert "the median durations that moved most" not in svg


def test_stage_22s_strip_shows_the_stretch_the_multipliers_shortened():
    """The causal order's tile id → wait for Q, the stretch the host's multipliers shorten: in
    stage 22's record less than half stage 21's (722 against 244 ns in the records of 2026-12-01
    20:25, the notes' table), in the same cycles."""
    rec, before = _record("22-causal"), _record("21-causal")
    mine = dict(trace_lanes.boundary_stretches(trace_lanes.layout(rec)))
    theirs = dict(trace_lanes.boundary_stretches(trace_lanes.layout(before)))
    key = "consumer 0: tile id read → wait for Q"
    assert mine[key] * rec["clock_mhz"] < 0.5 * theirs[key] * before["clock_mhz"]
    converted = dict(timeline_section.boundary_at_clock(before, rec))[key]
    assert converted == pytest.approx(theirs[key] * before["clock_mhz"] / rec["clock_mhz"], abs=0.1)


def test_a_loop_stage_magnifies_the_steady_state():
    rec = _record("21")
    svg = trace_timeline.trace_diagram(STAGES["21"], rec, prev=("20", timeline_section.at_clock(_record("20"), rec)),
                                       view=timeline_focus.focus(STAGES["21"]).view).svg
    assert "of the steady state" in svg and "the median durations that moved most" in svg


@pytest.mark.parametrize("sid,first", [("17", "causal"), ("18", "causal"), ("22", "causal"), ("21", "non-causal"),
                                       ("20", "non-causal")])
def test_the_timeline_opens_where_the_stage_changed(inp, sid, first):
    html = _section(inp, sid)
    labels = re.findall(r'<label for="timeline-[^"]*">([^<]*)</label>', html)
    assert labels and labels[0] == f"Measured, {first}"
    why = timeline_focus.focus(STAGES[sid]).why
    assert (f"Where this timeline looks:</em> {why}" in html) == bool(why)


def test_the_tma_store_has_its_own_colour():
    assert trace_timeline.COLOUR["store"] != trace_timeline.COLOUR["epilogue"]
    rec = _record("15")
    svg = trace_timeline.trace_diagram(STAGES["15"], rec).svg
    store = [b for ln in trace_lanes.layout(rec).lanes for b in ln.bars if b.event == "store"]
    assert store and color(trace_timeline.COLOUR["store"]) in svg
    assert "store O (the TMA store)" in svg or "store O" in svg  # the legend names it
