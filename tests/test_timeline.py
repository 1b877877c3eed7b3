"""The measured timeline is drawn from the trace: one bar per recorded event, tooltips, lanes per
role, waits drawn apart from work, byte-stable SVG; and the model's prediction for the same window."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from conftest import AWAITING_TRACE
from hopattn import lineage
from hopattn.records import traces

from site_gen.diagrams import schedule, trace_lanes
from site_gen.diagrams.timeline import measured_window, model_window_diagram
from site_gen.diagrams.timeline_section import MIN_WIDTH, diagrams_for, step_comparison
from site_gen.diagrams.trace_timeline import FONT, NAME, trace_diagram

SVG = "{http://www.w3.org/2000/svg}"
STAGES = {s.id: s for s in lineage.discover()}
# {(stage id, causal): record} at head dim 128, every stage's figures' (stage 24's others: test_trace_head_dims.py)
RECORDS = {k[:2]: r for k, r in traces.load_all(traces.folder("NVIDIA H200")).items() if k[2] == traces.HEAD_DIM}
KEYS = sorted(RECORDS)
IDS = [f"{sid}{'-causal' if causal else ''}" for sid, causal in KEYS]


def _panel(svg: str, did: str, name: str):
    root = ET.fromstring(svg)
    return next(g for g in root.iter(SVG + "g") if g.get("id") == f"{did}-{name}")


def _events(group) -> list:
    return [e for e in group.iter(SVG + "g") if "hd-ev" in (e.get("class") or "").split()]


# The stages whose trace is not recorded yet (conftest.AWAITING_TRACE): no GPU time was left when
# they joined the lineage.
TRACED = sorted(sid for sid in STAGES if sid not in AWAITING_TRACE)


def test_every_stage_has_a_committed_trace_and_the_later_ones_a_causal_one():
    for sid in TRACED:
        stage = STAGES[sid]
        assert (sid, False) in RECORDS, sid
        assert ((sid, True) in RECORDS) == stage.causal, sid
    for sid in sorted(AWAITING_TRACE):
        assert sid in STAGES, f"stage {sid} is awaiting a trace but is not in the lineage"
        recorded = [k for k in RECORDS if k[0] == sid]
        assert not recorded, f"stage {sid} has its trace now ({recorded}): take it out of AWAITING_TRACE"


class _Inputs:
    """What the timeline part reads of the site's inputs: the committed records."""

    trace_gpu = "nvidia-h200"

    def trace(self, stage, causal, head_dim=None):
        return RECORDS.get((stage.id, causal)) if head_dim in (None, traces.HEAD_DIM) else None

    def other_head_dims(self, stage):
        return []


@pytest.mark.parametrize("sid", sorted(AWAITING_TRACE))
def test_the_page_of_a_stage_awaiting_its_trace_says_so_and_heads_it_predicted(sid):
    from site_gen.cache import DiskCache
    from site_gen.diagrams.timeline_section import UNTRACED, stage_section
    from site_gen.pages.stage import PREDICTED_HEADING, diagrams_section
    from site_gen.site import Site

    ids = sorted(STAGES)
    stage, prev = STAGES[sid], STAGES[ids[ids.index(sid) - 1]]
    site = Site()
    part = stage_section(stage, prev, _Inputs(), site, DiskCache(None))
    assert part.startswith(UNTRACED)
    html = "\n".join(site.fragments.values())
    assert "No trace of this stage is recorded yet: <code>python -m bench.trace</code> on a GPU writes one" in html
    assert f'id="s{sid}-timeline"' in html  # the schedule model's own window instead
    page = diagrams_section({"timeline": part}, "")
    assert f"### {PREDICTED_HEADING} {{#timeline}}" in page and "measured" not in page.split("\n")[0]
    # a traced stage keeps its heading
    traced = diagrams_section({"timeline": stage_section(STAGES["22"], STAGES["21"], _Inputs(), Site(),
                                                         DiskCache(None))}, "")
    assert "### Timeline: measured and predicted {#timeline}" in traced


