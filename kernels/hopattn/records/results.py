"""The benchmark results files (bench/results/<gpu-slug>.json): schema, validation, the written
form, merging a run into a file, and the index the site reads them through.

Two sections of entries, one per pass. ``results``: the forward (each stage of kernels/attention
and each peer, per shape and mask). ``backward`` (schema 2 on): the backward alone, each stage of
kernels/attention_backward (its deterministic mode, where it has one, an entry of its own) and each
peer's backward, with the same fields plus ``deterministic`` (the mode timed), ``rel_errs`` (dq, dk,
dv against float64) and ``vs_default`` (a deterministic entry's speed over its stage's default mode,
in the same run); its TFLOP/s count 2.5x the forward's FLOPs (shapes.backward_flops). A reader of
the forward reads ``results`` only and never meets a backward entry. Files of schema 1 (no
``backward``) are still read; every file written is of the current schema.

The benchmark harness writes these files and the site generator reads them; both go through this
module, so the format lives in one place. It imports only the standard library, so the site
builds on machines without torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import files
from .fields import Checker, is_int, is_num, is_text, nonneg_num, pos_int, pos_num
from .shapes import KNOWN_SHAPES

SCHEMA_VERSION = 2  # 2: the backward section
READABLE_VERSIONS = (1, 2)
TOP_LEVEL = {1: ("schema_version", "gpu", "runs", "results"), 2: ("schema_version", "gpu", "runs", "results", "backward")}

KINDS = ("stage", "peer")
PEERS = ("fa3", "fa4", "cudnn", "fa2", "flex", "efficient")
REFERENCES = ("fa3", "fa4", "cudnn")  # each entry's ratios: its speed over theirs, measured in the same run
# The backward's peers; every backward entry's ratios are against each of them timed in the same run.
BACKWARD_PEERS = ("fa3", "fa4", "cudnn", "fa2")
BACKWARD_REFERENCES = BACKWARD_PEERS
GRADIENTS = ("dq", "dk", "dv")  # a backward entry's rel_errs; its rel_err is the largest of them
STATUSES = ("ok", "wrong", "skipped", "missing", "failed")
TIMING_FIELDS = ("median_ms", "min_ms", "max_ms", "spread_pct", "samples", "tflops", "ratios")

_SLUG_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_RUN_ID_RE = re.compile(r"^\d{8}T\d{6}Z$")
_DATE_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_HASH_RE = re.compile(r"^[0-9a-f]{16}$")
_STAGE_NAME_RE = re.compile(r"^\d\d$")
_SHAPE_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


class ResultsError(ValueError):
    """A results file (or data about to become one) is invalid; the message names the file and field."""


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200': lower case, runs of non-alphanumerics become one '-'."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not slug:
        raise ValueError(f"GPU name {name!r} has no letters or digits to make a slug from")
    return slug


def entry_key(entry: dict) -> tuple:
    """The identity of a result: a later run's entry with the same key replaces it."""
    return (entry["kind"], entry["name"], entry["shape"], entry["causal"])


def backward_key(entry: dict) -> tuple:
    """The identity of a backward entry: as entry_key, and the mode (a stage's deterministic mode
    is an entry of its own)."""
    return (entry["kind"], entry["name"], entry["deterministic"], entry["shape"], entry["causal"])


def is_stale(entry: dict, current_hash: str) -> bool:
    """True when a stage entry was measured on sources other than the stage's current ones
    (``current_hash``: the stage's source_hash() now)."""
    if entry.get("kind") != "stage" or entry.get("source_hash") is None:
        return False
    return entry["source_hash"] != current_hash


# --- validation --------------------------------------------------------------------------------


def _check_clocks(c: Checker, env: dict, key: str, field: str) -> None:
    clocks = c.get(env, key, field, "an object with sm_mhz and mem_mhz, or null",
                   lambda v: isinstance(v, dict), nullable=True)
    if clocks is None:
        return
    for k in ("sm_mhz", "mem_mhz"):
        c.get(clocks, k, f"{field}.{k}", "a non-negative integer or null",
              lambda v: is_int(v) and v >= 0, nullable=True)


