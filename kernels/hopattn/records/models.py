"""Reader, writer and validator of the model records (bench/results/models-<gpu-slug>.json).

``python -m bench.models`` writes them and the site's "In real models" page reads them; both go
through this module, so the format lives here only. Standard library only: the site builds without
torch. The shape of a record:

    {"schema_version": 1,
     "runs": {"20261201T101500Z": {"date", "git_commit", "dirty", "dry_run", "command",
                                   "environment": {"gpu_name", "compute_capability", "sm_count", "driver",
                                                   "cuda", "torch", "cudnn", "transformers", "diffusers",
                                                   "flash_attn_3", "flash_attn_4"}}},
     "models": {"wan2.1-t2v-14b": {
         "run": "<run id>", "label", "library", "config_source", "workload", "tokens": {name: int},
         "params": int | null, "build_s": float | null, "strict": bool,
         "attention_calls": [{"library", "batch", "q_heads", "kv_heads", "q_len", "k_len", "head_dim",
                              "causal", "layout", "dtype", "count", "reason": str | null}],
         "cases": {"sdpa" | "cudnn" | "hopattn" | "fa3" | "fa4": {
             "status": "ok" | "missing" | "failed" | "hang" | "refused", "message": str | null,
             "step_ms": {"median", "min", "max", "spread_pct", "samples"} | null,
             "attention_ms": float | null, "memory_gib": float | null,
             "speedup_step": float | null, "speedup_attention": float | null,   # SDPA's time / this one's
             "errors": {name: float | null},                                      # against the SDPA run
             "routing": {"calls", "served", "modes", "fallbacks", "strict", "kernel",
                         "backward", "deterministic"} | null}}}}}

Training workloads (``python -m bench.models --training``) use the same form: their errors are
rel_err_loss (against the SDPA run), rel_err_grads (every weight's gradient together),
rel_err_grads_attention (the attention modules' weights), rel_err_grads_worst (the worst single
tensor), the gradients against one step through SDPA's flash backend in the same process (runs before
20261202T233355Z compared them with SDPA's default run, and SDPA's case has none there),
and rel_err_grads_rerun (the backend's last timed step against its first). SDPA's case keeps its
gradient errors, not its loss's (against itself). routing's ``backward`` counts the served calls whose gradient the kernel's backward
computed, ``deterministic`` those of them through its deterministic backward (both optional: records
written before training have neither).

Sorted keys, fixed precision, checked on load and before every write, written atomically (the
checker, the GPU slug and the written form are the other records' own: fields.py, results.gpu_slug,
files.py). The run header is runs.new_run's, with its dirty flag named ``dirty`` and ``dry_run`` added.
"""

from __future__ import annotations

import re
from pathlib import Path

from . import files, runs
from .fields import Checker
from .fields import is_int as _int
from .fields import is_num as _num
from .fields import is_text as _text
from .results import gpu_slug

SCHEMA_VERSION = 1
BACKENDS = ("sdpa", "cudnn", "hopattn", "fa3", "fa4")  # the page's column order; "sdpa" is the reference
REFERENCE = "sdpa"
LIBRARIES = ("transformers", "diffusers")
STATUSES = ("ok", "missing", "failed", "hang", "refused")
LABELS = {"sdpa": "SDPA (default)", "cudnn": "SDPA cuDNN", "hopattn": "hopattn", "fa3": "FlashAttention-3",
          "fa4": "FlashAttention-4"}
ENV_FIELDS = ("gpu_name", "compute_capability", "sm_count", "driver", "cuda", "torch", "cudnn", "transformers",
              "diffusers", "flash_attn_3", "flash_attn_4")
SHAPE_FIELDS = ("library", "batch", "q_heads", "kv_heads", "q_len", "k_len", "head_dim", "causal", "layout",
                "dtype")

_RUN_ID_RE = re.compile(r"^\d{8}T\d{6}Z$")
_DATE_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_MODEL_RE = re.compile(r"^[a-z0-9]+(?:[.-][a-z0-9]+)*$")


class RecordError(ValueError):
    """A model record (or data about to become one) is invalid; the message names the file and field."""


def record_path(results_dir, gpu_name: str) -> Path:
    return Path(results_dir) / f"models-{gpu_slug(gpu_name)}.json"


# --- validation --------------------------------------------------------------------------------


def _check_timing(c: Checker, obj, f: str) -> None:
    t = c.get(obj, "step_ms", f"{f}.step_ms", "an object or null", lambda v: isinstance(v, dict), nullable=True)
    if t is None:
        return
    for k in ("median", "min", "max"):
        c.get(t, k, f"{f}.step_ms.{k}", "a positive number", lambda v: _num(v) and v > 0)
    c.get(t, "spread_pct", f"{f}.step_ms.spread_pct", "a non-negative number", lambda v: _num(v) and v >= 0)
    c.get(t, "samples", f"{f}.step_ms.samples", "a positive integer", lambda v: _int(v) and v > 0)
    if not t["min"] <= t["median"] <= t["max"]:
        raise RecordError(f"{c.where}: field '{f}.step_ms' must have min <= median <= max (got {t})")


