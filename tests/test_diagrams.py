"""The generated diagrams: interface, accessibility, byte stability, themes, speed.

They run on the real lineage, which has every shape the pictures draw: sm_80 mma.sync stages,
TMA, wgmma, warp specialisation with 3 warpgroups, pingpong, persistent, causal.
"""

from __future__ import annotations

import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hopattn import lineage

from site_gen.diagrams import Diagram, all_diagrams, concept_diagrams
from site_gen.diagrams.concepts import CONCEPTS
from site_gen.diagrams.svg import PALETTE

ROOT = Path(__file__).resolve().parent.parent
CSS = ROOT / "docs" / "assets" / "stylesheets" / "diagrams.css"
SVG_NS = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def stages():
    return lineage.discover()


@pytest.fixture(scope="module")
def diagrams(stages):
    return all_diagrams(stages)


def test_the_lineage_has_the_hopper_shapes(stages):
    ws = [s for s in stages if [r.registers for r in s.roles] == [24, 240, 240]]
    assert ws, "no warp-specialised stage (producer at setmaxnreg 24, two consumers at 240)"
    assert ws[0].warps == 12 and [len(r.warps) for r in ws[0].roles] == [4, 4, 4]
    assert {op.engine.split()[0] for op in ws[0].schedule} >= {"tma", "wgmma"}
    assert any(s.causal for s in stages) and any(s.arch == "sm_80" for s in stages)


def test_three_per_stage_plus_concepts_at_least_sixty(stages, diagrams):
    from site_gen.diagrams.structure import FIRST

    assert len(diagrams) >= 60
    numbers = {s.number for s in stages}
    by_role = sum(s.number >= FIRST for s in stages)  # the code by role (structure.py), stage 23 on
    assert by_role >= 1
    assert len(diagrams) == 3 * len(stages) + by_role + sum(n in numbers for n, _ in CONCEPTS)
    for s in stages:
        kinds = [d.kind for d in diagrams if d.stage == s.number and d.kind != "concept"]
        assert kinds == ["memory", "roles", "timeline"] + (["structure"] if s.number >= FIRST else [])
    assert all(isinstance(d, Diagram) for d in diagrams)
    for d in diagrams:
        ET.fromstring(d.svg)


def test_concepts_of_missing_stages_are_not_emitted(stages):
    first3 = stages[:3]
    ds = all_diagrams(first3)
    assert {d.stage for d in ds if d.kind == "concept"} == {1, 2, 3}
    assert concept_diagrams(stages[0], first3)[0].id == "c-online-softmax"


def test_ids_unique_and_prefixed(diagrams):
    ids = [d.id for d in diagrams]
    assert len(ids) == len(set(ids))
    seen = set()
    for d in diagrams:
        root = ET.fromstring(d.svg)
        assert root.get("id") == d.id
        for el in root.iter():
            i = el.get("id")
            if i and el is not root:
                assert i.startswith(d.id + "-"), (d.id, i)
                assert i not in seen
                seen.add(i)
        for ref in re.findall(r"url\(#([^)]+)\)", d.svg):
            assert ref.startswith(d.id + "-")


def test_accessible(diagrams):
    for d in diagrams:
        root = ET.fromstring(d.svg)
        assert root.get("role") == "img"
        title, desc = root[0], root[1]
        assert title.tag == SVG_NS + "title" and title.text == d.title
        assert desc.tag == SVG_NS + "desc" and len(desc.text) > 40
        assert root.get("aria-labelledby") == f"{title.get('id')} {desc.get('id')}"
        _x0, _y0, w, h = map(float, root.get("viewBox").split())
        assert 760 <= w <= 900 and (w, h) == (d.width, d.height)
        assert d.caption.strip()


