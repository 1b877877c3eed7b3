"""Shared test setup: import paths, the `slow` marker, and a copy of the site fixture."""

from __future__ import annotations

import shutil
import sys
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
