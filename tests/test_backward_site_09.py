"""Backward stage 09 on the site: stage 08 with its consumers out of phase (dQ a step late from a
second dSᵀ tile, the exchange on mbarriers, the products in turns), the default backward
until stage 10. Its page has the diff against 08, its compiler facts, its measured timelines (the
committed trace records) and its benchmark section; its notes give the prediction and what the GPU
measured, from the committed logs and records."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import REPO, make_site
from hopattn import lineage
from test_backward_site_04_06 import copy_lineage

from site_gen import site
from site_gen.diagrams.backward import backward_diagrams

NINE = "09_out-of-phase"
TRACES = REPO / "bench" / "results" / "traces" / "nvidia-h200" / "backward"
LOGS = REPO / "bench" / "logs"
RUN = "20261203T000819Z"


def test_stage_09_s_figures_draw():
    stages = lineage.discover(lineage.BACKWARD_DIR)
    nine = stages[8]
    assert nine.dir.name == NINE
    figures = backward_diagrams(nine, stages)
    assert len(figures) == 4
    assert any(s.name == "dS" and s.buffers == 2 for s in nine.smem)  # the second dSᵀ tile, drawn


def test_stage_09_s_notes_are_measured():
    notes = (lineage.BACKWARD_DIR / NINE / "notes.md").read_text()
    for section in ("## What stage 08 measured, and what it says", "## The change", "## Prediction",
                    "## What the compiler made of it", "## Measured"):
        assert section in notes, section
    measured = notes[notes.index("## Measured"):]
    for want in ("**437 passed,\n7 skipped**", "backward-devtime-out-of-phase-nvidia-h200-20261202T2353.log",
                 f"run {RUN}", "bench-backward-nvidia-h200-20261203T0008.log", "`softmax` **497 → 333 ns**",
                 "`wait_turn` **206 ns**", "trace-roles-backward-08-09-nvidia-h200-20261203T0006.txt"):
        assert want in measured, want
    # the benchmark table, as the committed record of that run holds stage 09's entries
    entries = [e for e in json.loads((REPO / "bench" / "results" / "nvidia-h200.json").read_text())["backward"]
               if e["run_id"] == RUN and e["name"] == "09"]
    default = {(e["shape"], e["causal"]): e for e in entries if not e.get("deterministic")}
    order = [(shape, causal) for causal in (False, True) for shape in ("4k", "8k", "16k")]
    assert len(default) == 6

    def row(values):
        return " / ".join(values[:3]) + " | " + " / ".join(values[3:])

    assert "| stage 09 | **" + " / ".join(f"{default[k]['tflops']:.1f}" for k in order[:3]) + "** | **" + \
        " / ".join(f"{default[k]['tflops']:.1f}" for k in order[3:]) + "** |" in measured
    for peer, label in (("fa4", "FA4"), ("cudnn", "cuDNN")):
        want = f"| 09 × {label} | " + row([f"{default[k]['ratios'][peer]:.3f}" for k in order]) + " |"
        assert want in measured, want
    for name in ("gpu-tests-backward-out-of-phase-nvidia-h200-20261202T2353-pytest.log",
                 "backward-devtime-out-of-phase-nvidia-h200-20261202T2353.log",
                 "bench-backward-nvidia-h200-20261203T0008.log", "trace-roles-backward-08-09-nvidia-h200-20261203T0006.txt"):
        assert (LOGS / name).is_file(), name
    for name in ("09.json", "09-causal.json"):
        assert (TRACES / name).is_file(), name


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    root = make_site(tmp_path_factory.mktemp("site") / "repo")
    copy_lineage(root / "kernels")
    dest = root / "bench" / "results" / "traces" / "nvidia-h200" / "backward"
    dest.mkdir(parents=True)
    for name in ("08.json", "08-causal.json", "09.json", "09-causal.json"):
        shutil.copy(TRACES / name, dest)
    pages = site.generate(root, use_cache=False)[0]
    return pages.pages[f"backward/{lineage.load_stage(lineage.BACKWARD_DIR / NINE).name}.md"], pages.fragments


def test_stage_09_s_page(page):
    page, fragments = page
    for anchor in ("{#diagrams}", "{#diff}", "{#compiler}", "{#benchmark}"):
        assert anchor in page, anchor
    assert "## Prediction" in page and "`wait_turn`" in page  # the notes
    assert "Diff against Backward 08" in page and "diff-backward-09-out-of-phase" in fragments
    diff = fragments["diff-backward-09-out-of-phase"]
    assert "TURN_BAR" in diff and "ds_free" in diff and "issue_dq" in diff
    assert "**Against backward stage 08:** registers 168 → 168 · spills 0 → 0 B" in page
    timeline = fragments["timeline-backward-09-out-of-phase"]
    for fig in ("fig-b09-trace", "fig-b09-trace-causal"):
        assert f'id="{fig}"' in timeline, fig
