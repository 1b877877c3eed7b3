"""The trace records (bench/results/traces/<gpu-slug>/<NN>[-causal].json): what every warp of the
CTAs on one SM did, and when, in one launch of a stage built with its trace points on
(common/trace.cuh, recorded by common/trace_recorder.cuh; the producer is `python -m bench.trace`).
A record at a head dim other than 128 (stage 24's, `--head-dim`) names it: <NN>-d<head dim>[-causal].json.
The backward's (Act V) sit in a folder of their own, bench/results/traces/<gpu-slug>/backward/
<NN>[-causal].json: its stages number like the forward's (both have an 03), and the forward's
readers, which take every *.json of the GPU's folder, see nothing new. A backward record says so
("lineage"), names its events from BACKWARD_EVENTS (kernels/attention_backward/common/
trace_recorder_backward.cuh) and carries that recorder's hash; a forward record reads as before.

A record holds the run's provenance (date, commit, dirty flag, environment), the stage's source
hash and the recorder's (a record older than either is stale, as numbers are), the shape and mask, the
SM clock the cycles were converted with, the roles of the warps, a window of the steady state with
an output-tile boundary in it (every event of every traced warp that overlaps it), per-event
statistics over everything recorded, the median time per K/V step, and the traced build's
overhead on the kernel's time. Only the standard library: the site reads these without torch.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from .. import lineage
from . import files
from .fields import Checker, is_int, is_num, is_text, nonneg_num, pos_num

SCHEMA_VERSION = 1
RESULTS_DIR = Path(__file__).resolve().parents[3] / "bench" / "results" / "traces"
# The order of TraceEvent in kernels/attention/common/trace_recorder.cuh, from 1 (tests check they agree).
EVENTS = ("load_q", "load_k", "load_v", "load_kv", "wait_q", "wait_k", "wait_v", "wait_kv", "wait_empty",
          "wait_turn", "wait_tile", "qk", "wait_qk", "softmax", "rescale", "pv", "wait_pv", "epilogue", "store")
# What a K/V step is measured by: the start of each step's first GEMM, else of its load.
STEP_EVENTS = ("qk", "load_kv", "wait_kv", "load_k")
HEAD_DIM = 128  # every stage's figures' (stage.toml's [tile]); stage 24's others are recorded with --head-dim
WINDOW_STEPS = (5, 6)  # K/V steps before and after the tile boundary the window is centred on
EVENT_FIELDS = ("slot", "warp", "event", "tile", "kv", "start_ns", "end_ns")
# The backward's events: trace_bwd::TraceBackwardEvent in kernels/attention_backward/common/
# trace_recorder_backward.cuh, from BACKWARD_FIRST on (tests check they agree). Where a forward name
# says the same thing it is the same name (qk: Sᵀ = K Qᵀ, issued with dPᵀ = V dOᵀ; softmax: Pᵀ).
BACKWARD_FIRST = 32
BACKWARD_EVENTS = ("load_q", "load_do", "load_kv", "wait_kv", "wait_empty", "wait_qdo", "qk", "wait_qk", "softmax",
                   "wait_dp", "ds", "dvdk", "wait_ds_free", "store_ds", "wait_ds", "dq", "wait_dq", "wait_dvdk",
                   "wait_dq_read", "store_dq", "wait_turn", "add_dq", "wait_dq_done", "wait_step", "wait_dq_tile",
                   "store_dkdv")
BACKWARD = "attention_backward"  # a backward record's "lineage" (a forward record has none)


class TraceError(ValueError):
    """A trace record is invalid; the message names the file and the field."""


def folder(gpu_name: str, backward: bool = False) -> Path:
    """Where a GPU's trace records go: its folder, or for the backward's its backward/ folder."""
    from .results import gpu_slug

    return RESULTS_DIR / gpu_slug(gpu_name) / ("backward" if backward else "")


def backward_folder(gpu_folder) -> Path:
    """The backward's records of the GPU whose forward records are in ``gpu_folder``."""
    return Path(gpu_folder) / "backward"


def is_backward(record: dict) -> bool:
    return record.get("lineage") == BACKWARD


def events_of(record: dict) -> tuple[str, ...]:
    """The event names a record may hold: the forward's or the backward's."""
    return BACKWARD_EVENTS if is_backward(record) else EVENTS


def head_dim_of(record: dict) -> int:
    return record["shape"]["head_dim"]