def _check_run(c: Checker, run_id: str, run) -> None:
    f = f"runs.{run_id}"
    if not _RUN_ID_RE.match(run_id):
        raise c.fail(f, "keyed by a run id like 20261129T153000Z", run_id)
    if not isinstance(run, dict):
        raise c.fail(f, "an object", run)
    c.get(run, "date", f"{f}.date", "a UTC date like 2026-11-29T15:30:00Z",
          lambda v: isinstance(v, str) and bool(_DATE_RE.match(v)))
    # null when the run happened outside a git checkout (e.g. a copied working tree)
    c.get(run, "git_commit", f"{f}.git_commit", "40 lower-case hex digits or null",
          lambda v: isinstance(v, str) and bool(_COMMIT_RE.match(v)), nullable=True)
    c.get(run, "git_dirty", f"{f}.git_dirty", "true, false or null", lambda v: isinstance(v, bool), nullable=True)
    c.get(run, "command", f"{f}.command", "a non-empty string", is_text)
    env = c.get(run, "environment", f"{f}.environment", "an object", lambda v: isinstance(v, dict))
    e = f"{f}.environment"
    c.get(env, "gpu_name", f"{e}.gpu_name", "a non-empty string", is_text)
    c.get(env, "compute_capability", f"{e}.compute_capability", "a string like '9.0'",
          lambda v: isinstance(v, str) and bool(re.match(r"^\d+\.\d+$", v)))
    c.get(env, "sm_count", f"{e}.sm_count", "a positive integer", pos_int)
    for k in ("driver", "cuda", "cudnn"):
        c.get(env, k, f"{e}.{k}", "a non-empty string or null", is_text, nullable=True)
    c.get(env, "torch", f"{e}.torch", "a non-empty string", is_text)
    _check_clocks(c, env, "clocks_before", f"{e}.clocks_before")
    _check_clocks(c, env, "clocks_after", f"{e}.clocks_after")
    c.get(env, "max_sm_mhz", f"{e}.max_sm_mhz", "a positive integer or null", pos_int, nullable=True)
    c.get(env, "power_limit_w", f"{e}.power_limit_w", "a positive number or null", pos_num, nullable=True)


def _check_entry(c: Checker, i: int, entry, run_ids, section: str = "results") -> None:
    f = f"{section}[{i}]"
    backward = section == "backward"
    peers, references = (BACKWARD_PEERS, BACKWARD_REFERENCES) if backward else (PEERS, REFERENCES)
    if not isinstance(entry, dict):
        raise c.fail(f, "an object", entry)
    kind = c.get(entry, "kind", f"{f}.kind", f"one of {', '.join(KINDS)}", lambda v: v in KINDS)
    if kind == "stage":
        c.get(entry, "name", f"{f}.name", "a two-digit stage number like '01'",
              lambda v: isinstance(v, str) and bool(_STAGE_NAME_RE.match(v)))
        c.get(entry, "source_hash", f"{f}.source_hash", "16 lower-case hex digits (stage entries)",
              lambda v: isinstance(v, str) and bool(_HASH_RE.match(v)))
    else:
        c.get(entry, "name", f"{f}.name", f"one of {', '.join(peers)}", lambda v: v in peers)
        c.get(entry, "source_hash", f"{f}.source_hash", "null (peer entries)", lambda v: False, nullable=True)
    c.get(entry, "label", f"{f}.label", "a non-empty string", is_text)
    c.get(entry, "run_id", f"{f}.run_id", "the id of a run in 'runs'", lambda v: v in run_ids)
    c.get(entry, "shape", f"{f}.shape", "a shape name like '8k'",
          lambda v: isinstance(v, str) and bool(_SHAPE_RE.match(v)))
    for k in ("batch", "heads", "len_q", "len_k", "head_dim"):
        c.get(entry, k, f"{f}.{k}", "a positive integer", pos_int)
    c.get(entry, "causal", f"{f}.causal", "true or false", lambda v: isinstance(v, bool))
    status = c.get(entry, "status", f"{f}.status", f"one of {', '.join(STATUSES)}", lambda v: v in STATUSES)
    if status == "ok":
        c.get(entry, "reason", f"{f}.reason", "null when status is ok", lambda v: False, nullable=True)
        for k in ("median_ms", "min_ms", "max_ms"):
            c.get(entry, k, f"{f}.{k}", "a positive number when status is ok", pos_num)
        # non-negative only: a tiny test shape rounds to 0.0 at one decimal
        c.get(entry, "tflops", f"{f}.tflops", "a non-negative number when status is ok", nonneg_num)
        c.get(entry, "spread_pct", f"{f}.spread_pct", "a non-negative number when status is ok", nonneg_num)
        c.get(entry, "samples", f"{f}.samples", "a positive integer when status is ok", pos_int)
        c.get(entry, "rel_err", f"{f}.rel_err", "a non-negative number when status is ok", nonneg_num)
        if not entry["min_ms"] <= entry["median_ms"] <= entry["max_ms"]:
            raise c.fail(f"{f}.median_ms", "between min_ms and max_ms", entry["median_ms"])
        ratios = c.get(entry, "ratios", f"{f}.ratios", f"an object keyed by references ({', '.join(references)})",
                       lambda v: isinstance(v, dict) and all(k in references for k in v))
        for k, v in ratios.items():
            if not pos_num(v):
                raise c.fail(f"{f}.ratios.{k}", "a positive number", v)
    else:
        c.get(entry, "reason", f"{f}.reason", f"a non-empty string saying why the status is {status}", is_text)
        for k in TIMING_FIELDS:
            c.get(entry, k, f"{f}.{k}", f"null when status is {status}", lambda v: False, nullable=True)
        # a wrong kernel keeps its measured error: it is the most useful number about it
        c.get(entry, "rel_err", f"{f}.rel_err", "a non-negative number or null", nonneg_num, nullable=True)
    if backward:
        _check_backward_fields(c, f, entry, kind, status)


