"""One benchmark run: for each shape, check every arm, time the correct ones together, write the results."""

from __future__ import annotations

import math
import os
import random
import secrets
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from hopattn.records import files, results, runs
from hopattn.records.runs import run_id_and_date

from bench import correctness, env, report, stats, timing
from bench.shapes import Shape, tflops

WARMUP_CALLS = 2


@dataclass
class Options:
    stages: list[int] | None  # None = all
    peers: list[str]
    shapes: list[Shape]
    causal: tuple[bool, ...]
    rounds: int
    launches: int
    out: Path | None
    raw: Path | None = None
    seed: int | None = None
    jobs: int | None = None
    command: str = "python -m bench"
    hang_timeout: float = 300.0  # seconds one check or one shape's timing may take before the run saves and stops


@dataclass
class Session:
    """What one configuration's run needs; tests build one on the CPU with a fake timer."""

    torch: object
    device: str
    timer: object
    log: object
    rounds: int
    launches: int
    rng: random.Random
    sync: object = None
    raw: dict = field(default_factory=dict)
    watchdog: object = None
    step_timeout_s: float = 300.0
    # what a hang handler needs: this configuration's entries so far and the arms still pending
    current: dict = field(default_factory=dict)
    pending: list = field(default_factory=list)
    config: tuple = ()

    def synchronize(self):
        if self.sync is not None:
            self.sync()

    def watch(self, what: str):
        if self.watchdog is None:
            return nullcontext()
        return self.watchdog.step(what, self.step_timeout_s)


def _why(err: BaseException) -> str:
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    return f"{type(err).__name__}: {lines[0].strip()[:300]}" if lines else type(err).__name__


def make_entry(arm, shape: Shape, causal: bool, run_id: str, status: str, reason: str | None = None,
               timing_fields: dict | None = None, rel_err: float | None = None, ratios: dict | None = None) -> dict:
    """A results-file entry; timing fields stay null unless the arm was timed."""
    entry = {"kind": arm.kind, "name": arm.name, "label": arm.label, "run_id": run_id, "shape": shape.name,
             **shape.dims, "causal": causal, "status": status, "reason": reason,
             "source_hash": arm.source_hash if arm.kind == "stage" else None,
             "median_ms": None, "min_ms": None, "max_ms": None, "spread_pct": None, "samples": None,
             "tflops": None, "rel_err": rel_err if rel_err is not None and math.isfinite(rel_err) else None,
             "ratios": None}
    if status == "ok":
        entry.update(timing_fields)
        entry["tflops"] = tflops(shape, causal, timing_fields["median_ms"])
        entry["ratios"] = ratios or {}
    return entry


def ratios_for(key: str, round_ms: dict, ref_keys: dict) -> dict:
    """{reference: median over rounds of ref/arm} for each reference timed in this configuration."""
    return {ref: stats.ratio(round_ms[key], round_ms[rkey]) for ref, rkey in ref_keys.items() if rkey in round_ms}


def context_alive(torch, device: str) -> bool:
    """False when an earlier fault (e.g. an illegal address) has left the CUDA context unusable."""
    if device != "cuda":
        return True
    try:
        torch.cuda.synchronize()
        return float(torch.ones(1, device=device).add_(1).item()) == 2.0
    except Exception:
        return False


def check_arm(s: Session, arm, inputs, ref, causal: bool, scale: float):
    """Prepare and run an arm once on poisoned memory. Returns (launch, rel_err, poisoned)."""
    q, k, v = inputs
    launch = arm.prepare(q, k, v, causal, scale)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with launch.context():
                result, poisoned = correctness.poisoned_call(s.torch, launch.fn, q.numel(), q.dtype, q.device)
            s.synchronize()
        except Exception as err:
            # SDPA explains "No available kernel" only through warnings: keep the first one as the reason
            hints = [str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()]
            if hints and "no available kernel" in str(err).lower():
                raise RuntimeError(f"{_why(err)} ({hints[0][:200]})") from err
            raise
    out = launch.to_bhsd(result)
    if tuple(out.shape) != tuple(q.shape):
        raise RuntimeError(f"output shape {tuple(out.shape)} differs from q's {tuple(q.shape)}")
    return launch, ref.rel_err(out), poisoned


