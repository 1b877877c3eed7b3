"""Shared test setup: import paths, the `slow` marker, and a copy of the site fixture."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
for _p in (str(REPO / "kernels"), str(REPO)):
    if _p not in sys.path:
        sys.path.insert(0, _p)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than ~30 s")


def make_site(root: Path, lineage: Path = FIXTURES / "lineage", results: Path | None = FIXTURES / "results") -> Path:
    """A repository-shaped tree for the site generator: stages, results, docs/ and mkdocs.yml
    (the real one, with the hook pointed back at this checkout)."""
    shutil.copytree(lineage, root / "kernels" / "attention")
    (root / "bench" / "results").mkdir(parents=True)
    if results is not None:
        for f in results.glob("*.json"):
            shutil.copy(f, root / "bench" / "results" / f.name)
    css = root / "docs" / "assets" / "stylesheets"
    css.mkdir(parents=True)
    shutil.copy(REPO / "docs" / "assets" / "stylesheets" / "site.css", css / "site.css")
    shutil.copytree(REPO / "docs" / "assets" / "javascripts", root / "docs" / "assets" / "javascripts")
    config = (REPO / "mkdocs.yml").read_text().replace("  - site_gen/hook.py", f"  - {REPO / 'site_gen' / 'hook.py'}")
    (root / "mkdocs.yml").write_text(config)
    return root


@pytest.fixture
def site_root(tmp_path) -> Path:
    return make_site(tmp_path / "repo")


# --- GPU cases: run in a watchdog worker process (gpu_watchdog.py), never in this one -----------

GPU_SEED = int(os.environ.get("HOPATTN_TEST_SEED", time.time_ns() % 2**31))


def pytest_report_header(config):
    return [f"hopattn GPU cases: seed {GPU_SEED} (HOPATTN_TEST_SEED repeats a run); every case is logged, "
            f"before its launch, to {gpu_log_path()}"]


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