def _check_backward_fields(c: Checker, f: str, entry: dict, kind: str, status: str) -> None:
    """What a backward entry has beyond a forward one: its mode, the error of each gradient, and a
    deterministic mode's speed over its stage's default mode."""
    deterministic = c.get(entry, "deterministic", f"{f}.deterministic", "true or false",
                          lambda v: isinstance(v, bool))
    ok = status == "ok"

    def errs_ok(v):
        return isinstance(v, dict) and set(v) == set(GRADIENTS) and all(
            nonneg_num(x) or (x is None and not ok) for x in v.values())

    errs = c.get(entry, "rel_errs", f"{f}.rel_errs",
                 "an object of dq, dk and dv, each a non-negative number" if ok else
                 "null, or an object of dq, dk and dv, each a non-negative number or null", errs_ok, nullable=not ok)
    if errs is not None and entry.get("rel_err") is not None:
        worst = max((x for x in errs.values() if x is not None), default=None)
        if worst is not None and not math.isclose(entry["rel_err"], worst, rel_tol=1e-2):
            raise c.fail(f"{f}.rel_err", f"the largest of rel_errs ({worst!r})", entry["rel_err"])
    if kind == "stage" and deterministic and ok:
        c.get(entry, "vs_default", f"{f}.vs_default", "a positive number or null (a deterministic mode timed)",
              pos_num, nullable=True)
    else:
        c.get(entry, "vs_default", f"{f}.vs_default", "null unless a stage's deterministic mode was timed",
              lambda v: False, nullable=True)


def validate(data, where: str = "<results>") -> dict:
    """Raise ResultsError (naming `where` and the field) unless `data` follows the results schema."""
    c = Checker(where, ResultsError)
    if not isinstance(data, dict):
        raise c.fail("<top level>", "an object", data)
    version = c.get(data, "schema_version", "schema_version",
                    " or ".join(str(v) for v in READABLE_VERSIONS), lambda v: is_int(v) and v in READABLE_VERSIONS)
    c.get(data, "gpu", "gpu", "a GPU slug like 'nvidia-h200'", lambda v: isinstance(v, str) and bool(_SLUG_RE.match(v)))
    runs = c.get(data, "runs", "runs", "an object keyed by run id", lambda v: isinstance(v, dict))
    for run_id in sorted(runs):
        _check_run(c, run_id, runs[run_id])
    sections = [("results", entry_key, "(kind, name, shape, causal)")]
    if version >= 2:
        sections.append(("backward", backward_key, "(kind, name, deterministic, shape, causal)"))
    for section, key_of, unique in sections:
        entries = c.get(data, section, section, "a list", lambda v: isinstance(v, list))
        seen = {}
        for i, entry in enumerate(entries):
            _check_entry(c, i, entry, runs, section)
            key = key_of(entry)
            if key in seen:
                raise c.fail(f"{section}[{i}]", f"unique by {unique}; {section}[{seen[key]}] has the same", list(key))
            seen[key] = i
    extra = sorted(set(data) - set(TOP_LEVEL[version]))
    if extra:
        raise c.fail(extra[0], "absent (unknown top-level field)" if extra[0] != "backward" else
                     "absent in a file of schema_version 1 (the backward section came with 2)", data[extra[0]])
    return data


