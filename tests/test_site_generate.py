"""The generator end to end on the fixture lineage (no MkDocs): pages, anchors, diffs, the quality bars."""

import shutil
import sys
import types

import pytest
from conftest import make_site
from hopattn.lineage import SpecError

from site_gen import build_site as gen
from site_gen import extras


def snapshot(docs):
    return {p.relative_to(docs): p.read_bytes() for p in sorted(docs.rglob("*")) if p.is_file()}


def test_pages_and_anchors(site_root):
    changed = gen.generate(site_root)
    docs = site_root / "docs"
    names = sorted(str(p.relative_to(docs)) for p in changed)
    pages = ["gallery.md", "index.md", "stages/01-naive.md", "stages/02-tiled.md", "stages/03-fast.md"]
    assert [n for n in names if n.endswith(".md")] == pages
    assert "assets/generated/progression.svg" in names
    for s in ("01-naive", "02-tiled", "03-fast"):
        assert f"assets/generated/slots/diff-{s}.html" in names
    page = (docs / "stages" / "02-tiled.md").read_text()
    assert page.startswith("# 02 · Tiled\n")
    for anchor in ("diagrams", "diff", "compiler", "benchmark"):
        assert f"{{#{anchor}}}" in page
    assert "K tiles staged in shared memory by the whole block." in page  # the one change
    assert "Stage the K tile in shared memory" in page and "# Tiled" not in page  # notes, minus H1
    assert "[← 01 · Naive](01-naive.md)" in page and "[03 · Fast →](03-fast.md)" in page
    # the diff lives in a fragment the hook splices in after Markdown (site_gen/slots.py)
    assert '<div class="hd-slot" data-slot="diff-02-tiled"></div>' in page


def test_diff_contents(site_root):
    gen.generate(site_root)
    stages = site_root / "docs" / "assets" / "generated" / "slots"
    first = (stages / "diff-01-naive.html").read_text()
    assert "nothing to compare against" in first and "common/util.cuh" in first
    second = (stages / "diff-02-tiled.html").read_text()
    assert "+14 / −3 lines</strong> in kernel.cu and 1 header" in second  # 3 in kernel.cu + 11 new
    assert "<code>common/tile.cuh</code> <span class=\"hd-badge\">new</span>" in second
    assert ">Unified</label><label for=\"hd_diff_1_2\">Side by side</label>" in second
    assert "copy_tile" in second and "27 unchanged lines (lines 9–35)" in second
    third = (stages / "diff-03-fast.html").read_text()
    assert "<code>common/tile.cuh</code>" not in third  # shared header already shown by stage 02
    assert '<span class="nb hd-x">__expf</span>' in third


def test_second_run_writes_nothing_and_output_is_deterministic(site_root, tmp_path):
    gen.generate(site_root)
    assert gen.generate(site_root) == []
    other = make_site(tmp_path / "other")
    gen.generate(other, use_cache=False)
    assert snapshot(site_root / "docs") == snapshot(other / "docs")


def test_removed_stage_is_pruned(site_root):
    gen.generate(site_root)
    shutil.rmtree(site_root / "kernels" / "attention" / "03_fast")
    changed = gen.generate(site_root)
    assert site_root / "docs" / "stages" / "03-fast.md" in changed
    assert not (site_root / "docs" / "stages" / "03-fast.md").exists()
    assert "03 · Fast" not in (site_root / "docs" / "stages" / "02-tiled.md").read_text()


def test_bad_stage_fails_loudly_and_writes_nothing(site_root):
    gen.generate(site_root)
    before = snapshot(site_root / "docs")
    spec = site_root / "kernels" / "attention" / "02_tiled" / "stage.toml"
    spec.write_text(spec.read_text().replace("threads = 128", "threads = 100"))
    (site_root / "kernels" / "attention" / "01_naive" / "notes.md").write_text("# Naive\n\nchanged\n")
    with pytest.raises(SpecError, match=r"02_tiled/stage.toml: field 'launch.threads'"):
        gen.generate(site_root)
    assert snapshot(site_root / "docs") == before


