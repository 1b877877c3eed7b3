"""A small disk cache for renderings that are slow and pure (highlighted diffs, the chart).

Keyed by a hash of the inputs and of the generator code that renders them, so editing this package
invalidates it. It lives in <repo>/.cache/site_gen/ (git-ignored); `mkdocs serve` reloads the
generator on every build, so an in-memory cache would not survive between rebuilds.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

_CODE_FILES = ("cache.py", "lexer.py", "diffs.py", "plots.py", "extras.py")  # shape what is cached


class DiskCache:
    def __init__(self, folder: Path | None):
        self.folder = Path(folder) if folder is not None else None
        self.version = _code_version_light()
        self.used: set[Path] = set()

    def get(self, namespace: str, parts: list, make: Callable[[], object]):
        """Return the cached value for (namespace, parts), computing and storing it on a miss."""
        if self.folder is None:
            return make()
        key = hashlib.sha256(json.dumps([self.version, namespace, parts], sort_keys=True).encode()).hexdigest()
        path = self.folder / namespace / f"{key[:32]}.json"
        self.used.add(path)
        try:
            return json.loads(path.read_text())["value"]
        except (FileNotFoundError, ValueError, KeyError):
            pass
        value = make()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"value": value}))
        os.replace(tmp, path)
        return value

    def prune(self) -> None:
        """Drop entries this run did not use (old versions of edited stages)."""
        if self.folder is None or not self.folder.is_dir():
            return
        for path in self.folder.rglob("*.json"):
            if path not in self.used:
                path.unlink(missing_ok=True)


def _code_version_light() -> str:
    """Like _code_version but without importing matplotlib (its import costs a second)."""
    from importlib.metadata import PackageNotFoundError, version

    h = hashlib.sha256()
    for dist in ("pygments", "matplotlib"):
        try:
            h.update(f"{dist} {version(dist)}\0".encode())
        except PackageNotFoundError:
            h.update(f"{dist} -\0".encode())
    here = Path(__file__).parent
    for name in _CODE_FILES:
        h.update((here / name).read_bytes())
    return h.hexdigest()[:16]
