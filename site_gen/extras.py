"""Calls into the parts other team members own (diagrams, compiler facts), made failure-proof.

Each is imported when called, not when this module loads, so a part that lands while `mkdocs serve`
runs is picked up at the next rebuild. If it is missing or raises, the page says so in a note
instead of the whole site failing to build; the reason is also logged (logger "site_gen", not
"mkdocs", so a strict build of the rest of the site still passes).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import logging
from pathlib import Path
from types import SimpleNamespace

from .blocks import esc, note

log = logging.getLogger("site_gen")


class Unavailable(Exception):
    """A part could not produce its output; str() is the reader-facing reason."""


def call(module: str, func: str, *args):
    try:
        mod = importlib.import_module(f"site_gen.{module}")
    except ImportError as err:
        raise Unavailable(f"`site_gen.{module}` is not available ({err}).") from None
    fn = getattr(mod, func, None)
    if fn is None:
        raise Unavailable(f"`site_gen.{module}` has no `{func}` yet.")
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001  (any failure of another part degrades to a note)
        log.warning("site_gen.%s.%s failed: %s: %s", module, func, type(err).__name__, err)
        raise Unavailable(f"`site_gen.{module}.{func}` failed: {type(err).__name__}: {err}") from None


def unavailable_note(what: str, err: Unavailable) -> str:
    text = esc(str(err).replace("\n", " "))
    return note("info", f"{what} not available", text)


def code_hash(module: str) -> str:
    """Hash of a part's source files (a package folder or one module), to key cached outputs."""
    here = Path(__file__).parent
    folder, single = here / module, here / f"{module}.py"
    files = sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
        if folder.is_dir() else [single] if single.is_file() else []
    h = hashlib.sha256()
    for path in files:
        h.update(path.relative_to(here).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def call_records(cache, key: list, module: str, func: str, *args, extra=("standalone", "filename")) -> list:
    """``call`` for a part whose result is a list of dataclass records, cached on disk under
    ``key`` (the caller lists every input the part reads) plus the part's own code. Records come
    back as plain namespaces with the same attributes."""

    def record(r) -> dict:
        out = dataclasses.asdict(r) if dataclasses.is_dataclass(r) else dict(vars(r))
        for prop in extra:  # computed properties (e.g. a diagram's standalone file) are kept too
            value = getattr(r, prop, None)
            if isinstance(value, str):
                out[prop] = value
        return out

    def make():
        return [record(r) for r in call(module, func, *args)]

    return [SimpleNamespace(**r) for r in cache.get("parts", [module, func, code_hash(module), *key], make)]
