"""The backward's measured timelines on the site (Act V): a backward stage with a trace record
(bench/results/traces/<gpu>/backward/) gets the forward's timeline part — the measured per-warp
timeline in the backward's events and colours, the model's prediction for the same window, the
comparison and the event table — and a stage without one keeps "No trace ... yet" and the schedule
model's prediction; a stale record is flagged; the forward's pages do not change. The records are
synthetic (tests/backward_trace_fixture.py), as a GPU run of `python -m bench.trace --lineage
backward` would write them."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import backward_trace_fixture as fx
import pytest
from conftest import make_site
from hopattn.records import traces
from test_backward_site import add_backward

from site_gen import site
from site_gen.diagrams import trace_lanes
from site_gen.diagrams.trace_timeline import BACKWARD_COLOUR, BACKWARD_NAME, trace_diagram

SVG = "{http://www.w3.org/2000/svg}"
STAGES = ("01_baseline", "02_vector-atomics", "03_wgmma")


def _root(tmp_path, records=True, stale=False):
    root = add_backward(make_site(tmp_path / "repo"), stages=STAGES)
    if records:
        dest = root / "bench" / "results" / "traces" / "nvidia-h200" / "backward"
        for causal, steps in ((False, (12, 12)), (True, (10, 9))):
            rec = {k: v for k, v in fx.record(causal=causal, steps=steps).items() if k != "run"}
            if stale:
                rec["source_hash"] = "0" * 16
            traces.write(dest, fx.RUN, rec)
    return root


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return site.generate(_root(tmp_path_factory.mktemp("bwd-traces")), use_cache=False)[0]


def test_a_backward_stage_with_a_trace_gets_its_measured_timeline(built):
    page = built.pages["backward/03-wgmma.md"]
    assert "### Timeline: measured and predicted {#timeline}" in page
    assert "No trace of a backward stage is recorded yet" not in page
    html = built.fragments["timeline-backward-03-wgmma"]
    for fid in ("b03-trace", "b03-model", "b03-trace-warps", "b03-trace-causal", "b03-model-causal",
                "b03-trace-causal-warps"):
        assert f'id="{fid}"' in html, fid
        assert f"assets/generated/diagrams/{fid}.svg" in built.assets
    assert "Measured, non-causal" in html and "Measured, causal" in html
    assert "**Per query block**" not in html and "<strong>Per query block</strong>: measured <strong>4.00 µs</strong>" in html
    assert "2.5 % slower" in html and "Stale trace" not in html
    assert "Every traced warp: 8 lanes" in html and "wait for Q and dO" in html  # the fold and the event table
    assert 'id="b03-timeline"' not in html  # the model's own window is not drawn a second time


def test_a_backward_stage_without_a_trace_keeps_the_prediction(built):
    first, second = (built.pages[f"backward/{name}.md"] for name in ("01-baseline", "02-vector-atomics"))
    assert "### Schedule: predicted {#timeline}" in first and "No trace of a backward stage is recorded yet" in first
    assert 'id="b01-timeline"' in built.fragments["fig-b01-timeline"]
    assert "### Schedule: predicted {#timeline}" in second and "Unchanged since [backward stage 01]" in second


def test_the_forward_pages_do_not_change_with_backward_traces(built, tmp_path):
    plain = site.generate(_root(tmp_path, records=False), use_cache=False)[0]
    for key, html in plain.fragments.items():
        if "backward" not in key and "b0" not in key:
            assert built.fragments[key] == html, key
    for path, page in plain.pages.items():
        if not path.startswith("backward/"):
            assert built.pages[path] == page, path
    assert "### Schedule: predicted {#timeline}" in plain.pages["backward/03-wgmma.md"]


def test_a_stale_backward_trace_is_flagged(tmp_path):
    out = site.generate(_root(tmp_path, stale=True), use_cache=False)[0]
    html = out.fragments["timeline-backward-03-wgmma"]
    assert "Stale trace" in html and "0000000000000000" in html
    assert "python -m bench.trace --lineage backward" in html and "nvidia-h200/backward/03.json" in html


def test_one_bar_per_recorded_event_in_the_backward_s_words():
    stage = fx.stage03()
    rec = fx.record()
    d = trace_diagram(stage, rec, every_warp=True)
    assert d.id == "b03-trace-warps" and d.title.startswith("Backward stage 03 measured timeline")
    panel = next(g for g in ET.fromstring(d.svg).iter(SVG + "g") if g.get("id") == f"{d.id}-all")
    bars = [g for g in panel.iter(SVG + "g") if "hd-ev" in (g.get("class") or "")]
    assert len(bars) == len(rec["events"])
    for g in bars:
        title = g.find(SVG + "title").text
        assert "query block" in title and "K/V step" not in title and "output tile" not in title
    assert "nvidia-h200/backward/03.json" in d.caption
    names = {e[2] for e in rec["events"]}
    assert names <= set(BACKWARD_COLOUR) and names <= set(BACKWARD_NAME)
    # the four GEMMs in flight under each computing lane: Sᵀ and dV, dK above, dPᵀ and dQ below
    lay = trace_lanes.layout(rec)
    lane = next(ln for ln in lay.lanes if ln.spans)
    assert {s.gemm for s in lane.spans} == {"qk", "dp", "dvdk", "dq"}
    for track in (0, 1):
        spans = sorted((s.start, s.end) for s in lane.spans if lay.kinds.track(s.gemm) == track)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "one GEMM at a time on a track"
    assert {ln.role for ln in lay.lanes} == {"compute0", "compute1"}
    assert len(lay.rows) == 1 and any(b.new_cta for b in lay.boundaries)  # the next CTA takes the SM over
    labels = dict(trace_lanes.boundary_stretches(lay))
    assert labels["compute 0: store of dK and dV"] == pytest.approx(600 / fx.MHZ * 1000, abs=0.2)
    texts = " ".join(t.text or "" for t in ET.fromstring(trace_diagram(stage, rec).svg).iter(SVG + "text"))
    assert "query blocks" in texts and "dQ's accumulation" in texts and "K/V step" not in texts


def test_a_bad_backward_record_names_its_file(tmp_path):
    root = _root(tmp_path)
    path = root / "bench" / "results" / "traces" / "nvidia-h200" / "backward" / "03.json"
    data = json.loads(path.read_text())
    data["events"][2][2] = "pv"
    path.write_text(json.dumps(data))
    with pytest.raises(traces.TraceError, match=r"03\.json.*events\[2\]"):
        site.generate(root, use_cache=False)
