"""One benchmark run: for each shape, check every arm, time the correct ones together, write the results.

Two passes, driven by the same steps (run_config): the forward (ForwardPass, here: the stages of
kernels/attention and their peers) and the backward (bench.backward_check.BackwardPass: the stages
of kernels/attention_backward, each deterministic mode its own arm, and the peers' backwards), the
backward after the forward, in the same process, into the same results file (section "backward")."""

from __future__ import annotations

import math
import os
import random
import secrets
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from hopattn.records import files, results, runs
from hopattn.records.runs import run_id_and_date

from bench import correctness, env, report, stats, timing
from bench.backward_check import BACKWARD
from bench.shapes import Shape, backward_shapes, tflops

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
    # The backward (the CLI asks for all of it by default; left out here, a run is the forward's only)
    backward_stages: list[int] | None = field(default_factory=list)  # None = all; [] = none
    backward_peers: list[str] = field(default_factory=list)
    backward_shapes: list[Shape] | None = None  # None: the core shapes (4k, 8k, 16k) among `shapes`
    deterministic: tuple[bool, ...] = (False, True)  # the backward stages' modes timed (True: deterministic)

    def backward_wanted(self) -> bool:
        """Some backward arm is asked for, and some shape for it."""
        arms = self.backward_stages is None or bool(self.backward_stages) or bool(self.backward_peers)
        return arms and bool(self.shapes_backward())

    def shapes_backward(self) -> list[Shape]:
        return backward_shapes(self.shapes) if self.backward_shapes is None else list(self.backward_shapes)


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
    pass_: object = None  # the pass of the configuration under way (ForwardPass or BackwardPass)

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

    def once():
        with launch.context():
            got = correctness.poisoned_call(s.torch, launch.fn, q.numel() // q.shape[3] * v.shape[3], q.dtype,
                                            q.device)
        s.synchronize()
        return got

    result, poisoned = correctness.explained(once)
    out = launch.to_bhsd(result)
    expected = (*q.shape[:3], v.shape[3])  # q's, with v's head dim
    if tuple(out.shape) != expected:
        raise RuntimeError(f"output shape {tuple(out.shape)} differs from {expected} (q's, with v's head dim)")
    return launch, ref.rel_err(out), poisoned


class ForwardPass:
    """The forward: out = attention(q, k, v) against a float64 reference of sampled heads and rows.
    The steps run_config takes, the same for the backward (bench.backward_check.BackwardPass)."""

    name = "forward"
    suffix = ""
    references = results.REFERENCES

    def inputs(self, s: Session, shape: Shape):
        torch = s.torch
        return tuple(torch.randn(shape.batch, heads, n, d, device=s.device, dtype=torch.bfloat16)
                     for heads, n, d in ((shape.heads, shape.len_q, shape.head_dim), (shape.kv, shape.len_k, shape.head_dim),
                                         (shape.kv, shape.len_k, shape.dv)))

    def reference(self, s: Session, shape: Shape, inputs, causal: bool, scale: float):
        sample = correctness.choose_sample(shape.batch, shape.heads, shape.len_q, s.rng)
        ref = correctness.Reference(s.torch, *inputs, causal, scale, sample)
        return ref, sample.describe(shape.batch, shape.heads, shape.len_q)

    def check(self, s: Session, arm, inputs, ref, causal: bool, scale: float):
        launch, err, poisoned = check_arm(s, arm, inputs, ref, causal, scale)
        return launch, {"rel_err": err}, poisoned, None

    def verdict(self, errors: dict) -> str | None:
        return correctness.verdict(errors["rel_err"])

    def describe(self, errors: dict) -> str:
        return f"rel err {errors['rel_err']:.2e}"

    def raw_errors(self, errors: dict) -> dict:
        err = errors["rel_err"]
        return {"rel_err": err if math.isfinite(err) else None}

    def entry(self, arm, shape: Shape, causal: bool, run_id: str, status: str, reason: str | None = None,
              timing_fields: dict | None = None, errors: dict | None = None, ratios: dict | None = None) -> dict:
        return make_entry(arm, shape, causal, run_id, status, reason, timing_fields,
                          rel_err=errors["rel_err"] if errors else None, ratios=ratios)

    def timed_entry(self, arm, key: str, shape: Shape, causal: bool, run_id: str, fields: dict, errors: dict,
                    round_ms: dict) -> dict:
        ref_keys = {ref: f"peer:{ref}" for ref in self.references}
        return make_entry(arm, shape, causal, run_id, "ok", timing_fields=fields, rel_err=errors["rel_err"],
                          ratios=ratios_for(key, round_ms, ref_keys))


FORWARD = ForwardPass()