def test_bad_results_fail_loudly_and_write_nothing(site_root):
    gen.generate(site_root)
    before = snapshot(site_root / "docs")
    path = site_root / "bench" / "results" / "nvidia-h200.json"
    path.write_text(path.read_text().replace('"causal": false', '"causal": "no"', 1))
    with pytest.raises(ValueError, match=r"nvidia-h200.json: field 'results\[\d+\]\.causal'"):
        gen.generate(site_root)
    assert snapshot(site_root / "docs") == before


def test_no_results_still_builds(tmp_path):
    root = make_site(tmp_path / "r", results=None)
    gen.generate(root)
    index = (root / "docs" / "index.md").read_text()
    assert "No measurements yet" in index and "(stages/03-fast.md)" in index
    assert not (root / "docs" / "assets" / "generated" / "progression.svg").exists()


def test_missing_or_failing_parts_become_notes(site_root, monkeypatch):
    broken = types.ModuleType("site_gen.diagrams")

    def stage_diagrams(stage, stages):
        raise RuntimeError("boom")

    broken.stage_diagrams = stage_diagrams
    monkeypatch.setitem(sys.modules, "site_gen.diagrams", broken)  # no concept/all_diagrams either
    monkeypatch.setitem(sys.modules, "site_gen.compiler", None)  # import of it raises ImportError
    gen.generate(site_root)
    page = (site_root / "docs" / "stages" / "01-naive.md").read_text()
    assert '!!! info "Diagrams not available"' in page and "RuntimeError: boom" in page
    assert '!!! info "Compiler facts not available"' in page
    gallery = (site_root / "docs" / "gallery.md").read_text()
    assert "has no `all_diagrams` yet" in gallery
    assert not list((site_root / "docs" / "assets" / "generated" / "slots").glob("diagrams-*"))


def test_parts_are_called_with_the_contract_arguments(site_root, monkeypatch):
    calls = []
    fake = types.ModuleType("site_gen.compiler")
    fake.compiler_section = lambda stage, prev: calls.append((stage.id, prev and prev.id)) or "FACTS"
    fake.overview_table = lambda stages: "| a |\n|---|\n| OVERVIEW |"
    monkeypatch.setitem(sys.modules, "site_gen.compiler", fake)
    gen.generate(site_root)
    assert calls == [("01", None), ("02", "01"), ("03", "02")]
    assert "FACTS" in (site_root / "docs" / "stages" / "02-tiled.md").read_text()
    assert "OVERVIEW" in (site_root / "docs" / "index.md").read_text()
    with pytest.raises(extras.Unavailable):
        extras.call("no_such_part", "f")


def test_nav_orders_pages(site_root):
    gen.generate(site_root)
    (site_root / "docs" / "method.md").write_text("# M\n")
    (site_root / "docs" / "introduction.md").write_text("# I\n")
    (site_root / "docs" / "zebra.md").write_text("# Z\n")
    assert gen.nav(site_root / "docs") == [
        {"Overview": "index.md"}, "introduction.md", "method.md", "zebra.md",
        {"Stages": ["stages/01-naive.md", "stages/02-tiled.md", "stages/03-fast.md"]}, "gallery.md"]


def test_entry_points(site_root):
    import subprocess

    from conftest import REPO

    import site_gen

    changed = site_gen.generate(site_root, site_root / "docs")
    assert site_root / "docs" / "index.md" in changed
    import site_gen.build_site
    assert callable(site_gen.generate) and site_gen.generate(site_root) == []
    env = {"PYTHONPATH": f"{REPO / 'kernels'}:{REPO}", "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-m", "site_gen", "--root", str(site_root)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    assert "0 file(s) changed" in run.stdout


def test_single_stage_lineage(site_root):
    for name in ("02_tiled", "03_fast"):
        shutil.rmtree(site_root / "kernels" / "attention" / name)
    gen.generate(site_root)
    page = (site_root / "docs" / "stages" / "01-naive.md").read_text()
    assert "←" not in page and "→" not in page and "{#benchmark}" in page
    assert sorted(p.name for p in (site_root / "docs" / "stages").iterdir()) == ["01-naive.md"]
