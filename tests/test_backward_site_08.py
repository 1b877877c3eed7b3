"""Backward stage 08 on the site: stage 07 with its softmax's exponentials as straight-line code, the
lineage's last stage. Its spec is 07's but for the words of the change, so its figures draw as 07's;
its page has the diff against 07, its compiler facts, its measured timelines (the committed trace
records) and its benchmark section; its notes are measured (the GPU tests, the benchmark beside
FlashAttention-4 and cuDNN, the development loop, the traces, Nsight Compute, the training steps)."""

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

EIGHT = "08_mask-select"
SEVEN = "07_scores-ahead"
TRACES = REPO / "bench" / "results" / "traces" / "nvidia-h200" / "backward"
LOGS = REPO / "bench" / "logs"


@pytest.fixture(scope="module")
def stages() -> list[lineage.Stage]:
    return lineage.discover(lineage.BACKWARD_DIR)


def _named(stages, name):
    return next(s for s in stages if s.dir.name == name)


def test_stage_08_follows_07_and_its_figures_draw(stages):
    eight, seven = _named(stages, EIGHT), _named(stages, SEVEN)
    assert (eight.dir.name, seven.dir.name) == (EIGHT, SEVEN) and eight.number == 8
    figures = backward_diagrams(eight, stages)
    assert [d.kind for d in figures] == [d.kind for d in backward_diagrams(seven, stages)]
    assert len(figures) == 4
    assert bwd.dq_path(eight) == bwd.dq_path(seven) and bwd.dq_path(eight).ordered.down


def test_stage_08_s_notes_are_measured():
    notes = (lineage.BACKWARD_DIR / EIGHT / "notes.md").read_text()
    assert "<!--" not in notes and "Not measured yet" not in notes
    compiler = notes[notes.index("## What the compiler made of it"):notes.index("## Prediction")]
    for want in ("**2408 instructions against 3000**", "**`BSSY` 73 → 9**", "**`BRA` 376 → 60**",
                 "**The unmasked loop is one `FFMA` and one `MUFU.EX2` an element**",
                 "**the traced build spills 8 bytes** (stage 07's: 36)"):
        assert want in compiler, want
    measured = notes[notes.index("## Measured"):]
    for want in ("**435 passed, 18 skipped**", "gpu-tests-backward-08-nvidia-h200-20261202T2121-pytest.log",
                 "python -m bench --what backward --backward-stages 7,8 --backward-peers fa4,cudnn,fa2",
                 "run 20261202T212518Z", "bench-backward-nvidia-h200-20261202T2125.log",
                 "**+9.1 to +11.6 % over stage 07 in the same run**",
                 "backward-devtime-08-nvidia-h200-20261202T2121.log", "474.2 → 520.0 TFLOP/s", "486.7 → 544.4",
                 "trace-backward-nvidia-h200-20261202T2121.log", "**2819 ns traced against stage 07's 3037**",
                 "**2695 against 3148**", "**`softmax` 852 → 502 ns**",
                 "trace-roles-backward-07-08-nvidia-h200-20261202T2121.txt", "`dvdk` 377 and 351 ns",
                 "ncu-backward-07-08-nvidia-h200-20261202T2124.txt", "ncu-source-07-08-mask-select.csv.gz",
                 "**10.58 →\n9.05 ms**", "**53.5 % →\n63.3 %**", "**`branch_resolving` stalls 6.6 % → 0.4 % of the samples.**",
                 "**Both warpgroups exponentiate at once**", "run\n20261202T212949Z",
                 "models-training-nvidia-h200-20261202T2129.log", "**1.000× SDPA**", "**1.051× SDPA**"):
        assert want in measured, want
    # the benchmark table's rows, as the log of that run holds them (the record now holds stage 08's
    # entries of a later run, 20261203T000819Z, beside stage 09)
    import re

    log = (LOGS / "bench-backward-nvidia-h200-20261202T2125.log").read_text()
    cells = {(m.group(1), m.group(2) == "causal"): m.groups()[2:]
             for m in re.finditer(r"^stage 08 +(4k|8k|16k) (non-causal|causal) +ok +([\d.]+) +[\d.]+ +[\d.]+ +([\d.]+) +([\d.]+)",
                                  log, re.M)}
    order = [(shape, causal) for causal in (False, True) for shape in ("4k", "8k", "16k")]
    assert len(cells) == 6
    assert "| **stage 08** | " + " | ".join(f'**{cells[k][0]}**' for k in order) + " |" in measured
    for column, label in ((1, "FlashAttention-4"), (2, "cuDNN")):
        row = f"| stage 08 / {label} | " + " | ".join(cells[k][column] for k in order) + " |"
        assert row in measured, row
    for name in ("gpu-tests-backward-08-nvidia-h200-20261202T2121-pytest.log",
                 "gpu-tests-backward-08-nvidia-h200-20261202T2121.log", "bench-backward-nvidia-h200-20261202T2125.log",
                 "backward-devtime-08-nvidia-h200-20261202T2121.log", "trace-backward-nvidia-h200-20261202T2121.log",
                 "trace-roles-backward-07-08-nvidia-h200-20261202T2121.txt",
                 "ncu-backward-07-08-nvidia-h200-20261202T2124.txt", "models-training-nvidia-h200-20261202T2129.log"):
        assert (LOGS / name).is_file(), name
    assert (REPO / "research" / "backward_next" / "ncu-source-07-08-mask-select.csv.gz").is_file()
    for name in ("08.json", "08-causal.json", "07.json", "07-causal.json"):
        assert (TRACES / name).is_file(), name


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """Stage 08's page in a fixture site with the whole backward lineage, its compiler facts and the
    committed trace records of 07 and 08 (the fixture has no backward benchmark entries)."""
    root = make_site(tmp_path_factory.mktemp("site") / "repo")
    copy_lineage(root / "kernels")
    dest = root / "bench" / "results" / "traces" / "nvidia-h200" / "backward"
    dest.mkdir(parents=True)
    for name in ("07.json", "07-causal.json", "08.json", "08-causal.json"):
        shutil.copy(TRACES / name, dest)
    pages = site.generate(root, use_cache=False)[0]
    return pages.pages[f"backward/{lineage.load_stage(lineage.BACKWARD_DIR / EIGHT).name}.md"], pages.fragments


