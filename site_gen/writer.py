"""Writing generated files: only when the content changed, atomically, and pruning leftovers.

Rewriting an unchanged file would wake `mkdocs serve`'s watcher and rebuild forever; a reader (or
the server) must never see half a file, hence a temporary file in the same folder and os.replace.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_if_changed(path: Path, content: str | bytes) -> bool:
    """Write ``content`` to ``path`` unless it already holds exactly that; True if written."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    path = Path(path)
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    # A dot-name keeps the temporary file out of MkDocs' page collection if it is ever seen.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return True


def write_tree(files: dict[Path, str | bytes], owned_dirs: list[Path]) -> list[Path]:
    """Write every file that changed and delete files under ``owned_dirs`` that are no longer made.

    The caller renders everything first, so an error in rendering leaves the old tree untouched.
    """
    changed = [path for path in sorted(files) if write_if_changed(path, files[path])]
    keep = {Path(p).resolve() for p in files}
    for folder in owned_dirs:
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*")):
            if path.is_file() and path.resolve() not in keep:
                path.unlink()
                changed.append(path)
    return changed
