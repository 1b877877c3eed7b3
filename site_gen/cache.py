"""A small disk cache for renderings that are slow and pure (highlighted diffs, diagrams, the chart).

A value is keyed by its inputs and by what makes it: the source files of the code that renders
it (a module file or a package folder, named by the caller) and the versions of the libraries it
calls. Editing that code or upgrading the library misses the cache; editing anything else does
not. It lives in <repo>/.cache/site_gen/ (git-ignored): `mkdocs serve` reloads the generator on
every build, so an in-memory cache would not survive between rebuilds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from hopattn.records import files


@cache
def _source_hash(path: Path) -> str:
    """Hash of a module file, or of every .py file under a package folder."""
    sources = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    h = hashlib.sha256()
    for source in sources:
        h.update(source.relative_to(path.parent).as_posix().encode() + b"\0" + source.read_bytes())
    return h.hexdigest()[:16]


@cache
def _library_version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "-"


def code_version(code: Iterable[Path], libraries: Iterable[str]) -> list[str]:
    return [_source_hash(Path(p)) for p in code] + [f"{d} {_library_version(d)}" for d in libraries]


class DiskCache:
    def __init__(self, folder: Path | None):
        self.folder = Path(folder) if folder is not None else None
        self.used: set[Path] = set()

    def get(self, namespace: str, parts: list, make: Callable[[], object], *,
            code: Iterable[Path] = (), libraries: Iterable[str] = ()):
        """The cached value for (namespace, parts), made and stored on a miss. ``code``: the module
        files or package folders that make the value; ``libraries``: the distributions they call."""
        if self.folder is None:
            return make()
        key_parts = [namespace, parts, code_version(code, libraries)]
        key = hashlib.sha256(json.dumps(key_parts, sort_keys=True).encode()).hexdigest()
        path = self.folder / namespace / f"{key[:32]}.json"
        self.used.add(path)
        try:
            return json.loads(path.read_text())["value"]
        except (FileNotFoundError, ValueError, KeyError):
            pass
        value = make()
        files.write_atomic(path, json.dumps({"value": value}), sync=False)
        return value

    def prune(self) -> None:
        """Drop entries this run did not use (old versions of edited stages)."""
        if self.folder is None or not self.folder.is_dir():
            return
        for path in self.folder.rglob("*.json"):
            if path not in self.used:
                path.unlink(missing_ok=True)