def head_dim_tag(head_dim: int) -> str:
    """What names a record (and its figures) at a head dim other than HEAD_DIM: '-d256'; '' at HEAD_DIM."""
    return "" if head_dim == HEAD_DIM else f"-d{head_dim}"


def record_name(stage_id: str, causal: bool, head_dim: int = HEAD_DIM) -> str:
    """<NN>[-d<head dim>][-causal].json: head dim 128's records keep the names they had before stage 24."""
    return f"{stage_id}{head_dim_tag(head_dim)}{'-causal' if causal else ''}.json"


# --- from the device's buffers to a record -------------------------------------------------------


def _unwrap(lo: int, base: int) -> int:
    """A 32-bit clock reading, made whole against the full clock at the CTA's start."""
    return base + ((lo - (base & 0xFFFFFFFF)) & 0xFFFFFFFF)


def _signed(word: int) -> int:
    return word - (1 << 32) if word & 0x80000000 else word


# A step record of boundary stamps (common/trace_recorder.cuh): three rows, [0xff | tile << 8 | step << 20
# (12 bits each, all ones for -1), then one clock stamp per kind of STAMP_KINDS, and one for the
# step's earlier turn where it has two]; a stamp is an event's end (0: not seen since the warp's last
# step record). Its start is the end of the warp's event before it. The step labels are those of
# the record that stores it.
STAMP_MARK = 0xFF
STAMP_KINDS = ("wait_k", "wait_v", "wait_kv", "wait_turn", "qk", "wait_qk", "softmax", "rescale", "pv", "wait_pv")
STAMP_SLOTS = STAMP_KINDS + ("wait_turn",)  # the earlier of two turns


def _label(bits: int) -> int:
    return -1 if bits == 0xFFF else bits


def _name(event: int) -> str:
    """A record's event byte: the forward's TraceEvent from 1, the backward's from BACKWARD_FIRST."""
    if event >= BACKWARD_FIRST:
        return BACKWARD_EVENTS[event - BACKWARD_FIRST]
    return EVENTS[event - 1]


def _warp_events(rows, base: int, origin: int) -> list[list]:
    """One warp's records as [event, tile, kv, start, end] in cycles from origin, in order of end.
    A backward row whose start word is 0 is a boundary stamp, as a step record's stamps are (the
    backward's recorder stores each stamp in a row of its own)."""
    words = [tuple(int(x) & 0xFFFFFFFF for x in row) for row in rows]
    out = []
    k = 0
    while k < len(words) and words[k][0] & 0xFF:
        word0, word1, a, b = words[k]
        tile, kv = _signed(word0) >> 8, _signed(word1)
        if word0 & 0xFF == STAMP_MARK:
            tile, kv = _label((word0 >> 8) & 0xFFF), _label(word0 >> 20)
            stamps = [word1, a, b, *(w for row in words[k + 1:k + 3] for w in row)]
            for name, stamp in zip(STAMP_SLOTS, stamps):
                if stamp:
                    out.append([name, tile, kv, None, _unwrap(stamp, base) - origin])
            k += 3
            continue
        event = word0 & 0xFF
        stamp = event >= BACKWARD_FIRST and a == 0
        out.append([_name(event), tile, kv, None if stamp else _unwrap(a, base) - origin, _unwrap(b, base) - origin])
        k += 1
    out.sort(key=lambda e: e[4])
    previous_end = None
    for e in out:
        if e[3] is None:
            e[3] = e[4] if previous_end is None else previous_end
        previous_end = e[4]
    return out


def decode(records, bases, infos, clock_mhz: float) -> tuple[list[list], list[dict]]:
    """All events of all traced warps, as [slot, warp, event, tile, kv, start_ns, end_ns] with times
    from the earliest CTA start on the SM; and the CTAs (slot, block, sm, start_ns).
    `records`: [slots][warps][capacity][4] int32 as the kernel wrote them (event 0: unused)."""
    origin = min(int(b[0]) for b in bases)
    ns = 1000.0 / clock_mhz
    events = []
    for slot, per_warp in enumerate(records):
        base = int(bases[slot][0])
        for warp, rows in enumerate(per_warp):
            for event, tile, kv, t0, t1 in _warp_events(rows, base, origin):
                events.append([slot, warp, event, tile, kv, round(t0 * ns, 1), round(t1 * ns, 1)])
    events.sort(key=lambda e: (e[5], e[0], e[1]))
    ctas = [{"slot": s, "block": int(infos[s][0]), "sm": int(infos[s][1]),
             "start_ns": round((int(bases[s][0]) - origin) * ns, 1)} for s in range(len(bases))]
    return events, ctas