def test_byte_stable_and_rounded(stages, diagrams):
    again = all_diagrams(stages)
    assert [d.svg for d in again] == [d.svg for d in diagrams]
    for d in diagrams:
        long_floats = re.findall(r'="(-?\d+\.\d{3,})"', d.svg)
        assert not long_floats, (d.id, long_floats[:3])
        coords = re.findall(r' (?:x|y|x1|x2|y1|y2|width|height|cx|cy|r)="(-?\d+\.\d{2,})"', d.svg)
        assert not coords, (d.id, coords[:3])
        assert not re.search(r'\bid="id\d+"', d.svg)  # svgwrite's global counter never used


def test_colours_are_theme_variables(diagrams):
    css = CSS.read_text()
    for key in PALETTE:
        assert css.count(f"--hd-{key}:") == 2, key  # default and slate
    for d in diagrams:
        for _attr, value in re.findall(r'\b(fill|stroke)="([^"]+)"', d.svg):
            assert value == "none" or re.fullmatch(r"var\(--hd-[a-z0-9]+, #[0-9a-f]{6}\)", value), (d.id, value)


def test_text_is_text(diagrams):
    for d in diagrams:
        root = ET.fromstring(d.svg)
        assert root.get("font-family")
        assert len(list(root.iter(SVG_NS + "text"))) >= 5
        assert "<image" not in d.svg


def test_standalone(diagrams):
    d = diagrams[0]
    s = d.standalone
    assert s.startswith("<?xml")
    root = ET.fromstring(s.split("\n", 1)[1])
    assert root.get("width") == str(d.width) and root.get("height") == str(d.height)
    assert root[0].tag == SVG_NS + "title"


def test_speed_of_the_whole_lineage(stages):
    t = time.perf_counter()
    ds = all_diagrams(stages)
    elapsed = time.perf_counter() - t
    assert len(ds) >= 60
    assert elapsed < 10, elapsed


def test_independent_of_svgwrites_global_counter(stages, diagrams):
    import svgwrite

    d = svgwrite.Drawing()
    for _ in range(7):
        d.add(d.rect()).get_id()  # advances the process-wide id counter
    assert [x.svg for x in all_diagrams(stages[:4])] == [x.svg for x in diagrams
                                                                  if x.stage is not None and x.stage <= 4]


def _every_drawing(stages):
    from hopattn.records import results

    from site_gen.benchmark_section import chart
    from site_gen.diagrams import doc_diagrams

    out = all_diagrams(stages) + doc_diagrams(stages)
    nums = results.load_indexed(ROOT / "bench" / "results")
    if nums:
        out.append(chart.progression_diagram(chart.progression_data(stages, nums[0]), nums[0].gpu_name))
    return out


@pytest.mark.slow  # every text of every diagram against every other: 10-30 s on two cores
def test_no_text_is_clipped_or_overlapping(stages):
    """Every text of every figure inside the viewBox and clear of the others (estimated from Arial's
    widths; the browser test measures the rendered ones)."""
    from site_gen.diagrams.svg import text_problems

    for d in _every_drawing(stages):
        if d.kind == "timeline":  # the timeline module's own checks
            continue
        assert text_problems(d.svg, d.width, d.height) == [], d.id


def test_text_sizes(stages):
    """Labels are at least 11 px at page width (the warp roles: 12 px); the pictures are drawn about
    860 px wide, the width of the page's text column."""
    for d in _every_drawing(stages):
        if d.kind == "timeline":
            continue
        sizes = [float(x) for x in re.findall(r'font-size="([\d.]+)"', d.svg)]
        assert min(sizes) >= (12 if d.kind == "roles" else 11), (d.id, min(sizes))


def test_at_least_sixty_distinct_diagrams(stages):
    from site_gen.diagrams import doc_diagrams
    from site_gen.diagrams.section import distinct

    every = all_diagrams(stages)
    drawn = {s.number: (s, [d for d in every if d.stage == s.number]) for s in stages}
    shown = distinct(stages, drawn) + doc_diagrams(stages)
    assert len(shown) >= 60
    assert len({d.svg for d in shown}) == len(shown)  # none a copy of another
    # every stage page has at least one picture its predecessor's page does not
    for s in stages[1:]:
        assert any(d.stage == s.number for d in shown), s.name