def test_stage_08_s_page(page):
    page, fragments = page
    for anchor in ("{#diagrams}", "{#diff}", "{#compiler}", "{#benchmark}"):
        assert anchor in page, anchor
    assert "## Measured" in page and "**Both warpgroups exponentiate at once**" in page  # the notes
    # the diff against 07: the softmax's loop
    assert "Diff against Backward 07" in page and "diff-backward-08-mask-select" in fragments
    diff = fragments["diff-backward-08-mask-select"]
    assert "first_col" in diff and "INFINITY" in diff
    assert "**Against backward stage 07:** registers 168 → 168 · spills 0 → 0 B" in page  # the compiler facts
    # the timeline section: measured (the trace records) and predicted (the model)
    timeline = fragments["timeline-backward-08-mask-select"]
    for fig in ("fig-b08-trace", "fig-b08-trace-causal"):
        assert f'id="{fig}"' in timeline, fig
    benchmark = page[page.index("{#benchmark}"):]
    assert f"**{numbers.NOT_MEASURED}.**" in benchmark and numbers.COMMAND in benchmark


def test_the_committed_results_and_the_benchmark_section_agree(stages):
    """Once `python -m bench --what backward` has timed stage 08 (run 20261202T212518Z), its section
    gives the table; where no record of it is, the section says so."""
    eight, seven = _named(stages, EIGHT), _named(stages, SEVEN)
    files = results.load_indexed(REPO / "bench" / "results")
    section = numbers.stage_section(eight, seven, {s.id: s.source_hash() for s in stages}, files)
    assert (numbers.NOT_MEASURED in section) == (not any(numbers.measured(eight, f) for f in files))