def _check_routing(c: Checker, obj, f: str) -> None:
    r = c.get(obj, "routing", f"{f}.routing", "an object or null", lambda v: isinstance(v, dict), nullable=True)
    if r is None:
        return
    calls = c.get(r, "calls", f"{f}.routing.calls", "a non-negative integer", lambda v: _int(v) and v >= 0)
    served = c.get(r, "served", f"{f}.routing.served", "a non-negative integer", lambda v: _int(v) and v >= 0)
    c.get(r, "strict", f"{f}.routing.strict", "a boolean", lambda v: isinstance(v, bool))
    c.get(r, "kernel", f"{f}.routing.kernel", "a name", _text)
    counts = lambda v: isinstance(v, dict) and all(_text(k) and _int(n) and n > 0 for k, n in v.items())  # noqa: E731
    modes = c.get(r, "modes", f"{f}.routing.modes", "an object of positive counts", counts)
    fallbacks = c.get(r, "fallbacks", f"{f}.routing.fallbacks", "an object of positive counts", counts)
    if sum(modes.values()) != served or served + sum(fallbacks.values()) != calls:
        raise RecordError(f"{c.where}: field '{f}.routing' must count every call once (calls {calls}, served "
                          f"{served}, modes {modes}, fallbacks {fallbacks})")
    upper = served
    for k in ("backward", "deterministic"):  # optional: a record from before training has neither
        if k in r:
            upper = c.get(r, k, f"{f}.routing.{k}", f"an integer from 0 to {upper}",
                          lambda v, top=upper: _int(v) and 0 <= v <= top)


def _check_case(c: Checker, name: str, case, f: str) -> None:
    if name not in BACKENDS:
        raise RecordError(f"{c.where}: field '{f}' must be one of the backends {', '.join(BACKENDS)}")
    if not isinstance(case, dict):
        raise RecordError(f"{c.where}: field '{f}' must be an object")
    status = c.get(case, "status", f"{f}.status", f"one of {', '.join(STATUSES)}", lambda v: v in STATUSES)
    c.get(case, "message", f"{f}.message", "a string or null", _text, nullable=True)
    _check_timing(c, case, f)
    for k in ("attention_ms", "memory_gib", "speedup_step", "speedup_attention"):
        c.get(case, k, f"{f}.{k}", "a non-negative number or null", lambda v: _num(v) and v >= 0, nullable=True)
    errors = c.get(case, "errors", f"{f}.errors", "an object of numbers or nulls", lambda v: isinstance(v, dict))
    for k, v in errors.items():
        if not _text(k) or not (v is None or (_num(v) and v >= 0)):
            raise RecordError(f"{c.where}: field '{f}.errors.{k}' must be a non-negative number or null (got {v!r})")
    _check_routing(c, case, f)
    if status == "ok" and case["step_ms"] is None:
        raise RecordError(f"{c.where}: field '{f}.step_ms' must be set when status is 'ok'")
    if status != "ok" and case["message"] is None:
        raise RecordError(f"{c.where}: field '{f}.message' must say why the case is '{status}'")


def _check_model(c: Checker, key: str, model, runs: dict) -> None:
    f = f"models.{key}"
    if not _MODEL_RE.match(key):
        raise RecordError(f"{c.where}: field '{f}' must be a lower-case id like 'wan2.1-t2v-14b'")
    c.get(model, "run", f"{f}.run", "the id of an entry of 'runs'", lambda v: v in runs)
    for k in ("label", "config_source", "workload"):
        c.get(model, k, f"{f}.{k}", "a non-empty string", _text)
    c.get(model, "library", f"{f}.library", f"one of {', '.join(LIBRARIES)}", lambda v: v in LIBRARIES)
    c.get(model, "strict", f"{f}.strict", "a boolean", lambda v: isinstance(v, bool))
    c.get(model, "tokens", f"{f}.tokens", "an object of positive integers",
           lambda v: isinstance(v, dict) and bool(v) and all(_text(k) and _int(n) and n > 0 for k, n in v.items()))
    c.get(model, "params", f"{f}.params", "a positive integer or null", lambda v: _int(v) and v > 0, nullable=True)
    c.get(model, "build_s", f"{f}.build_s", "a non-negative number or null", lambda v: _num(v) and v >= 0,
           nullable=True)
    calls = c.get(model, "attention_calls", f"{f}.attention_calls", "a list", lambda v: isinstance(v, list))
    for i, call in enumerate(calls):
        g = f"{f}.attention_calls[{i}]"
        for k in ("batch", "q_heads", "kv_heads", "q_len", "k_len", "head_dim", "count"):
            c.get(call, k, f"{g}.{k}", "a positive integer", lambda v: _int(v) and v > 0)
        c.get(call, "causal", f"{g}.causal", "a boolean", lambda v: isinstance(v, bool))
        for k in ("library", "layout", "dtype"):
            c.get(call, k, f"{g}.{k}", "a non-empty string", _text)
        c.get(call, "reason", f"{g}.reason", "a string or null", _text, nullable=True)
    cases = c.get(model, "cases", f"{f}.cases", "an object with at least one backend",
                   lambda v: isinstance(v, dict) and bool(v))
    for name, case in cases.items():
        _check_case(c, name, case, f"{f}.cases.{name}")