def run_config(s: Session, arms, shape: Shape, causal: bool, run_id: str) -> list[dict]:
    """Check then time every arm at one shape and mask; returns their entries."""
    torch, log = s.torch, s.log
    name = report.config_name(shape.name, causal)
    raw = {"shape": shape.name, "causal": causal, "arms": {}}
    entries: dict[str, dict] = {}
    s.current, s.pending, s.config = entries, list(arms), (shape, causal, run_id)
    q, k, v = (torch.randn(shape.batch, heads, n, shape.head_dim, device=s.device, dtype=torch.bfloat16)
               for heads, n in ((shape.heads, shape.len_q), (shape.kv, shape.len_k), (shape.kv, shape.len_k)))
    for arm in arms:  # BSHD shapes: each arm takes its inputs stored that way (prepare() reads it)
        arm.layout = shape.layout
    scale = 1.0 / math.sqrt(shape.head_dim)
    sample = correctness.choose_sample(shape.batch, shape.heads, shape.len_q, s.rng)
    with s.watch(f"{name}: the float64 reference"):
        ref = correctness.Reference(torch, q, k, v, causal, scale, sample)
        s.synchronize()
    checked = sample.describe(shape.batch, shape.heads, shape.len_q)
    raw["checked"] = checked
    log(f"{name} ({shape.describe()}): float64 reference over {checked}")

    live = {}  # key -> (arm, launch, rel_err)
    lost = None  # why the CUDA context became unusable, if it did
    for arm in arms:
        pre = arm.applies(shape, causal)
        if pre is None and lost:
            pre = ("failed", f"not run: the CUDA context was lost after {lost}")
        if pre is not None:
            entries[arm.key] = make_entry(arm, shape, causal, run_id, pre[0], pre[1])
            log(f"{name}  {arm.short:10s} {pre[0]}: {pre[1]}")
            continue
        try:
            with s.watch(f"{name}: checking {arm.short}"):
                launch, err, poisoned = check_arm(s, arm, (q, k, v), ref, causal, scale)
        except Exception as exc:
            entries[arm.key] = make_entry(arm, shape, causal, run_id, "failed", _why(exc))
            log(f"{name}  {arm.short:10s} failed: {_why(exc)}")
            if not context_alive(torch, s.device):
                lost = f"{arm.short} failed ({_why(exc)})"
                log(f"CUDA context lost: every later arm is reported failed; rerun without {arm.short}")
            continue
        raw["arms"][arm.key] = {"rel_err": err if math.isfinite(err) else None, "poisoned": poisoned}
        bad = correctness.verdict(err)
        if bad:
            entries[arm.key] = make_entry(arm, shape, causal, run_id, "wrong", bad, rel_err=err)
            log(f"{name}  {arm.short:10s} WRONG: {bad}")
            continue
        live[arm.key] = (arm, launch, err)
        note = "" if poisoned else ", output not on poisoned memory"
        log(f"{name}  {arm.short:10s} correct (rel err {err:.2e}{note})")

    if live:
        with s.watch(f"{name}: timing"):
            _time_live(s, live, shape, causal, run_id, entries, raw, name)
    s.raw.setdefault("configs", []).append(raw)
    del q, k, v, ref, live
    return [entries[a.key] for a in arms]


def _time_live(s: Session, live: dict, shape: Shape, causal: bool, run_id: str, entries: dict, raw: dict,
               name: str) -> None:
    """Warm up, pick launches per round from a first timing, then the alternating rounds."""
    fns, contexts, launches, warm = {}, {}, {}, {}
    for key, (arm, launch, _) in list(live.items()):
        try:
            with launch.context():
                for _ in range(WARMUP_CALLS):
                    launch.fn()
                first = s.timer.one(launch.fn)
        except Exception as exc:
            entries[key] = make_entry(arm, shape, causal, run_id, "failed", f"while warming up: {_why(exc)}")
            s.log(f"{name}  {arm.short:10s} failed while warming up: {_why(exc)}")
            del live[key]
            continue
        fns[key], contexts[key] = launch.fn, launch.context
        launches[key] = timing.launches_for(first, s.launches)
        warm[key] = timing.warm_launches(first)
        raw["arms"][key]["first_ms"] = first
        raw["arms"][key]["launches"] = launches[key]
    if not fns:
        return
    s.log(f"{name}: timing {len(fns)} arms, {s.rounds} rounds, order reversed every other round")

    def on_round(r, medians):
        best = min(medians.values())
        s.log(f"{name}: round {r + 1}/{s.rounds} done (fastest {best:.4f} ms)")

    try:
        timed = timing.run_rounds(s.timer, fns, s.rounds, launches, contexts, on_round, warm)
    except Exception as exc:
        for key, (arm, _, _) in live.items():
            entries[key] = make_entry(arm, shape, causal, run_id, "failed", f"while timing: {_why(exc)}")
        s.log(f"{name}: timing failed: {_why(exc)}")
        return
    round_ms = timed["round_ms"]
    ref_keys = {ref: f"peer:{ref}" for ref in results.REFERENCES}
    for key, (arm, _, err) in live.items():
        fields = stats.summarize(round_ms[key])
        entries[key] = make_entry(arm, shape, causal, run_id, "ok", timing_fields=fields, rel_err=err,
                                  ratios=ratios_for(key, round_ms, ref_keys))
        raw["arms"][key]["round_ms"] = round_ms[key]
        raw["arms"][key]["launch_ms"] = timed["launch_ms"][key]


