"""Backward stage 07 on the site: stage 06 with the consumers' order changed, so its figures are 06's
where the spec is (the dQ path, the roles: "unchanged since stage 06") and its own where the order
shows (the operands, the model timeline); its page with the diff against 06, its compiler facts, its
measured timelines (the committed trace records) and a benchmark section that says plainly that no
record of it exists yet, where none does."""

from __future__ import annotations

import shutil

import pytest
from conftest import REPO, make_site
from hopattn import lineage
from hopattn.records import results
from test_backward_site_04_06 import copy_lineage

from site_gen import site
from site_gen.benchmark_section import backward as numbers
from site_gen.diagrams.backward import backward_diagrams
from site_gen.diagrams.backward import facts as bwd

SEVEN = "07_scores-ahead"
TRACES = REPO / "bench" / "results" / "traces" / "nvidia-h200" / "backward"


@pytest.fixture(scope="module")
def stages() -> list[lineage.Stage]:
    return lineage.discover(lineage.BACKWARD_DIR)


def _named(stages, name):
    return next(s for s in stages if s.dir.name == name)


def test_stage_07_follows_06_and_its_figures_draw(stages):
    seven, six = _named(stages, SEVEN), _named(stages, "06_warp-specialized")
    assert stages.index(seven) == stages.index(six) + 1 and seven.number == 7
    figures = backward_diagrams(seven, stages)
    assert [d.kind for d in figures] == [d.kind for d in backward_diagrams(six, stages)]
    assert len(figures) == 4
    # the dQ figure reads the deterministic order from the spec: the last key block first, as 06
    assert bwd.dq_path(seven) == bwd.dq_path(six) and bwd.dq_path(seven).ordered.down


def test_stage_07_s_notes_are_measured():
    notes = (lineage.BACKWARD_DIR / SEVEN / "notes.md").read_text()
    assert "Not measured yet" not in notes and "A draft" not in notes
    measured = notes[notes.index("## Measured"):]
    for want in ("437 passed, 16 skipped", "backward-devtime-nvidia-h200-20261202T1351.log",
                 "trace-backward-nvidia-h200-20261202T1352.log", "**3030 ns**", "474.2",
                 "python -m bench --what backward --backward-stages 6,7", "bench-backward-nvidia-h200-20261202T1852.log",
                 "**+1.3 to +3.9 % over stage 06 in the same run**", "53.5 % of the kernel's cycles"):
        assert want in measured, want
    for name in ("07.json", "07-causal.json", "06.json", "06-causal.json"):
        assert (TRACES / name).is_file(), name


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """Stage 07's page in a fixture site with the whole backward lineage, its compiler facts and the
    committed trace records of 06 and 07 (the fixture has no backward benchmark entries)."""
    root = make_site(tmp_path_factory.mktemp("site") / "repo")
    copy_lineage(root / "kernels")
    dest = root / "bench" / "results" / "traces" / "nvidia-h200" / "backward"
    dest.mkdir(parents=True)
    for name in ("06.json", "06-causal.json", "07.json", "07-causal.json"):
        shutil.copy(TRACES / name, dest)
    pages = site.generate(root, use_cache=False)[0]
    return pages.pages[f"backward/{lineage.load_stage(lineage.BACKWARD_DIR / SEVEN).name}.md"], pages.fragments


def test_stage_07_s_page(page):
    page, fragments = page
    for anchor in ("{#diagrams}", "{#diff}", "{#compiler}", "{#benchmark}"):
        assert anchor in page, anchor
    assert "## Measured" in page and "Why +3 % and not +8 %." in page  # the notes
    # its own figures where the order shows, stage 06's where the spec is the same
    assert "fig-b07-operands" in fragments and "fig-b07-operands" in page
    assert "fig-b07-dq" not in fragments and "fig-b07-roles" not in fragments
    assert "Unchanged since [backward stage 06](06-warp-specialized.md#dq)" in page
    assert "Unchanged since [backward stage 06](06-warp-specialized.md#roles)" in page
    # the timeline section (a fragment of its own): measured (the trace records) and predicted (the model)
    timeline = fragments["timeline-backward-07-scores-ahead"]
    for fig in ("fig-b07-trace", "fig-b07-trace-causal", "fig-b07-model", "fig-b07-model-causal"):
        assert f'id="{fig}"' in timeline, fig
    assert "Diff against Backward 06" in page and "diff-backward-07-scores-ahead" in fragments
    assert "**Against backward stage 06:** registers 168 → 168 · spills 0 → 0 B" in page  # the compiler facts
    benchmark = page[page.index("{#benchmark}"):]
    assert f"**{numbers.NOT_MEASURED}.**" in benchmark and numbers.COMMAND in benchmark


def test_the_committed_results_and_the_benchmark_section_agree():
    """Until `python -m bench --what backward` has timed stage 07, its section says so; once it has,
    it gives the table."""
    stages = lineage.discover(lineage.BACKWARD_DIR)
    seven, six = _named(stages, SEVEN), _named(stages, "06_warp-specialized")
    files = results.load_indexed(REPO / "bench" / "results")
    section = numbers.stage_section(seven, six, {s.id: s.source_hash() for s in stages}, files)
    assert (numbers.NOT_MEASURED in section) == (not any(numbers.measured(seven, f) for f in files))