def validate(data, where: str = "<model record>") -> dict:
    c = Checker(where, RecordError)
    if not isinstance(data, dict):
        raise RecordError(f"{where}: the top level must be an object")
    c.get(data, "schema_version", "schema_version", f"{SCHEMA_VERSION}", lambda v: v == SCHEMA_VERSION)
    runs = c.get(data, "runs", "runs", "an object", lambda v: isinstance(v, dict))
    for run_id, run in runs.items():
        f = f"runs.{run_id}"
        if not _RUN_ID_RE.match(run_id):
            raise RecordError(f"{where}: field '{f}' must be named like 20261201T101500Z")
        c.get(run, "date", f"{f}.date", "a UTC time like 2026-12-01T10:15:00Z", lambda v: isinstance(v, str)
               and bool(_DATE_RE.match(v)))
        c.get(run, "git_commit", f"{f}.git_commit", "a 40-digit hash or null",
               lambda v: isinstance(v, str) and bool(_COMMIT_RE.match(v)), nullable=True)
        c.get(run, "dirty", f"{f}.dirty", "a boolean or null", lambda v: isinstance(v, bool), nullable=True)
        c.get(run, "dry_run", f"{f}.dry_run", "a boolean", lambda v: isinstance(v, bool))
        c.get(run, "command", f"{f}.command", "a non-empty string", _text)
        env = c.get(run, "environment", f"{f}.environment", "an object", lambda v: isinstance(v, dict))
        for k in ENV_FIELDS:
            if k == "sm_count":
                c.get(env, k, f"{f}.environment.{k}", "a positive integer or null", lambda v: _int(v) and v > 0,
                       nullable=True)
            else:
                c.get(env, k, f"{f}.environment.{k}", "a string or null", _text, nullable=True)
    models = c.get(data, "models", "models", "an object", lambda v: isinstance(v, dict))
    for key, model in models.items():
        _check_model(c, key, model, runs)
    return data


# --- precision, reading, writing ------------------------------------------------------------------


def _sig(x, digits: int):
    return None if x is None else float(f"{float(x):.{digits}g}")


def _fixed(x, places: int):
    return None if x is None else round(float(x), places)


def _rounded_case(case: dict) -> dict:
    out = dict(case)
    if out.get("step_ms"):
        t = dict(out["step_ms"])
        for k in ("median", "min", "max"):
            t[k] = _fixed(t[k], 3)
        t["spread_pct"] = _fixed(t["spread_pct"], 2)
        out["step_ms"] = t
    out["attention_ms"] = _fixed(out.get("attention_ms"), 3)
    out["memory_gib"] = _fixed(out.get("memory_gib"), 2)
    out["speedup_step"] = _fixed(out.get("speedup_step"), 3)
    out["speedup_attention"] = _fixed(out.get("speedup_attention"), 3)
    out["errors"] = {k: _sig(v, 3) for k, v in (out.get("errors") or {}).items()}
    return out


def normalize(data: dict) -> dict:
    """Fixed precision everywhere; runs that no model refers to any more are dropped."""
    out = dict(data)
    models = {}
    for key, model in data["models"].items():
        m = dict(model)
        m["build_s"] = _fixed(m.get("build_s"), 1)
        m["cases"] = {name: _rounded_case(case) for name, case in model["cases"].items()}
        m["attention_calls"] = sorted(model["attention_calls"], key=lambda a: [str(a[k]) for k in SHAPE_FIELDS])
        models[key] = m
    out["models"] = models
    used = {m["run"] for m in models.values()}
    out["runs"] = {k: v for k, v in data["runs"].items() if k in used}
    return out


def to_json(data: dict) -> str:
    return files.dumps(data)


def load(path) -> dict:
    path = Path(path)
    return validate(files.read_json(path, RecordError), str(path))


def load_all(results_dir) -> dict[str, dict]:
    """Every models-*.json under results_dir, by GPU slug."""
    return {p.stem.removeprefix("models-"): load(p) for p in sorted(Path(results_dir).glob("models-*.json"))}


def merge(old: dict | None, new: dict) -> dict:
    """``new``'s models replace those of ``old`` with the same id; the other models stay."""
    if old is None:
        return new
    return {"schema_version": SCHEMA_VERSION, "runs": {**old["runs"], **new["runs"]},
            "models": {**old["models"], **new["models"]}}


def new_run(command: str, environment: dict, *, dry_run: bool, date: str | None = None,
            git: tuple[str | None, bool | None] | None = None) -> dict:
    """A run of this format: runs.new_run's header, its dirty flag named ``dirty``, and ``dry_run``."""
    run = runs.new_run(command, environment, date=date, git=git)
    run["dirty"] = run.pop("git_dirty")
    run["dry_run"] = bool(dry_run)
    return run


def dump(data: dict, path) -> None:
    """Validate, normalize and write atomically (a crash leaves the old file, never half a new one)."""
    path = Path(path)
    data = normalize(validate(data, str(path)))
    validate(data, str(path))
    files.write_atomic(path, to_json(data))