@pytest.mark.parametrize("key", KEYS, ids=IDS)
def test_one_bar_with_a_tooltip_per_recorded_event(key):
    sid, causal = key
    rec = RECORDS[key]
    d = trace_diagram(STAGES[sid], rec, every_warp=True, causal=causal)
    bars = _events(_panel(d.svg, d.id, "all"))
    assert len(bars) == len(rec["events"])
    names = {e[2] for e in rec["events"]}
    for g in bars:
        title = g.find(SVG + "title")
        assert title is not None and " µs" in title.text
        assert ("K/V step" in title.text) or ("output tile" in title.text) or ("no one tile" in title.text)
    # durations in the tooltips are the record's, in order
    starts = sorted(round(e[5] / 1000, 3) for e in rec["events"])
    shown = sorted(float(re.search(r"at (-?[\d.]+) µs", g.find(SVG + "title").text).group(1)) for g in bars)
    assert shown == pytest.approx(starts, abs=1e-3)
    assert names <= set(trace_lanes.WAITS) | {"load_q", "load_k", "load_v", "load_kv", "qk", "softmax", "rescale",
                                               "pv", "epilogue", "store"}


@pytest.mark.parametrize("key", KEYS, ids=IDS)
def test_the_summary_shows_every_role_and_every_event_kind(key):
    sid, causal = key
    rec = RECORDS[key]
    lay = trace_lanes.layout(rec)
    assert {e[2] for ln in lay.lanes for e in [(0, 0, b.event) for b in ln.bars]} == {e[2] for e in rec["events"]}
    roles_with_events = {rec["roles"][e[1]] for e in rec["events"]}
    assert {ln.role for ln in lay.lanes} == roles_with_events
    d = trace_diagram(STAGES[sid], rec, causal=causal)
    texts = [t.text for t in ET.fromstring(d.svg).iter(SVG + "text")]
    for role in roles_with_events:
        assert trace_lanes.role_label(role) in texts
    # one lane per role and CTA place unless a warp records something the role's first one does not
    assert len(lay.lanes) >= len(roles_with_events) * len(lay.rows)


@pytest.mark.parametrize("key", KEYS, ids=IDS)
def test_waits_are_hatched_marks_are_ticks_work_is_solid(key):
    sid, causal = key
    d = trace_diagram(STAGES[sid], RECORDS[key], causal=causal)
    for g in _events(_panel(d.svg, d.id, "all")):
        kind = g.get("class").split()[1]
        shapes = [e for e in g if e.tag != SVG + "title"]
        if kind == "hd-wait":
            assert shapes[0].get("fill").startswith(f"url(#{d.id}-hatch-")
        elif kind == "hd-mark":
            assert [e.tag for e in shapes] == [SVG + "path", SVG + "line"]
        else:
            assert shapes[0].tag == SVG + "rect" and shapes[0].get("fill").startswith("var(--hd-")


@pytest.mark.parametrize("key", KEYS, ids=IDS)
def test_byte_stable_prefixed_rounded_and_readable(key):
    sid, causal = key
    a = trace_diagram(STAGES[sid], RECORDS[key], causal=causal)
    b = trace_diagram(STAGES[sid], RECORDS[key], causal=causal)
    assert a.svg == b.svg
    root = ET.fromstring(a.svg)
    assert root.get("id") == a.id and root[0].tag == SVG + "title" and root[1].tag == SVG + "desc"
    for el in root.iter():
        if el.get("id") and el is not root:
            assert el.get("id").startswith(a.id + "-")
    for ref in re.findall(r"url\(#([^)]+)\)", a.svg):
        assert ref.startswith(a.id + "-")
    assert not re.findall(r' (?:x|y|x1|x2|y1|y2|width|height)="(-?\d+\.\d{2,})"', a.svg)
    for _attr, value in re.findall(r'\b(fill|stroke)="([^"]+)"', a.svg):
        assert value == "none" or value.startswith("url(#") or re.fullmatch(r"var\(--hd-[a-z0-9]+, #[0-9a-f]{6}\)", value)
    # text of 12 px or more when the picture is shown at MIN_WIDTH (it scrolls below that)
    sizes = [float(t.get("font-size")) for t in root.iter(SVG + "text")]
    assert min(sizes) >= FONT and FONT * MIN_WIDTH / a.width >= 12