# --- normalisation and I/O ---------------------------------------------------------------------


def _sig(x: float, digits: int) -> float:
    return float(f"{x:.{digits}g}")


def _rounded_entry(entry: dict) -> dict:
    out = dict(entry)
    for k in ("median_ms", "min_ms", "max_ms"):
        if out.get(k) is not None:
            out[k] = round(float(out[k]), 4)
    if out.get("tflops") is not None:
        out["tflops"] = round(float(out["tflops"]), 1)
    if out.get("spread_pct") is not None:
        out["spread_pct"] = round(float(out["spread_pct"]), 2)
    if out.get("rel_err") is not None:
        out["rel_err"] = _sig(float(out["rel_err"]), 3)
    if out.get("ratios") is not None:
        out["ratios"] = {k: round(float(v), 3) for k, v in out["ratios"].items()}
    if out.get("rel_errs") is not None:
        out["rel_errs"] = {k: None if v is None else _sig(float(v), 3) for k, v in out["rel_errs"].items()}
    if out.get("vs_default") is not None:
        out["vs_default"] = round(float(out["vs_default"]), 3)
    return out


def _sort_key(entry: dict) -> tuple:
    return (entry["kind"], entry["name"], entry["shape"], entry["causal"])


def _backward_sort_key(entry: dict) -> tuple:
    return (entry["kind"], entry["name"], entry["deterministic"], entry["shape"], entry["causal"])


def normalize(data: dict) -> dict:
    """Fixed precision and a fixed order of results (the written form of `data`). The schema
    version stays as it is: a file of schema 1 read and written back is byte for byte the same."""
    out = dict(data)
    out["results"] = sorted((_rounded_entry(e) for e in data["results"]), key=_sort_key)
    if data.get("backward") is not None:
        out["backward"] = sorted((_rounded_entry(e) for e in data["backward"]), key=_backward_sort_key)
    if out.get("runs") is not None:
        runs = {}
        for rid, run in data["runs"].items():
            run = dict(run)
            env = run.get("environment")
            if isinstance(env, dict) and is_num(env.get("power_limit_w")):
                run["environment"] = dict(env, power_limit_w=round(float(env["power_limit_w"]), 2))
            runs[rid] = run
        out["runs"] = runs
    return out


def to_json(data: dict) -> str:
    return files.dumps(data)


def load_results(path) -> dict:
    path = Path(path)
    data = files.read_json(path, ResultsError)
    validate(data, path)
    if data["gpu"] != path.stem:
        raise ResultsError(f"{path}: field 'gpu' must match the file name ({path.stem!r}) (got {data['gpu']!r})")
    return data


def load_all(results_dir) -> dict[str, dict]:
    """Every results file in `results_dir`, keyed by GPU slug; an absent folder gives {}. The model
    benchmarks' records (models-<gpu>.json, records/models.py) share the folder and are not these."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        return {}
    return {p.stem: load_results(p) for p in sorted(results_dir.glob("*.json")) if not p.name.startswith("models-")}


def dump_results(data: dict, path) -> None:
    """Validate, normalise and write atomically (a reader never sees a half-written file)."""
    path = Path(path)
    data = normalize(data)
    validate(data, path)
    files.write_atomic(path, to_json(data))


def merge(old: dict | None, new: dict) -> dict:
    """`new`'s entries replace those of `old` with the same key (entry_key; backward_key in the
    backward section); the rest stay. The result is of the current schema, whatever the versions
    of the two (a file of schema 1 has no backward entries).

    Runs no longer referenced by any entry are dropped so the file does not grow without bound.
    """
    if old is None:
        return {"schema_version": SCHEMA_VERSION, "gpu": new["gpu"], "runs": dict(new["runs"]),
                "results": list(new["results"]), "backward": list(new.get("backward") or [])}
    if old.get("gpu") != new.get("gpu"):
        raise ResultsError(f"cannot merge results of GPU {new.get('gpu')!r} into a file of GPU {old.get('gpu')!r}")
    replaced = {entry_key(e) for e in new["results"]}
    results = [e for e in old["results"] if entry_key(e) not in replaced] + list(new["results"])
    new_backward = list(new.get("backward") or [])
    replaced = {backward_key(e) for e in new_backward}
    backward = [e for e in old.get("backward") or [] if backward_key(e) not in replaced] + new_backward
    runs = dict(old["runs"])
    runs.update(new["runs"])
    used = {e["run_id"] for e in results + backward}
    runs = {rid: run for rid, run in runs.items() if rid in used}
    return {"schema_version": SCHEMA_VERSION, "gpu": new["gpu"], "runs": runs, "results": results,
            "backward": backward}


def new_results(gpu: str, run_id: str, run: dict, entries: list[dict], backward: list[dict] = ()) -> dict:
    """The results of one run, in the file's shape: the forward's entries and the backward's."""
    return {"schema_version": SCHEMA_VERSION, "gpu": gpu, "runs": {run_id: run}, "results": list(entries),
            "backward": list(backward)}


