"""Reading bench/results/*.json for the site, behind one function: ``load_all(results_dir)``.

The project's reader is hopattn.results (owned by the benchmark harness); until it exists this
module validates the files itself, just enough for the pages, with errors that name the file, the
field and what was expected. Switching over is the single import in ``load_all``.
"""

from __future__ import annotations

import json
from pathlib import Path

SCHEMA_VERSION = 1
STATUSES = ("ok", "wrong", "skipped", "missing", "failed")


class ResultsError(ValueError):
    """A results file is invalid; the message names the file and the field."""


def load_all(results_dir: Path) -> dict[str, dict]:
    """gpu slug -> validated results file, for every *.json under ``results_dir`` (none: {})."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        return {}
    try:
        from hopattn import results as project_reader  # the harness's reader, once it lands
    except ImportError:
        project_reader = None
    if project_reader is not None and hasattr(project_reader, "load_all"):
        return project_reader.load_all(results_dir)
    return {data["gpu"]: data for data in map(load_file, sorted(results_dir.glob("*.json")))}


def _fail(path: Path, field: str, expected: str, got=...) -> ResultsError:
    tail = "" if got is ... else f" (got {got!r})"
    return ResultsError(f"{path}: field '{field}' must be {expected}{tail}")


def _need(path, obj, key, kind, expected, where=""):
    if key not in obj:
        raise _fail(path, where + key, expected, "<missing>")
    value = obj[key]
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise _fail(path, where + key, expected, value)
    return value


def load_file(path: Path) -> dict:
    """One results file, checked for the fields the site reads."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ResultsError(f"{path}: not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise _fail(path, "<top level>", "an object", type(data).__name__)
    if data.get("schema_version") != SCHEMA_VERSION:
        raise _fail(path, "schema_version", str(SCHEMA_VERSION), data.get("schema_version", "<missing>"))
    _need(path, data, "gpu", str, "the GPU slug (a string)")
    runs = _need(path, data, "runs", dict, "an object of run id -> run")
    for run_id, run in runs.items():
        where = f"runs.{run_id}."
        if not isinstance(run, dict):
            raise _fail(path, f"runs.{run_id}", "an object", run)
        _need(path, run, "date", str, "an ISO date string", where)
        _need(path, run, "environment", dict, "an object", where)
    for i, entry in enumerate(_need(path, data, "results", list, "a list of entries")):
        where = f"results[{i}]."
        if not isinstance(entry, dict):
            raise _fail(path, f"results[{i}]", "an object", entry)
        kind = _need(path, entry, "kind", str, "'stage' or 'peer'", where)
        if kind not in ("stage", "peer"):
            raise _fail(path, where + "kind", "'stage' or 'peer'", kind)
        _need(path, entry, "name", str, "a string", where)
        _need(path, entry, "shape", str, "a shape name such as '4k'", where)
        _need(path, entry, "causal", bool, "true or false", where)
        status = _need(path, entry, "status", str, f"one of {', '.join(STATUSES)}", where)
        if status not in STATUSES:
            raise _fail(path, where + "status", f"one of {', '.join(STATUSES)}", status)
        if _need(path, entry, "run_id", str, "a run id", where) not in runs:
            raise _fail(path, where + "run_id", "a key of 'runs'", entry["run_id"])
        if kind == "stage":
            _need(path, entry, "source_hash", str, "the stage's source hash (a string)", where)
        if status == "ok":
            for key in ("tflops", "median_ms"):
                _need(path, entry, key, float, "a number when status is 'ok'", where)
            ratios = entry.get("ratios") or {}
            if not isinstance(ratios, dict) or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) for v in ratios.values()):
                raise _fail(path, where + "ratios", "an object of reference -> number", ratios)
    return data