def test_tile_boundaries_where_the_window_has_them():
    texts = {k: " ".join(t.text for t in ET.fromstring(trace_diagram(STAGES[k[0]], RECORDS[k]).svg).iter(SVG + "text"))
             for k in (("12", False), ("14", False), ("19", False))}
    nxt = RECORDS[("12", False)]["ctas"][1]["block"]  # the next CTA to start on the SM (the hardware's choice)
    assert f"block {nxt} starts" in texts[("12", False)]  # the next CTA takes the SM over
    assert "output tile 2 starts" in texts[("14", False)]  # the persistent CTA starts its next tile
    # stage 19's window has a boundary or says it has none, never both
    assert ("output tile 2 starts" in texts[("19", False)]) != ("no tile boundary" in texts[("19", False)])


def _bars(sid: str) -> list[tuple]:
    """What the whole-window panel draws, without its text: event class and geometry of each bar."""
    d = trace_diagram(STAGES[sid], RECORDS[(sid, False)])
    out = []
    for g in _events(_panel(d.svg, d.id, "all")):
        shape = next(e for e in g if e.tag != SVG + "title")
        out.append((g.get("class"), shape.get("x") or shape.get("d"), shape.get("width")))
    return out


def test_no_two_neighbouring_stages_have_the_same_timeline():
    ids = TRACED
    drawn = {sid: _bars(sid) for sid in ids}
    for a, b in zip(ids, ids[1:]):
        assert drawn[a] != drawn[b], (a, b)


def test_a_hand_made_record_lays_out_as_expected():
    """Two CTAs one after the other on the SM, a producer and a consumer; one wgmma issue and its wait."""
    rec = {"roles": ["producer", "consumer0", "consumer0"], "window": {"start_ns": 100.0, "end_ns": 1100.0},
           "ctas": [{"slot": 0, "block": 7, "sm": 0, "start_ns": 0.0}, {"slot": 1, "block": 9, "sm": 0, "start_ns": 600.0}],
           "events": [[0, 0, "load_kv", 0, 3, 10.0, 10.0], [0, 1, "qk", 0, 3, 20.0, 60.0],
                      [0, 2, "qk", 0, 3, 21.0, 61.0], [0, 1, "softmax", 0, 3, 62.0, 200.0],
                      [0, 1, "wait_qk", 0, 3, 200.0, 260.0], [0, 0, "wait_empty", 0xFFFF, 4, 30.0, 400.0],
                      [1, 0, "load_q", 0, -1, 600.0, 600.0], [1, 1, "wait_q", 0, -1, 610.0, 700.0],
                      [1, 1, "qk", 0, 0, 700.0, 720.0]]}
    lay = trace_lanes.layout(rec)
    assert lay.length == 1000.0 and lay.rows == ((0, 1),)
    assert [(ln.role, ln.warp) for ln in lay.lanes] == [("producer", 0), ("consumer0", 1)]  # warp 2 adds nothing
    assert [(s.gemm, s.start, s.end) for s in lay.lanes[1].spans] == [("qk", 20.0, 260.0)]
    assert [(b.row, b.t, b.new_cta) for b in lay.boundaries] == [(0, 610.0, True)]
    wait = next(b for b in lay.lanes[0].bars if b.event == "wait_empty")
    assert wait.tile is None and wait.kind == "wait"
    assert next(b for b in lay.lanes[0].bars if b.event == "load_kv").kind == "mark"
    assert len(trace_lanes.layout(rec, every_warp=True).lanes) == 3


def test_pingpong_keeps_the_consumers_wgmmas_apart():
    def share(sid):  # in the steady state: the steps before the window's first tile boundary
        lay = trace_lanes.layout(RECORDS[(sid, False)])
        return trace_lanes.both_in_flight(lay, 0, until=min(b.t for b in lay.boundaries if b.row == 0))[1]

    # Measured spans are upper bounds (issue to the wait that saw the GEMM retired), and a consumer
    # hands the turn over once its GEMM is issued, so the other's may queue behind it: the pingpong
    # consumers touch at their edges (0.18 of the time at stage 12 in the 20:25 records, 0.12 at
    # 18:23); without the turns (stage 11) their GEMMs are in flight together about twice as long
    # (0.35; 0.38). What the stage guarantees is the order of the issues, not an amount: the turns
    # keep the two consumers' GEMMs in flight together for well under half of the steady state, and
    # clearly less than without them.
    assert share("12") < 0.5 and share("11") > 1.5 * share("12")


