"""Shared test setup: the `slow` marker, and a small site made from three real stages.

The packages are imported as installed (`pip install -e .`); nothing here edits sys.path.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from hopattn import lineage
from hopattn.records import compiler_facts, results

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# The first three stages of the real lineage: the fixture is copied from them at test time, so it
# cannot drift from the lineage. 03 brings a new header; none of them has a causal path.
FIXTURE_STAGES = ("01_baseline", "02_smem-tiles", "03_ldmatrix")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than ~30 s")


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
        results.dump_results(dict(data, results=kept, runs=runs), dest / path.name)


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
