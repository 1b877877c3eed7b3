"""The records of Part II's benchmark (python -m bench.rowwise): bench/results/<op>/<gpu>.json, one
file per operator and GPU (bench/results/rmsnorm/nvidia-h200.json), apart from the attention results.

A file holds one run: ``schema_version``, ``op``, ``gpu`` (the slug of the file's name), ``run``
(hopattn.records.runs: date, commit, dirty flag, command, environment) and ``entries``, one per arm
and row length: ``size`` ('4k' ... '256k'), ``rows``, ``cols``, ``dtype``, ``arm`` ('copy', 'stage 04',
'eager', 'compile', 'liger', 'quack'), ``kind`` (ceiling, stage, peer), ``bytes`` (x read + out written),
``status`` (ok, missing, error; ``reason`` when not ok) and, when ok, ``median_ms``, ``spread_pct``,
``gbps`` and ``vs`` (the arm's speed over each other arm of the same run, > 1 faster); a stage entry
carries its ``source_hash``. This module reads and checks them (the site never writes them): a bad
file is a RowResultsError naming the file and the field. Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from . import files
from .fields import Checker, is_num, is_text, nonneg_num, pos_int, pos_num

SCHEMA_VERSION = 1
KINDS = ("ceiling", "stage", "peer")
STATUSES = ("ok", "missing", "error")
SIZE_ORDER = ("4k", "8k", "16k", "32k", "64k", "128k", "256k")
# The benchmark's shapes, size -> (rows, columns): each moves at least 64 MB of bf16 (python -m
# bench.rowwise times them; the site's figures draw a row of each).
SIZES = {"4k": (32768, 4096), "8k": (32768, 8192), "16k": (16384, 16384), "64k": (4096, 65536),
         "256k": (1024, 262144)}
_STAGE_ARM_RE = re.compile(r"^stage \d\d$")
_HASH_RE = re.compile(r"^[0-9a-f]{16}$")
_DATE_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


class RowResultsError(ValueError):
    """A rowwise results file is invalid; the message names the file and the field."""


def _check_entry(c: Checker, i: int, e) -> None:
    f = f"entries[{i}]"
    if not isinstance(e, dict):
        raise c.fail(f, "an object", e)
    c.get(e, "size", f"{f}.size", "a row length like '4k'", is_text)
    c.get(e, "cols", f"{f}.cols", "a positive integer", pos_int)
    c.get(e, "rows", f"{f}.rows", "a positive integer", pos_int)
    c.get(e, "bytes", f"{f}.bytes", "a positive integer", pos_int)
    kind = c.get(e, "kind", f"{f}.kind", f"one of {', '.join(KINDS)}", lambda v: v in KINDS)
    arm = c.get(e, "arm", f"{f}.arm", "a non-empty string", is_text)
    if kind == "stage":
        if not _STAGE_ARM_RE.match(arm):
            raise c.fail(f"{f}.arm", "'stage NN' for a stage entry", arm)
        c.get(e, "source_hash", f"{f}.source_hash", "16 lower-case hex digits (stage entries)",
              lambda v: isinstance(v, str) and bool(_HASH_RE.match(v)))
    status = c.get(e, "status", f"{f}.status", f"one of {', '.join(STATUSES)}", lambda v: v in STATUSES)
    if status != "ok":
        c.get(e, "reason", f"{f}.reason", "why it did not run (a string)", is_text)
        return
    c.get(e, "median_ms", f"{f}.median_ms", "a positive number", pos_num)
    c.get(e, "gbps", f"{f}.gbps", "a positive number", pos_num)
    c.get(e, "spread_pct", f"{f}.spread_pct", "a number >= 0", nonneg_num)
    c.get(e, "vs", f"{f}.vs", "an object of arm -> ratio",
          lambda v: isinstance(v, dict) and all(isinstance(k, str) and is_num(x) and x > 0 for k, x in v.items()))
    if "max_rel_err" in e:
        c.get(e, "max_rel_err", f"{f}.max_rel_err", "a number >= 0 or null", nonneg_num, nullable=True)


def validate(data, where="<rowwise results>") -> dict:
    c = Checker(where, RowResultsError)
    if not isinstance(data, dict):
        raise c.fail("<top level>", "an object", data)
    c.get(data, "schema_version", "schema_version", str(SCHEMA_VERSION), lambda v: v == SCHEMA_VERSION)
    c.get(data, "op", "op", "the operator's name (a string)", is_text)
    c.get(data, "gpu", "gpu", "the GPU's slug (a string)", is_text)
    run = c.get(data, "run", "run", "an object", lambda v: isinstance(v, dict))
    c.get(run, "date", "run.date", "a UTC date like 2026-11-29T15:30:00Z",
          lambda v: isinstance(v, str) and bool(_DATE_RE.match(v)))
    c.get(run, "git_commit", "run.git_commit", "40 lower-case hex digits or null",
          lambda v: isinstance(v, str) and bool(re.match(r"^[0-9a-f]{40}$", v)), nullable=True)
    env = c.get(run, "environment", "run.environment", "an object", lambda v: isinstance(v, dict))
    c.get(env, "gpu_name", "run.environment.gpu_name", "a non-empty string", is_text)
    entries = c.get(data, "entries", "entries", "a list", lambda v: isinstance(v, list))
    for i, e in enumerate(entries):
        _check_entry(c, i, e)
    return data


@dataclass(frozen=True)
class RowResults:
    """One operator's run on one GPU, as the site reads it."""

    gpu: str  # the file's slug
    data: dict
    path: Path

    @property
    def gpu_name(self) -> str:
        return self.data["run"]["environment"]["gpu_name"]

    @property
    def run(self) -> dict:
        return self.data["run"]

    @property
    def entries(self) -> list[dict]:
        return self.data["entries"]

    def entry(self, arm: str, size: str) -> dict | None:
        return next((e for e in self.entries if e["arm"] == arm and e["size"] == size), None)

    def stage(self, number: int, size: str) -> dict | None:
        return self.entry(f"stage {number:02d}", size)

    def sizes(self) -> list[str]:
        found = {e["size"] for e in self.entries}
        return [s for s in SIZE_ORDER if s in found] + sorted(found - set(SIZE_ORDER))

    def ok_stage_count(self) -> int:
        return sum(1 for e in self.entries if e["kind"] == "stage" and e["status"] == "ok")


def load(path) -> RowResults:
    path = Path(path)
    data = validate(files.read_json(path, RowResultsError), path)
    return RowResults(path.stem, data, path)


def load_all(folder) -> list[RowResults]:
    """Every GPU's file in ``folder`` (bench/results/<op>/), the one with the most measured stages
    first; an absent folder gives []."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [load(p) for p in sorted(folder.glob("*.json"))]
    return sorted(found, key=lambda r: (-r.ok_stage_count(), r.gpu))


def is_stale(entry: dict, current_hash: str) -> bool:
    """True when a stage entry was measured on other sources than the stage's now."""
    return entry.get("kind") == "stage" and entry.get("source_hash") not in (None, current_hash)