def test_from_stage_13_the_pv_is_in_flight_during_the_warps_own_softmax():
    """Stage 13's idea, as its trace must show it: a consumer's PV runs while the same warp's softmax
    does (stage 12 waits for its PV before the next QKᵀ). The PV is issued in one K/V step and
    retired in the next, so its span pairs records of two step labels."""
    def overlap(sid):
        lane = next(ln for ln in trace_lanes.layout(RECORDS[(sid, False)]).lanes if ln.spans)
        pv = [(s.start, s.end) for s in lane.spans if s.gemm == "pv"]
        soft = [(b.start, b.end) for b in lane.bars if b.event == "softmax"]
        total = sum(b - a for a, b in soft)
        return sum(max(0.0, min(e0, e1) - max(s0, s1)) for s0, e0 in pv for s1, e1 in soft) / total

    assert overlap("13") > 0.5 and overlap("21") > 0.5  # most of the softmax runs under the own PV
    assert overlap("12") < 0.05


@pytest.mark.parametrize("sid", TRACED, ids=TRACED)
def test_the_model_is_drawn_for_the_same_window_on_the_same_scale(sid):
    stage, rec = STAGES[sid], RECORDS[(sid, False)]
    lay = trace_lanes.layout(rec)
    before, after = trace_lanes.steps(lay)
    assert before > 0 and (after is None) == (not lay.boundaries)
    win = measured_window(stage, before, after)
    steps = {(s.tile, s.it) for s in win.slots if s.op.kind == "qk" and win.start <= s.start <= win.end}
    # the model's next QKᵀ may issue before the window's last PV retires (intra-warpgroup overlap)
    assert before + (after or 0) == win.steps and len(steps) in (win.steps, win.steps + 1)
    d = model_window_diagram(stage, win, lay.length * 1e-9, f"s{sid}-model")
    ticks = [float(t.text) for t in ET.fromstring(d.svg).iter(SVG + "text")
             if t.text and re.fullmatch(r"\d+(\.\d+)?", t.text) and t.get("text-anchor") == "middle"
             and t.get("fill", "").startswith("var(--hd-muted")]
    assert max(ticks) * 1000 <= max(lay.length, (win.end - win.start) * 1e9) + 1e-6
    assert max(ticks) * 1000 >= 0.5 * lay.length


def test_steps_measured_against_predicted():
    cmp = step_comparison(STAGES["16"], RECORDS[("16", False)])
    assert cmp.measured_ns == RECORDS[("16", False)]["per_step_ns"]
    assert cmp.predicted_ns == pytest.approx(schedule.predict(STAGES["16"]).period * 1e9)
    assert cmp.disagree  # the model's verdict, whatever the size of the gap in this record
    assert cmp.untraced_ns < cmp.measured_ns  # the traced build is slower there


def test_diagrams_for_a_stage_with_both_masks():
    ds = diagrams_for(STAGES["17"], RECORDS[("17", False)], RECORDS[("17", True)])
    assert [d.id for d in ds] == ["s17-trace", "s17-trace-warps", "s17-model",
                                  "s17-trace-causal", "s17-trace-causal-warps", "s17-model-causal"]
    assert [d.id for d in diagrams_for(STAGES["17"], None, None)] == ["s17-timeline"]


def test_the_figure_sets_the_events_that_changed_against_the_previous_stage():
    stats, prev = RECORDS[("19", False)]["stats"], RECORDS[("18", False)]["stats"]
    d = trace_diagram(STAGES["19"], RECORDS[("19", False)], prev=("18", prev))
    body = " ".join(t.text for t in ET.fromstring(d.svg).iter(SVG + "text"))
    moved, _ = trace_lanes.moved_events(stats, prev)
    assert "Against stage 18" in body and moved  # the events that moved by a fifth or more, each with its ratio
    for event, mine, theirs in moved:
        assert NAME[event] in body or f"{NAME[event]} (issue)" in body
        assert f"({mine / theirs:.2f}×)" in body
    d = trace_diagram(STAGES["12"], RECORDS[("12", False)], prev=("11", RECORDS[("11", False)]["stats"]))
    assert "New in this stage: wait for its turn" in " ".join(t.text for t in ET.fromstring(d.svg).iter(SVG + "text"))