def run_config(s: Session, arms, shape: Shape, causal: bool, run_id: str, pass_=FORWARD) -> list[dict]:
    """Check then time every arm at one shape and mask, in one pass (forward or backward); returns
    their entries."""
    torch, log = s.torch, s.log
    name = report.config_name(shape.name, causal) + pass_.suffix
    raw = {"shape": shape.name, "causal": causal, "arms": {}}
    if pass_ is not FORWARD:
        raw["pass"] = pass_.name
    entries: dict[str, dict] = {}
    s.current, s.pending, s.config, s.pass_ = entries, list(arms), (shape, causal, run_id), pass_
    inputs = pass_.inputs(s, shape)
    for arm in arms:  # BSHD shapes: each arm takes its inputs stored that way (prepare() reads it)
        arm.layout = shape.layout
    scale = 1.0 / math.sqrt(shape.head_dim)
    with s.watch(f"{name}: the float64 reference"):
        ref, checked = pass_.reference(s, shape, inputs, causal, scale)
        s.synchronize()
    raw["checked"] = checked
    log(f"{name} ({shape.describe()}): float64 reference over {checked}")

    live = {}  # key -> (arm, launch, errors)
    lost = None  # why the CUDA context became unusable, if it did
    for arm in arms:
        pre = arm.applies(shape, causal)
        if pre is None and lost:
            pre = ("failed", f"not run: the CUDA context was lost after {lost}")
        if pre is not None:
            entries[arm.key] = pass_.entry(arm, shape, causal, run_id, pre[0], pre[1])
            log(f"{name}  {arm.short:10s} {pre[0]}: {pre[1]}")
            continue
        try:
            with s.watch(f"{name}: checking {arm.short}"):
                launch, errors, poisoned, problem = pass_.check(s, arm, inputs, ref, causal, scale)
        except Exception as exc:
            missing = arm.missing_reason(exc)  # e.g. an inference-only build asked for its backward
            if missing:
                entries[arm.key] = pass_.entry(arm, shape, causal, run_id, "missing", missing)
                log(f"{name}  {arm.short:10s} missing: {missing}")
                continue
            entries[arm.key] = pass_.entry(arm, shape, causal, run_id, "failed", _why(exc))
            log(f"{name}  {arm.short:10s} failed: {_why(exc)}")
            if not context_alive(torch, s.device):
                lost = f"{arm.short} failed ({_why(exc)})"
                log(f"CUDA context lost: every later arm is reported failed; rerun without {arm.short}")
            continue
        raw["arms"][arm.key] = {**pass_.raw_errors(errors), "poisoned": poisoned}
        bad = problem or pass_.verdict(errors)
        if bad:
            entries[arm.key] = pass_.entry(arm, shape, causal, run_id, "wrong", bad, errors=errors)
            log(f"{name}  {arm.short:10s} WRONG: {bad}")
            continue
        live[arm.key] = (arm, launch, errors)
        note = "" if poisoned else ", output not on poisoned memory"
        log(f"{name}  {arm.short:10s} correct ({pass_.describe(errors)}{note})")

    if live:
        with s.watch(f"{name}: timing"):
            _time_live(s, live, shape, causal, run_id, entries, raw, name, pass_)
    s.raw.setdefault("configs", []).append(raw)
    del inputs, ref, live
    return [entries[a.key] for a in arms]