# --- the whole run -----------------------------------------------------------------------------


def run(opts: Options, log, device: str = "cuda", timer=None, exit_on_hang=os._exit) -> int:
    """The CLI's run on the current CUDA device; returns the exit status.

    device and timer exist for the orchestration test, which runs this on the CPU with a stand-in
    timer; the CLI always passes neither (CUDA events on the GPU). The results file is rewritten after
    every shape, so a run cut short (a time limit, a hung kernel) keeps what it finished.
    """
    import torch
    from hopattn import lineage

    from bench import peers
    from bench import stages as stage_arms
    from bench.watchdog import Watchdog

    if not torch.cuda.is_available():
        log("no CUDA GPU visible to torch: the benchmark needs one (nothing written)")
        return 2
    seed = opts.seed if opts.seed is not None else secrets.randbits(31)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    run_id, date = run_id_and_date()
    clocks_before = env.read_clocks()
    dev = torch.cuda.current_device()
    gpu_name = torch.cuda.get_device_name(dev)
    capability = tuple(torch.cuda.get_device_capability(dev))
    log(f"{gpu_name} (compute capability {capability[0]}.{capability[1]}), torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}; input seed {seed}; clocks {clocks_before}")
    try:
        commit, dirty = runs.git_state()
    except ValueError as err:
        log(f"{err} (nothing written)")
        return 2
    log(f"source: commit {commit or 'unknown'}" + {True: " with uncommitted changes", False: ""}.get(dirty, ""))
    # read now: the hang handler runs while the main thread is stuck inside CUDA
    environment = env.collect(torch, clocks_before, clocks_before)

    all_stages = lineage.discover()
    chosen = [s for s in all_stages if opts.stages is None or s.number in opts.stages]
    runnable = [s for s in chosen if (s.arch != "sm_90a" or capability == (9, 0)) and capability >= (8, 0)]
    if runnable:
        log(f"building {len(runnable)} stage(s) (cached by source hash)")
    build_errors = stage_arms.build(runnable, opts.jobs, log)
    for number, why in sorted(build_errors.items()):
        log(f"stage {number:02d}: {why}")
    arms = stage_arms.make_stage_arms(chosen, capability, gpu_name, build_errors)
    arms += peers.make_peers(torch, opts.peers)

    session = Session(torch=torch, device=device, timer=timer or timing.Timer(torch), log=log, rounds=opts.rounds,
                      launches=opts.launches, rng=rng, sync=torch.cuda.synchronize,
                      raw={"seed": seed, "run_id": run_id, "command": opts.command},
                      step_timeout_s=opts.hang_timeout)
    entries: list[dict] = []
    slug = results.gpu_slug(gpu_name)

    def save(extra=(), final=False):
        clocks_after = env.read_clocks()
        run_record = runs.new_run(opts.command, dict(environment, clocks_after={"sm_mhz": clocks_after["sm_mhz"],
                                                                                "mem_mhz": clocks_after["mem_mhz"]}),
                                  date=date, git=(commit, dirty))
        new = results.new_results(slug, run_id, run_record, entries + list(extra))
        if final:
            log(f"clocks after: {clocks_after}")
            print("\n" + report.summary_table(results.normalize(new)["results"]) + "\n", flush=True)
        written = results.write_merged(new, opts.out, log)
        if final:
            log(f"wrote {runs.shown_path(written)}")
            if opts.raw is not None:
                session.raw.update({"log": log.lines, "run": run_record, "entries": new["results"]})
                files.write_atomic(opts.raw, files.dumps(_finite(session.raw)))
                log(f"wrote the log and per-round timings to {runs.shown_path(opts.raw)}")

    def on_hang(what, seconds):
        shape, causal, rid = session.config
        reason = f"not finished: {what} made no progress for {seconds:.0f} s (a hung kernel?); the run stopped there"
        log(f"HANG: {what} made no progress for {seconds:.0f} s; saving what was measured and stopping")
        extra = [e for e in session.current.values()]
        extra += [make_entry(a, shape, causal, rid, "failed", reason)
                  for a in session.pending if a.key not in session.current]
        try:
            save(extra, final=True)
        finally:
            exit_on_hang(3)

    session.watchdog = Watchdog(on_hang) if opts.hang_timeout > 0 else None
    with torch.no_grad():
        for shape in opts.shapes:
            for causal in opts.causal:
                entries += run_config(session, arms, shape, causal, run_id)
                session.current, session.pending = {}, []
                torch.cuda.empty_cache()
                if (shape, causal) != (opts.shapes[-1], opts.causal[-1]):
                    save()  # so far, in case the run is cut short
    save(final=True)
    return 0


def _finite(obj):
    """JSON has no NaN/Inf: write them as null in the raw side file."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
