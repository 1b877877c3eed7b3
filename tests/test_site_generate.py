"""The generator end to end on the fixture site (three real stages; no MkDocs): pages, anchors,
diffs, determinism, and bad input or a failing section stopping it with the culprit named."""

import shutil
import subprocess
import sys

import pytest
from conftest import REPO, make_site
from hopattn import lineage
from hopattn.lineage import SpecError
from hopattn.records.results import ResultsError

from site_gen import fragments, nav, site
from site_gen.diff_section import compare


def render(root, **kw):
    return site.generate(root, **kw)[0]


def test_pages_and_anchors(site_root):
    out = render(site_root)
    stages = lineage.discover(site_root / "kernels" / "attention")
    assert sorted(out.pages) == ["gallery.md", "index.md", "models.md", *[f"stages/{s.name}.md" for s in stages]]
    assert "assets/generated/progression.svg" in out.assets
    assert {f"diff-{s.name}" for s in stages} <= set(out.fragments)
    second = stages[1]
    page = out.pages[f"stages/{second.name}.md"]
    assert page.startswith(f"# 02 · {second.title}\n")
    for anchor in ("diagrams", "diff", "compiler", "benchmark"):
        assert f"{{#{anchor}}}" in page
    assert second.change in page  # the one change
    notes = second.notes_path.read_text()
    assert notes.splitlines()[0] not in page  # the notes' own H1 is dropped ...
    assert notes.split("\n\n")[1].strip()[:60] in page  # ... and the prose kept
    assert f"[← 01 · {stages[0].title}](01-baseline.md)" in page and f"[03 · {stages[2].title} →](03-ldmatrix.md)" in page
    # the diff lives in a fragment the hook splices in after Markdown (site_gen/fragments.py)
    assert fragments.placeholder(f"diff-{second.name}") in page


def test_a_stage_page_opens_with_its_change_numbers_and_figure(site_root):
    out = render(site_root)
    page = out.pages["stages/02-smem-tiles.md"]
    change, cards, lead, notes = (page.index("The one change"), page.index("headline-02-smem-tiles"),
                                  page.index("fig-s02-memory"), page.index("## Diagrams"))
    assert change < cards < lead < notes  # the figure before the prose
    assert "over stage 01" in out.fragments["headline-02-smem-tiles"]
    assert "Drawn at the top of this page" in page  # not drawn twice
    assert '??? info "Every task of every role (stage.toml)"' in page
    third = out.pages["stages/03-ldmatrix.md"]
    assert "Unchanged since [stage 02](02-smem-tiles.md#roles)" in third  # the roles did not change in 03


def test_diff_contents(site_root):
    out = render(site_root)
    stages = lineage.discover(site_root / "kernels" / "attention")
    first = out.fragments["diff-01-baseline"]
    assert "nothing to compare against" in first and "common/mma_sm80.cuh" in first
    second = out.fragments["diff-02-smem-tiles"]
    d = compare.diff_texts("kernel.cu", stages[0].kernel_path.read_text(), stages[1].kernel_path.read_text())
    assert f"+{d.added} / −{d.removed} lines</strong> in kernel.cu." in second  # no header changed
    assert ">Unified</label><label for=\"hd_diff_1_2\">Side by side</label>" in second
    assert "unchanged lines (lines " in second  # long unchanged runs fold
    third = out.fragments["diff-03-ldmatrix"]
    assert '<code>common/ldmatrix.cuh</code> <span class="hd-badge">new</span>' in third
    assert "<code>common/mma_sm80.cuh</code>" not in third  # shared header, unchanged since stage 01
    assert '<span class="nf hd-x">' in third or 'hd-x' in third  # intra-line marks


def test_output_is_deterministic_and_the_cache_changes_nothing(site_root, tmp_path):
    warm = render(site_root)
    again = render(site_root)  # from the disk cache
    cold = render(make_site(tmp_path / "other"), use_cache=False)
    assert warm == again == cold


def test_removed_stage_disappears(site_root):
    shutil.rmtree(site_root / "kernels" / "attention" / "03_ldmatrix")
    out = render(site_root)
    assert "stages/03-ldmatrix.md" not in out.pages
    assert "03 ·" not in out.pages["stages/02-smem-tiles.md"]


