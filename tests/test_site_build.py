"""`mkdocs build --strict` of the fixture site and of the real one; `mkdocs serve` regenerates on edits."""

import os
import re
import runpy
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import REPO

MAX_PAGE_BYTES = 500_000  # a stage page's HTML: its diff and the every-warp traces are loaded apart


def mkdocs(root, *args, timeout=300):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run([sys.executable, "-m", "mkdocs", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_fixture_site_builds_strict(site_root):
    run = mkdocs(site_root, "build", "--strict")
    assert run.returncode == 0, run.stderr
    site = site_root / "site"
    page = (site / "stages" / "02-smem-tiles" / "index.html").read_text()
    for anchor in ("diagrams", "diff", "compiler", "benchmark"):
        assert f'id="{anchor}"' in page
    # the diff is a file of its own that the page loads (site_gen/fragments.py deferred), so pages stay light
    assert 'class="hd-deferred" data-src="../../assets/generated/diffs/02-smem-tiles.html"' in page
    diff = (site / "assets" / "generated" / "diffs" / "02-smem-tiles.html").read_text()
    assert diff.startswith('<meta charset="utf-8">') and '<div class="tabbed-set tabbed-alternate"' in diff
    assert "Side by side" in diff and "Side by side" not in page
    assert 'class="hd-figure"' in page and "<svg" in page  # the diagrams, spliced in
    assert 'href="../01-baseline/"' in page and 'href="../03-ldmatrix/"' in page
    index = (site / "index.html").read_text()
    # the climb is inline SVG in the site's fonts and colours, with its standalone file linked
    assert re.search(r'<figure class="hd-figure" id="fig-climb"[^>]*>\s*<div class="hd-figure-svg"><svg', index)
    assert 'href="assets/generated/progression.svg"' in index
    assert (site / "models" / "index.html").is_file() and "Not measured yet" in (site / "models" / "index.html").read_text()
    assert (site / "assets" / "generated" / "progression.svg").is_file()
    assert (site / "assets" / "generated" / "diagrams" / "s02-memory.svg").is_file()
    assert (site / "assets" / "javascripts" / "mathjax" / "tex-svg.js").stat().st_size > 1_000_000
    assert (site / "gallery" / "index.html").is_file()
    # handed to MkDocs in memory: nothing generated is left in docs/
    assert sorted(p.relative_to(site_root / "docs").parts[0] for p in (site_root / "docs").iterdir()) == ["assets"]
    assert not (site_root / "docs" / "assets" / "generated").exists()


def test_bad_stage_aborts_the_build_naming_file_and_field(site_root):
    spec = site_root / "kernels" / "attention" / "02_smem-tiles" / "stage.toml"
    spec.write_text(spec.read_text().replace("threads = 128", "threads = 100"))
    run = mkdocs(site_root, "build", "--strict")
    assert run.returncode != 0
    assert "02_smem-tiles/stage.toml: field 'launch.threads' must be a multiple of 32" in run.stderr
    assert not (site_root / "site" / "index.html").exists()


def test_a_planted_diagram_error_fails_the_strict_build_naming_stage_and_file(site_root):
    spec = site_root / "kernels" / "attention" / "02_smem-tiles" / "stage.toml"
    # valid to the typed spec, but the timeline model deadlocks: the first op waits for the iteration's last
    spec.write_text(spec.read_text().replace('after = ["prev.pv"]', 'after = ["pv"]', 1))
    run = mkdocs(site_root, "build", "--strict")
    assert run.returncode != 0
    assert ("kernels/attention/02_smem-tiles/stage.toml: the diagrams of stage 02-smem-tiles failed: "
            "ScheduleError") in run.stderr
    assert "site_gen/diagrams/schedule.py:" in run.stderr
    assert not (site_root / "site" / "index.html").exists()


@pytest.mark.slow  # the whole lineage's site, 20-25 s on two cores
def test_real_site_builds_strict(tmp_path):
    run = mkdocs(REPO, "build", "--strict", "--site-dir", str(tmp_path / "site"))
    assert run.returncode == 0, run.stderr[-4000:]
    stages = sorted(p.name for p in (REPO / "kernels" / "attention").iterdir()
                    if p.is_dir() and p.name != "common")
    for name in stages:
        url = name.replace("_", "-", 1)
        page = tmp_path / "site" / "stages" / url / "index.html"
        assert page.is_file()
        assert page.stat().st_size < MAX_PAGE_BYTES, f"{url}: {page.stat().st_size} bytes of HTML"
        assert (tmp_path / "site" / "assets" / "generated" / "diffs" / f"{url}.html").is_file()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode()
    except OSError:
        return ""


def _wait_for(url, text, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if text in _get(url):
            return True
        time.sleep(0.5)
    return False


@pytest.mark.slow
def test_serve_regenerates_after_an_edit(site_root):
    port = _free_port()
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.Popen([sys.executable, "-m", "mkdocs", "serve", "--livereload", "-a", f"127.0.0.1:{port}"],
                            cwd=site_root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/stages/02-smem-tiles/"
        assert _wait_for(url, "02 · ", 120), "serve did not come up"
        time.sleep(1.0)
        notes = site_root / "kernels" / "attention" / "02_smem-tiles" / "notes.md"
        notes.write_text(notes.read_text() + "\nA sentence added while serving.\n")
        start = time.monotonic()
        assert _wait_for(url, "A sentence added while serving.", 30), "edit to notes.md not picked up"
        kernel = site_root / "kernels" / "attention" / "03_ldmatrix" / "kernel.cu"
        kernel.write_text(kernel.read_text() + "// a line added while serving\n")
        assert _wait_for(f"http://127.0.0.1:{port}/assets/generated/diffs/03-ldmatrix.html",
                         "a line added while serving", 30), "edit to kernel.cu not picked up"  # the page's diff
        elapsed = time.monotonic() - start
        assert elapsed < 60
        # No rebuild loop: once settled, the server builds no more.
        time.sleep(3)
        proc.terminate()
        _, log = proc.communicate(timeout=20)
        builds = log.count("Building documentation")
        assert 3 <= builds <= 5, log[-3000:]  # the first build and about one per edit, no loop
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_hook_reloads_the_generator_each_build():
    hook = runpy.run_path(str(REPO / "site_gen" / "hook.py"))  # as MkDocs loads it: from its path
    # The hook swaps modules in sys.modules; put the originals back so other tests keep one
    # hopattn.lineage (and so one SpecError class).
    saved = {k: v for k, v in sys.modules.items() if k.startswith(("site_gen", "hopattn"))}
    try:
        first, _, _ = hook["_fresh_generator"]()
        second, _, _ = hook["_fresh_generator"]()
        assert first is not second and first.__name__ == "site_gen.site"
        assert sys.modules["site_gen.site"] is second
    finally:
        for k in [k for k in sys.modules if k.startswith(("site_gen", "hopattn"))]:
            del sys.modules[k]
        sys.modules.update(saved)
        for name, module in saved.items():  # the package attributes the re-import rebound
            parent, _, child = name.rpartition(".")
            if parent in saved and child:
                setattr(saved[parent], child, module)
