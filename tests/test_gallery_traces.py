"""The gallery shows each stage's measured timeline: stages 11 (warp specialization) and 12
(pingpong) keep the schedule model's picture of stage 10 (it sees each unit's throughput, not which
warp issues what), yet their pipelines changed, and the traces show it. Without a trace the model's
picture stands in, and its place says the model places the same work, not that the pipeline is
unchanged."""

from __future__ import annotations

import json
import re

import pytest
from conftest import REPO
from hopattn import lineage

from site_gen.diagrams import concept_diagrams, stage_diagrams
from site_gen.diagrams.section import last_change
from site_gen.diagrams.trace_timeline import trace_diagram
from site_gen.pages import gallery
from site_gen.site import Site

TRACES = REPO / "bench" / "results" / "traces" / "nvidia-h200"


@pytest.fixture(scope="module")
def three():
    stages = lineage.discover()
    chosen = [s for s in stages if s.id in ("10", "11", "12")]
    drawn = {s.number: (s, stage_diagrams(s, stages) + concept_diagrams(s, stages)) for s in chosen}
    measured = {s.number: trace_diagram(s, json.loads((TRACES / f"{s.id}.json").read_text())) for s in chosen}
    return chosen, drawn, measured


def _cards(html: str) -> list[tuple[str, str, bool]]:
    return [(kind, stage, bool(same)) for same, kind, stage in
            re.findall(r'<div class="hd-thumb( hd-thumb-same)?" data-kind="([a-z]+)" data-stage="(\d*)"', html)]


def test_the_model_picture_alone_would_call_11_and_12_unchanged(three):
    chosen, drawn, _ = three
    assert last_change("timeline", chosen[1], drawn) is not None and last_change("timeline", chosen[2], drawn) is not None


def test_the_gallery_shows_their_measured_timelines(three):
    chosen, drawn, measured = three
    site = Site()
    gallery.gallery_page(chosen, drawn, site, measured=measured)
    html = site.fragments["gallery"]
    cards = _cards(html)
    for sid in ("10", "11", "12"):
        assert ("timeline", sid, False) in cards, sid  # a card of its own, with its trace
        assert ("timeline", sid, True) not in cards  # no "unchanged" place for it
        assert f'id="fig-s{sid}-trace"' in html
        assert f'href="../stages/{next(s.name for s in chosen if s.id == sid)}/#timeline"' in html
    assert "the schedule model places the same work" not in html
    # in kind order within each stage (the comparison's rows): memory, roles, timeline, then concepts
    for sid in ("10", "11"):
        kinds = [k for k, st, same in cards if st == sid and not same]
        assert kinds.index("timeline") > kinds.index("roles") and kinds.index("timeline") < kinds.index("concept")


def test_without_a_trace_the_model_stands_in_and_says_what_it_models(three):
    chosen, drawn, _ = three
    site = Site()
    gallery.gallery_page(chosen, drawn, site)
    html = site.fragments["gallery"]
    assert ("timeline", "11", True) in _cards(html)
    assert "No trace of this stage is recorded; the schedule model places the same work as at" in html
    assert "not which warp issues what" in html