def test_a_stage_edited_since_it_was_measured_is_stale(site_root):
    kernel = site_root / "kernels" / "attention" / "02_smem-tiles" / "kernel.cu"
    kernel.write_text(kernel.read_text() + "// a comment fixed after the benchmark run\n")
    page = render(site_root).pages["stages/02-smem-tiles.md"]
    assert 'class="hd-stale"' not in page and "Stale compiler facts" not in page  # a comment changes no number
    kernel.write_text(kernel.read_text() + "constexpr int EDITED_AFTER_THE_RUN = 1;\n")
    out = render(site_root)
    page = out.pages["stages/02-smem-tiles.md"]
    assert 'class="hd-stale"' in page and 'class="hd-stale"' not in out.pages["stages/01-baseline.md"]
    assert '!!! warning "Stale compiler facts"' in page


def test_bad_stage_fails_loudly_naming_file_and_field(site_root):
    spec = site_root / "kernels" / "attention" / "02_smem-tiles" / "stage.toml"
    spec.write_text(spec.read_text().replace("threads = 128", "threads = 100"))
    with pytest.raises(SpecError, match=r"02_smem-tiles/stage.toml: field 'launch.threads'"):
        render(site_root)


def test_bad_results_fail_loudly_naming_file_and_field(site_root):
    path = site_root / "bench" / "results" / "nvidia-h200.json"
    path.write_text(path.read_text().replace('"causal": false', '"causal": "no"', 1))
    with pytest.raises(ResultsError, match=r"nvidia-h200.json: field 'results\[\d+\]\.causal'"):
        render(site_root)


def test_a_failing_diagram_names_the_stage_its_file_and_the_code(site_root):
    # A spec the lineage accepts (every key of its type) but the diagrams cannot draw: a schedule whose
    # first op waits for the same iteration's last, so the timeline model deadlocks.
    spec = site_root / "kernels" / "attention" / "02_smem-tiles" / "stage.toml"
    spec.write_text(spec.read_text().replace('after = ["prev.pv"]', 'after = ["pv"]', 1))
    with pytest.raises(site.SectionError) as err:
        render(site_root)
    msg = str(err.value)
    assert "kernels/attention" in msg and "diagrams" in msg and "site_gen/diagrams/schedule.py:" in msg


def test_no_results_still_renders(tmp_path):
    root = make_site(tmp_path / "r", with_results=False)
    out = render(root)
    assert "No measurements yet" in out.pages["index.md"] and "(stages/03-ldmatrix.md)" in out.pages["index.md"]
    assert "assets/generated/progression.svg" not in out.assets


def test_nav_orders_pages(site_root):
    out = render(site_root)
    for name in ("method.md", "introduction.md", "zebra.md"):
        (site_root / "docs" / name).write_text("# x\n")
    assert nav.nav(site_root / "docs", sorted(out.pages)) == [
        {"Overview": "index.md"}, "introduction.md", "method.md", "zebra.md", "models.md",
        {"Stages": ["stages/01-baseline.md", "stages/02-smem-tiles.md", "stages/03-ldmatrix.md"]}, "gallery.md"]


def test_command_line(site_root, tmp_path):
    run = subprocess.run([sys.executable, "-m", "site_gen", "--root", str(site_root), "--out", str(tmp_path / "out")],
                         cwd=REPO, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=300,
                         check=False)
    assert run.returncode == 0, run.stderr
    assert "site_gen: 6 pages" in run.stdout
    assert (tmp_path / "out" / "stages" / "02-smem-tiles.md").read_text() == render(site_root).pages["stages/02-smem-tiles.md"]


def test_single_stage_lineage(tmp_path):
    out = render(make_site(tmp_path / "one", stages=("01_baseline",)))
    page = out.pages["stages/01-baseline.md"]
    assert "←" not in page and "→" not in page and "{#benchmark}" in page
    assert [p for p in out.pages if p.startswith("stages/")] == ["stages/01-baseline.md"]
