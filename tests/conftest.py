"""Shared test setup: a small site made from three real stages, the GPU worker, and lines that say
what a long or skipped part of the run is doing (the markers themselves are defined once, in
pyproject.toml's [tool.pytest.ini_options]).

The packages are imported as installed (`pip install -e .`); nothing here edits sys.path.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

import pytest
from hopattn import lineage
from hopattn.records import compiler_facts, results

REPO = Path(__file__).resolve().parent.parent
# Forward stages without a committed trace yet (none since stage 24's re-run, `python -m bench.trace
# --stages 24`, 2026-12-03T0156): a new stage goes here until bench/results/traces/nvidia-h200/NN.json
# and NN-causal.json are committed, then out (tests/test_timeline.py fails while a stage here has its
# records).
AWAITING_TRACE: set[str] = set()
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# The first three stages of the real lineage: the fixture is copied from them at test time, so it
# cannot drift from the lineage. 03 brings a new header; none of them has a causal path.
FIXTURE_STAGES = ("01_baseline", "02_smem-tiles", "03_ldmatrix")


def _copy_results(dest: Path, hashes: dict[str, str]) -> None:
    """The committed results, cut down to the copied stages (and every peer) and stamped with the
    stages' sources as they are now, so that the fixture starts current (a test edits a stage to
    make it stale)."""
    for path in sorted((REPO / "bench" / "results").glob("*.json")):
        if path.name.startswith("models-"):  # the model benchmarks' record: not copied, the fixture has none
            continue
        data = results.load_results(path)
        kept = [e if e["kind"] == "peer" else dict(e, source_hash=hashes[e["name"]])
                for e in data["results"] if e["kind"] == "peer" or e["name"] in hashes]
        runs = {rid: run for rid, run in data["runs"].items() if any(e["run_id"] == rid for e in kept)}
        cut = dict(data, results=kept, runs=runs)
        if "backward" in cut:  # the fixture has no backward lineage
            cut["backward"] = []
        results.dump_results(cut, dest / path.name)


def make_site(root: Path, stages=FIXTURE_STAGES, with_results: bool = True) -> Path:
    """A repository-shaped tree for the site generator: real stages, their compiler facts and
    measured results, docs/assets and mkdocs.yml (the real one, with the hook pointed back at
    this checkout)."""
    attention = root / "kernels" / "attention"
    shutil.copytree(lineage.ATTENTION_DIR / "common", attention / "common")
    for name in stages:
        shutil.copytree(lineage.ATTENTION_DIR / name, attention / name)
    copied = lineage.discover(attention)
    facts = compiler_facts.folder_for(attention)
    facts.mkdir(parents=True)
    for stage in copied:
        shutil.copy(compiler_facts.folder_for(lineage.ATTENTION_DIR) / f"{stage.name}.json", facts)
    (root / "bench" / "results").mkdir(parents=True)
    if with_results:
        _copy_results(root / "bench" / "results", {s.id: s.source_hash() for s in copied})
    shutil.copytree(REPO / "docs" / "assets", root / "docs" / "assets", ignore=shutil.ignore_patterns("generated"))
    config = (REPO / "mkdocs.yml").read_text().replace("  - site_gen/hook.py", f"  - {REPO / 'site_gen' / 'hook.py'}")
    (root / "mkdocs.yml").write_text(config)
    return root


@pytest.fixture
def site_root(tmp_path) -> Path:
    return make_site(tmp_path / "repo")


# --- what a long or skipped part of the run is doing --------------------------------------------


def browser_missing() -> str | None:
    """Why the browser tests will skip (tests/test_site_browser.py checks the same), or None."""
    missing = [name for name, found in (("chromium", shutil.which("chromium") or shutil.which("chromium-browser")),
                                        ("chromedriver", shutil.which("chromedriver"))) if not found]
    if missing:
        return (f"{' and '.join(missing)} not on PATH (Debian/Ubuntu: sudo apt install chromium chromium-driver; "
                ".ci/run installs them)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium not installed (pip install selenium; the test extra has it)"
    return None


def pytest_report_header(config):
    lines = [f"hopattn GPU cases: seed {GPU_SEED} (HOPATTN_TEST_SEED repeats a run); every case is logged, "
             f"before its launch, to {gpu_log_path()}"]
    why = browser_missing()
    if why and "browser" not in (config.getoption("markexpr") or ""):
        lines.append(f"browser tests: WILL SKIP: {why}")
    return lines


_announced: set[str] = set()


def pytest_runtest_setup(item):
    """Before the first long test (slow, browser) of a module, a line naming the module and what it
    does, so that a minute without a dot does not look like a hang."""
    module = item.nodeid.split("::")[0]
    if module in _announced or not {m.name for m in item.iter_markers()} & {"slow", "browser"}:
        return
    _announced.add(module)
    reporter = item.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or reporter.verbosity > 0:  # -v names every test already
        return
    why = browser_missing() if item.get_closest_marker("browser") else None
    what = (item.module.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ").split(": ")[0].split(". ")[0]
    what = what.rstrip(".") if len(what) <= 90 else what[:90].rsplit(" ", 1)[0] + " ..."
    line = (f"{module}: the browser tests skip: {why}" if why else
            f"{module}: slow tests start ({what}); -m 'not slow and not browser' leaves them out")
    capture = item.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        if getattr(getattr(reporter, "_tw", None), "width_of_current_line", 0):
            reporter.write("\n")  # after -q's dots
        reporter.write_line(line)


# --- GPU cases: run in a watchdog worker process (gpu_watchdog.py), never in this one -----------

GPU_SEED = int(os.environ.get("HOPATTN_TEST_SEED", time.time_ns() % 2**31))


def gpu_log_path() -> Path:
    return Path(os.environ.get("HOPATTN_GPU_LOG", REPO / "build" / "gpu-tests.log"))


@pytest.fixture(scope="session")
def gpu():
    """The watchdog worker: `gpu.call("check", label=..., stage=..., ...)` runs a case of gpu_cases.py
    in a separate process with a time limit. The stages are compiled first, here (no GPU needed),
    so that no case's limit includes nvcc."""
    from gpu_watchdog import Worker
    from hopattn import build

    build.build_stages()
    build.build_native()
    worker = Worker(gpu_log_path())
    yield worker
    worker.close()