def step_ns(events: list[list]) -> float | None:
    """Median time between the starts of consecutive K/V steps of one warp within one tile."""
    for name in STEP_EVENTS:
        starts: dict[tuple, list[tuple[int, float]]] = {}
        for slot, warp, event, tile, kv, t0, _ in events:
            if event == name and kv >= 0:
                starts.setdefault((slot, warp, tile), []).append((kv, t0))
        gaps = []
        for seq in starts.values():
            seq.sort()
            gaps += [b[1] - a[1] for a, b in zip(seq, seq[1:]) if b[0] == a[0] + 1]
        if gaps:
            return statistics.median(gaps)
    return None


def window(events: list[list], per_step: float | None) -> tuple[float, float]:
    """A window of the steady state around slot 0's first tile boundary: centred on the first K/V
    step of its second output tile (persistent stages); else from before the end of its last step
    to after the first step of the next CTA on the SM, whatever the time between them (a CTA's
    epilogue and the next one's start are the boundary). Steps only: a producer loads the next
    tile's Q long before its consumers start it."""
    present = {e[2] for e in events}
    name = next((n for n in STEP_EVENTS if n in present), None)  # the GEMM where there is one
    steps = [e for e in events if e[0] == 0 and e[2] == name] or [e for e in events if e[0] == 0]
    before, after = WINDOW_STEPS
    step = per_step or (max(e[6] for e in events) - min(e[5] for e in events)) / 20
    later = [e[5] for e in steps if e[3] >= 1]
    if later:
        centre = min(later)
        return max(0.0, centre - before * step), centre + after * step
    last = max(e[6] for e in steps)
    following = [e[5] for e in events if e[0] != 0 and e[2] == name and e[5] >= last]
    return max(0.0, last - before * step), (min(following) if following else last) + after * step


def event_stats(events: list[list]) -> dict:
    by: dict[str, list[float]] = {}
    for e in events:
        by.setdefault(e[2], []).append(e[6] - e[5])
    return {name: {"count": len(d), "median_ns": round(statistics.median(d), 1), "total_ns": round(sum(d), 1)}
            for name, d in sorted(by.items())}


