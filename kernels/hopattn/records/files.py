"""How every record file is written and read: JSON with sorted keys, written atomically.

A reader (the site, a test, `mkdocs serve`) must never see half a file, so a write goes to a
temporary file in the same folder and is renamed over the old one; an unchanged file is not
rewritten, so its modification time (and a file watcher) stays quiet.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def dumps(data) -> str:
    """The one JSON form of a record: sorted keys, one space of indent, UTF-8, no NaN."""
    return json.dumps(data, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def write_atomic(path: Path, content: str | bytes, *, sync: bool = True) -> None:
    """Replace ``path`` with ``content`` in one step; ``sync``: flush to disk first (records), which a
    throw-away cache entry can skip."""
    path = Path(path)
    data = content.encode("utf-8") if isinstance(content, str) else content
    path.parent.mkdir(parents=True, exist_ok=True)
    # A dot-name keeps the temporary file out of globs such as bench/results/*.json.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_if_changed(path: Path, content: str | bytes) -> bool:
    """Write ``content`` unless the file already holds exactly that; True if written."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    try:
        if Path(path).read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    write_atomic(path, data)
    return True


def read_json(path: Path, error: type[Exception]):
    """The parsed file; ``error`` (naming the file, and the line for bad JSON) when it cannot be read."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise error(f"{path}: cannot read: {err.strerror or err}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise error(f"{path}: not valid JSON (line {err.lineno}, column {err.colno}): {err.msg}") from None