def _time_live(s: Session, live: dict, shape: Shape, causal: bool, run_id: str, entries: dict, raw: dict,
               name: str, pass_=FORWARD) -> None:
    """Warm up, pick launches per round from a first timing, then the alternating rounds."""
    fns, contexts, launches, warm = {}, {}, {}, {}
    for key, (arm, launch, _) in list(live.items()):
        try:
            with launch.context():
                for _ in range(WARMUP_CALLS):
                    launch.fn()
                first = s.timer.one(launch.fn)
        except Exception as exc:
            entries[key] = pass_.entry(arm, shape, causal, run_id, "failed", f"while warming up: {_why(exc)}")
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
            entries[key] = pass_.entry(arm, shape, causal, run_id, "failed", f"while timing: {_why(exc)}")
        s.log(f"{name}: timing failed: {_why(exc)}")
        return
    round_ms = timed["round_ms"]
    for key, (arm, _, errors) in live.items():
        fields = stats.summarize(round_ms[key])
        entries[key] = pass_.timed_entry(arm, key, shape, causal, run_id, fields, errors, round_ms)
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

    from bench import backward, peers
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

    def can_run(s):
        return (s.arch != "sm_90a" or capability == (9, 0)) and capability >= (8, 0)

    all_stages = lineage.discover()
    chosen = [s for s in all_stages if opts.stages is None or s.number in opts.stages]
    bwd_chosen, forward = [], None
    if opts.backward_wanted():
        bwd_chosen = [s for s in lineage.discover(lineage.BACKWARD_DIR)
                      if opts.backward_stages is None or s.number in opts.backward_stages]
        forward = backward.forward_for(all_stages) if bwd_chosen else None
    # the backward stages read out and lse from a forward stage: it is built with the forward's
    runnable = [s for s in chosen + ([forward] if forward is not None and forward not in chosen else []) if can_run(s)]
    if runnable:
        log(f"building {len(runnable)} stage(s) (cached by source hash)")
    build_errors = stage_arms.build(runnable, opts.jobs, log)
    for number, why in sorted(build_errors.items()):
        log(f"stage {number:02d}: {why}")
    arms = stage_arms.make_stage_arms(chosen, capability, gpu_name, build_errors)
    arms += peers.make_peers(torch, opts.peers)
    bwd_runnable = [s for s in bwd_chosen if can_run(s)]
    if bwd_runnable:
        log(f"building {len(bwd_runnable)} backward stage(s) (cached by source hash)")
    bwd_errors = stage_arms.build(bwd_runnable, opts.jobs, log)  # built apart: numbered as the forward's
    for number, why in sorted(bwd_errors.items()):
        log(f"backward stage {number:02d}: {why}")
    bwd_arms = backward.make_backward_stage_arms(
        bwd_chosen, capability, gpu_name, bwd_errors, opts.deterministic, forward,
        build_errors.get(forward.number) if forward is not None else None)
    bwd_arms += backward.make_backward_peers(torch, opts.backward_peers) if opts.backward_wanted() else []

    session = Session(torch=torch, device=device, timer=timer or timing.Timer(torch), log=log, rounds=opts.rounds,
                      launches=opts.launches, rng=rng, sync=torch.cuda.synchronize,
                      raw={"seed": seed, "run_id": run_id, "command": opts.command},
                      step_timeout_s=opts.hang_timeout)
    entries: list[dict] = []
    bwd_entries: list[dict] = []
    slug = results.gpu_slug(gpu_name)

    def save(extra=(), final=False, extra_backward=()):
        clocks_after = env.read_clocks()
        run_record = runs.new_run(opts.command, dict(environment, clocks_after={"sm_mhz": clocks_after["sm_mhz"],
                                                                                "mem_mhz": clocks_after["mem_mhz"]}),
                                  date=date, git=(commit, dirty))
        new = results.new_results(slug, run_id, run_record, entries + list(extra), bwd_entries + list(extra_backward))
        if final:
            log(f"clocks after: {clocks_after}")
            shown = results.normalize(new)
            if shown["results"] or not shown["backward"]:
                print("\n" + report.summary_table(shown["results"]) + "\n", flush=True)
            if shown["backward"]:
                print("backward alone (TFLOP/s at 2.5x the forward's FLOPs):\n"
                      + report.backward_summary_table(shown["backward"]) + "\n", flush=True)
        written = results.write_merged(new, opts.out, log)
        if final:
            log(f"wrote {runs.shown_path(written)}")
            if opts.raw is not None:
                session.raw.update({"log": log.lines, "run": run_record, "entries": new["results"],
                                    "backward_entries": new["backward"]})
                files.write_atomic(opts.raw, files.dumps(_finite(session.raw)))
                log(f"wrote the log and per-round timings to {runs.shown_path(opts.raw)}")

    def on_hang(what, seconds):
        shape, causal, rid = session.config
        pass_ = session.pass_ or FORWARD
        reason = f"not finished: {what} made no progress for {seconds:.0f} s (a hung kernel?); the run stopped there"
        log(f"HANG: {what} made no progress for {seconds:.0f} s; saving what was measured and stopping")
        extra = [e for e in session.current.values()]
        extra += [pass_.entry(a, shape, causal, rid, "failed", reason)
                  for a in session.pending if a.key not in session.current]
        try:
            if pass_ is FORWARD:
                save(extra, final=True)
            else:
                save(final=True, extra_backward=extra)
        finally:
            exit_on_hang(3)

    # The forward's configurations, then the backward's (its shapes: the core ones of the selection)
    plan = [(FORWARD, arms, shape, causal) for shape in opts.shapes for causal in opts.causal] if arms else []
    plan += [(BACKWARD, bwd_arms, shape, causal) for shape in opts.shapes_backward() for causal in opts.causal
             ] if bwd_arms else []
    session.watchdog = Watchdog(on_hang) if opts.hang_timeout > 0 else None
    for n, (pass_, pass_arms, shape, causal) in enumerate(plan):
        # the backward's peers differentiate through autograd; the forward records no graph
        with torch.enable_grad() if pass_ is BACKWARD else torch.no_grad():
            got = run_config(session, pass_arms, shape, causal, run_id, pass_)
        (bwd_entries if pass_ is BACKWARD else entries).extend(got)
        session.current, session.pending = {}, []
        torch.cuda.empty_cache()
        if n != len(plan) - 1:
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