def roles(stage: lineage.Stage) -> list[str]:
    """The role of each warp of the CTA, from stage.toml. A backward role of several warpgroups
    (stage 03's eight compute warps) is one role per warpgroup (compute0, compute1), as the forward's
    stage.toml names its consumers: each warpgroup owns keys of its own and issues its own GEMMs."""
    names = [""] * (stage.threads // 32)
    for role in stage.roles:
        groups = sorted({w // 4 for w in role.warps})
        split = getattr(stage, "backward", False) and len(groups) > 1
        for w in role.warps:
            names[w] = f"{role.name}{groups.index(w // 4)}" if split else role.name
    return names


def recorder_hash(stage) -> str:
    """The hash of the recorder the stage's traced build uses (tokens, as a stage's): the forward's,
    or for a backward stage the backward's with the forward's it builds on."""
    if not getattr(stage, "backward", False):
        return lineage.trace_recorder_hash()
    from .. import build, source_identity

    return source_identity.digest([(p.name, source_identity.read(p)) for p in build.trace_recorder_files(stage)])


def from_device(stage: lineage.Stage, shape: dict, causal: bool, records, bases, infos, clock_mhz: float, *,
                plain_ms: float, traced_ms: float, idle_ms: float | None = None, light_step_ns: float | None = None,
                per_warp: int | None = None, pct_range: tuple[float, float] | None = None,
                idle_pct_range: tuple[float, float] | None = None, clock_from: str | None = None) -> dict:
    """The record (without its run) of one traced launch. idle_ms: the traced build recording nothing
    (its trace points alone); light_step_ns: the time per K/V step of the
    same launch with one record a step; per_warp: the records each warp had room for; pct_range,
    idle_pct_range: the lowest and highest overhead of the timing rounds (percent, same round);
    clock_from: where clock_mhz came from."""
    events, ctas = decode(records, bases, infos, clock_mhz)
    if not events:
        raise TraceError(f"stage {stage.id}: the traced launch recorded no event on the target SM")
    per_step = step_ns(events)
    start, end = window(events, per_step)
    shown = [[e[0], e[1], e[2], e[3], e[4], round(e[5] - start, 1), round(e[6] - start, 1)]
             for e in events if e[6] >= start and e[5] <= end]
    return {
        "schema_version": SCHEMA_VERSION,
        "stage": stage.id, "name": stage.name, "source_hash": stage.source_hash(),
        "recorder_hash": recorder_hash(stage),
        **({"lineage": BACKWARD} if getattr(stage, "backward", False) else {}),
        "shape": dict(shape), "causal": causal,
        "clock_mhz": round(clock_mhz, 1),
        **({"clock_from": clock_from} if clock_from else {}),
        "ctas": ctas, "roles": roles(stage),
        "window": {"start_ns": round(start, 1), "end_ns": round(end, 1)},
        "events": shown,
        "per_step_ns": round(per_step, 1) if per_step else None,
        "stats": event_stats(events),
        "recorded": len(events),
        "overhead": {"plain_ms": round(plain_ms, 4), "traced_ms": round(traced_ms, 4),
                     "pct": round((traced_ms / plain_ms - 1) * 100, 2),
                     **({"idle_ms": round(idle_ms, 4), "idle_pct": round((idle_ms / plain_ms - 1) * 100, 2)}
                        if idle_ms else {}),
                     **({"pct_range": [round(x, 2) for x in pct_range]} if pct_range else {}),
                     **({"idle_pct_range": [round(x, 2) for x in idle_pct_range]} if idle_pct_range else {}),
                     **({"light_step_ns": round(light_step_ns, 1),
                         "step_pct": round((per_step / light_step_ns - 1) * 100, 2)}
                        if light_step_ns and per_step else {})},
        **({"records_per_warp": per_warp} if per_warp else {}),
    }


# --- the files (the run header: runs.new_run) -----------------------------------------------------


def write(folder_path, run: dict, record: dict) -> Path:
    data = dict(record, run=run)
    validate(data, "<new trace>")
    name = record_name(record["stage"], record["causal"], head_dim_of(record))
    path = Path(folder_path) / name  # (the backward's: its folder's)
    files.write_atomic(path, files.dumps(data))
    return path


_DATE_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def validate(data, where: str = "<trace>") -> dict:
    c = Checker(where, TraceError)
    if not isinstance(data, dict):
        raise c.fail("(top level)", "an object", data)
    c.get(data, "schema_version", "schema_version", f"{SCHEMA_VERSION}", lambda v: v == SCHEMA_VERSION)
    c.get(data, "stage", "stage", "a two-digit stage number", lambda v: isinstance(v, str) and re.fullmatch(r"\d\d", v))
    c.get(data, "name", "name", "the stage's NN-slug", is_text)
    c.get(data, "source_hash", "source_hash", "16 hex digits",
          lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{16}", v))
    if "recorder_hash" in data:  # records made before the recorder had a file of its own lack it (stale)
        c.get(data, "recorder_hash", "recorder_hash", "16 hex digits (common/trace_recorder.cuh)",
              lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{16}", v))
    c.get(data, "causal", "causal", "true or false", lambda v: isinstance(v, bool))
    if "lineage" in data:  # the backward's records say so; a forward record has no such field
        c.get(data, "lineage", "lineage", f"'{BACKWARD}'", lambda v: v == BACKWARD)
    names = events_of(data)
    c.get(data, "clock_mhz", "clock_mhz", "a positive number", pos_num)
    shape = c.get(data, "shape", "shape", "an object of batch, heads, len_q, len_k, head_dim",
                  lambda v: isinstance(v, dict))
    for k in ("batch", "heads", "len_q", "len_k", "head_dim"):
        c.get(shape, k, f"shape.{k}", "a positive integer", lambda v: is_int(v) and v > 0)
    role_names = c.get(data, "roles", "roles", "a list of role names, one per warp",
                       lambda v: isinstance(v, list) and v and all(isinstance(r, str) for r in v))
    win = c.get(data, "window", "window", "an object with start_ns and end_ns", lambda v: isinstance(v, dict))
    c.get(win, "start_ns", "window.start_ns", "a non-negative number", nonneg_num)
    c.get(win, "end_ns", "window.end_ns", "a number after start_ns", lambda v: is_num(v) and v > win["start_ns"])
    events = c.get(data, "events", "events", "a non-empty list", lambda v: isinstance(v, list) and v)
    for i, e in enumerate(events):
        ok = (isinstance(e, list) and len(e) == len(EVENT_FIELDS) and all(is_int(x) for x in e[:2]) and
              e[2] in names and is_int(e[3]) and is_int(e[4]) and is_num(e[5]) and is_num(e[6]) and e[6] >= e[5] and
              0 <= e[1] < len(role_names))
        if not ok:
            raise c.fail(f"events[{i}]", f"[{', '.join(EVENT_FIELDS)}] with a known event and end >= start", e)
    c.get(data, "per_step_ns", "per_step_ns", "a positive number or null", pos_num, nullable=True)
    c.get(data, "recorded", "recorded", "a positive integer", lambda v: is_int(v) and v > 0)
    over = c.get(data, "overhead", "overhead", "an object", lambda v: isinstance(v, dict))
    for k in ("plain_ms", "traced_ms"):
        c.get(over, k, f"overhead.{k}", "a positive number", pos_num)
    c.get(over, "pct", "overhead.pct", "a number", is_num)
    if "idle_ms" in over:  # records made before the recorder could record nothing lack it
        c.get(over, "idle_ms", "overhead.idle_ms", "a positive number", pos_num)
        c.get(over, "idle_pct", "overhead.idle_pct", "a number", is_num)
    if "step_pct" in over:  # records made before the one-record-a-step comparison lack it
        c.get(over, "light_step_ns", "overhead.light_step_ns", "a positive number", pos_num)
        c.get(over, "step_pct", "overhead.step_pct", "a number", is_num)
    if "clock_from" in data:  # records made before the clock was taken over each CTA's run lack it
        c.get(data, "clock_from", "clock_from", "a non-empty string", lambda v: isinstance(v, str) and v)
    for k in ("pct_range", "idle_pct_range"):  # records made before the rounds' spread was kept lack them
        if k in over:
            c.get(over, k, f"overhead.{k}", "[lowest, highest] percent", lambda v: isinstance(v, list) and
                  len(v) == 2 and all(is_num(x) for x in v) and v[0] <= v[1])
    if "records_per_warp" in data:
        c.get(data, "records_per_warp", "records_per_warp", "a positive integer", lambda v: is_int(v) and v > 0)
    run = c.get(data, "run", "run", "an object with date, git_commit, git_dirty, command, environment",
                lambda v: isinstance(v, dict))
    c.get(run, "date", "run.date", "a UTC date like 2026-12-01T10:00:00Z",
          lambda v: isinstance(v, str) and bool(_DATE_RE.match(v)))
    c.get(run, "git_commit", "run.git_commit", "40 hex digits or null",
          lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{40}", v), nullable=True)
    c.get(run, "git_dirty", "run.git_dirty", "true, false or null", lambda v: isinstance(v, bool), nullable=True)
    c.get(run, "environment", "run.environment", "an object", lambda v: isinstance(v, dict))
    return data


def load(path) -> dict:
    return validate(files.read_json(path, TraceError), str(path))


def load_all(gpu_folder, backward: bool = False) -> dict[tuple[str, bool, int], dict]:
    """{(stage id, causal, head dim): record} for every trace record of one GPU (``backward``: of its
    backward stages, from the backward/ folder in it; none when there is no such folder). A record in
    the wrong folder, or in a file its stage, mask and head dim do not name, fails, naming its file."""
    out = {}
    where = backward_folder(gpu_folder) if backward else Path(gpu_folder)
    for path in sorted(where.glob("*.json")):
        data = load(path)
        if is_backward(data) != backward:
            raise TraceError(f"{path}: a {'forward' if backward else 'backward'} stage's trace in the "
                             f"{'backward' if backward else 'forward'} stages' folder")
        expected = record_name(data["stage"], data["causal"], head_dim_of(data))
        if path.name != expected:
            raise TraceError(f"{path}: its record is of {expected} (stage, mask and head dim)")
        out[(data["stage"], data["causal"], head_dim_of(data))] = data
    return out


def is_stale(record: dict, stage: lineage.Stage) -> bool:
    """Older than its stage's sources, or recorded by another recorder (common/trace_recorder.cuh)."""
    return (record["source_hash"] != stage.source_hash()
            or record.get("recorder_hash") != recorder_hash(stage))