def write_merged(new: dict, path, log=print) -> Path:
    """Merge a run into the file at ``path`` (its entries replace theirs) and write it atomically.

    An unreadable existing file is left alone and the run goes to <name>.unmerged.json instead,
    so neither the old numbers nor the new ones are lost. Returns the path written.
    """
    path = Path(path)
    old = None
    if path.exists():
        try:
            old = load_results(path)
        except ResultsError as err:
            side = path.with_name(path.stem + ".unmerged.json")
            log(f"cannot merge into {path}: {err}")
            files.write_atomic(side, to_json(normalize(new)))
            log(f"this run's results went to {side}; fix or remove {path} and merge by hand")
            return side
    dump_results(merge(old, new), path)
    return path


# --- reading for display -----------------------------------------------------------------------

SHAPE_ORDER = ("4k", "8k", "16k")  # the harness's shapes, smallest first; the others follow
# in the order the harness declares them (the head-dim shapes by head dim), unknown names last by name
_DECLARED = {name: i for i, name in enumerate(KNOWN_SHAPES)}


@dataclass(frozen=True)
class GpuResults:
    """One GPU's validated results file, indexed by (kind, name, shape, causal); its backward
    entries apart, by (kind, name, deterministic, shape, causal)."""

    gpu: str
    data: dict
    by_key: dict
    backward_by_key: dict = field(default_factory=dict)

    @classmethod
    def of(cls, gpu: str, data: dict) -> GpuResults:
        return cls(gpu, data, {entry_key(e): e for e in data["results"]},
                   {backward_key(e): e for e in data.get("backward") or []})

    @property
    def backward_entries(self) -> list[dict]:
        """The backward section (empty for a file of schema 1)."""
        return list(self.data.get("backward") or [])

    def backward(self, kind: str, name: str, shape: str, causal: bool, deterministic: bool = False) -> dict | None:
        """A backward entry: kind "stage" (name "01": a stage of kernels/attention_backward) or
        "peer" (name in BACKWARD_PEERS); ``deterministic``: the stage's deterministic mode."""
        return self.backward_by_key.get((kind, name, deterministic, shape, causal))

    @property
    def gpu_name(self) -> str:
        for run in self.data["runs"].values():
            name = run.get("environment", {}).get("gpu_name")
            if name:
                return name
        return self.gpu

    def shapes(self) -> list[str]:
        found = {k[2] for k in self.by_key}
        known = [s for s in SHAPE_ORDER if s in found]
        return known + sorted(found - set(known), key=lambda s: (_DECLARED.get(s, len(_DECLARED)), s))

    def stage(self, stage_id: str, shape: str, causal: bool) -> dict | None:
        return self.by_key.get(("stage", stage_id, shape, causal))

    def peer(self, name: str, shape: str, causal: bool) -> dict | None:
        return self.by_key.get(("peer", name, shape, causal))

    def ok_stage_count(self) -> int:
        return sum(1 for e in self.data["results"] if e["kind"] == "stage" and e["status"] == "ok")


def load_indexed(results_dir) -> list[GpuResults]:
    """Every GPU's results under ``results_dir``, the one with the most measured stages first."""
    indexed = [GpuResults.of(gpu, data) for gpu, data in sorted(load_all(results_dir).items())]
    return sorted(indexed, key=lambda r: -r.ok_stage_count())
