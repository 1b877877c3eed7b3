"""End-to-end model benchmark: real model configurations (random weights) with each attention
backend on the same weights; writes bench/results/models-<gpu-slug>.json.

    python -m bench.models                      # every model, every backend (about 8 minutes on an H200)
    python -m bench.models --models llama-3.1-8b --backends sdpa,hopattn
    python -m bench.models --models sd3-medium,gemma-3-12b --backends sdpa,hopattn,fa3   # head dims 64 and 256
    python -m bench.models --training           # training steps: Llama-3.1-8B at 8k, Wan2.1-1.3B (a few minutes)
    python -m bench.models --dry-run            # tiny configurations on CPU, the reference kernel for hopattn

Inference groups: llama-3.1-8b (prefill 8k, 32k), wan2.1-t2v-14b and wan2.1-t2v-1.3b (480p x 81
frames), ltx-2 (512 x 768 x 121 frames, with audio), sd3-medium (1024 x 1024: joint attention over
4,096 image and 333 text tokens, head dim 64) and gemma-3-12b (prefill 8k, head dim 256; its
sliding-window layers, 40 of 48, go to SDPA for every routed backend and are counted as fallbacks).

--training runs the training groups instead of the inference ones (forward, loss and backward
through each backend on the same weights; the loss compared with SDPA's, the gradients of every
backend, SDPA's own included, with one step through SDPA's flash backend — not SDPA's default, whose
cuDNN backward can be wrong on torch 2.11 for strided inputs, see research/accuracy/README.md):
hopattn, SDPA and SDPA's cuDNN backend. A model whose full layer count does not fit a training step in the GPU's
memory is run with fewer layers, and its record says how many and why.

Each model group runs in its own process (built once; backends switched on the same weights), under
a watchdog: every case is printed before it starts, and one that runs past --case-timeout is killed,
recorded as a hang, and the run goes on with a fresh process for the cases left.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from hopattn.records import models as records
from hopattn.records import runs

from bench import model_cases

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"
BACKENDS = ("sdpa", "cudnn", "hopattn", "fa3", "fa4")  # sdpa first: the others are compared with it


def command_line(argv) -> str:
    return "python -m bench.models " + shlex.join(argv)


def parse_list(text: str, choices, what: str) -> list[str]:
    if text.strip().lower() == "all":
        return list(choices)
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in choices]
    if unknown or not names:
        raise SystemExit(f"--{what}: unknown {unknown[0] if unknown else text!r}; expected some of "
                         f"{', '.join(choices)} or 'all'")
    return [c for c in choices if c in names]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.models", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="models: " + ", ".join(model_cases.GROUPS))
    p.add_argument("--models", default="all",
                   help="model groups: 'all' (default: every inference group; with --training every training "
                        "group) or a comma-separated list")
    p.add_argument("--training", action="store_true",
                   help="the training groups: one forward+backward step per case, loss and gradients compared")
    p.add_argument("--backends", default="all", help=f"'all' (default) or some of {','.join(BACKENDS)}")
    p.add_argument("--reps", type=int, default=3, help="timed steps per case (median reported; default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps before them (default 1)")
    p.add_argument("--case-timeout", type=float, default=300.0,
                   help="seconds one case (warm-up with any JIT compile, timed steps, attention replay) may "
                        "take before it counts as a hang (default 300)")
    p.add_argument("--build-timeout", type=float, default=300.0,
                   help="seconds for starting a process and building its model (default 300)")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny configurations on CPU, the float64 reference standing in for the hopattn kernel")
    p.add_argument("--out", type=Path, default=None,
                   help="record to write (default bench/results/models-<gpu>.json; dry run: a temporary file); "
                        "models already in it and not run now are kept")
    p.add_argument("--seed", type=int, default=0)
    return p


def select_groups(models: str, training: bool) -> list:
    """The groups --models names: 'all' is every inference group, or with --training every training
    group; a list may name any group."""
    if models.strip().lower() == "all":
        return [g for g in model_cases.GROUPS.values() if g.training == training]
    return [model_cases.GROUPS[g] for g in parse_list(models, tuple(model_cases.GROUPS), "models")]


class Child:
    """One bench.model_runner process: its output is echoed and its last lines kept; its progress
    events are read from a JSON-lines file."""

    def __init__(self, cmd: list[str], progress: Path, env: dict):
        self.progress, self.seen = progress, 0
        self.tail = collections.deque(maxlen=40)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     start_new_session=True, cwd=REPO)
        self.reader = threading.Thread(target=self._echo, daemon=True)
        self.reader.start()

    def _echo(self):
        for line in self.proc.stdout:
            self.tail.append(line.rstrip())
            print(f"  | {line.rstrip()}", flush=True)

    def events(self) -> list[dict]:
        if not self.progress.exists():
            return []
        lines = self.progress.read_text().split("\n")[:-1]  # the part after the last newline may be half written
        new = [json.loads(ln) for ln in lines[self.seen:] if ln.strip()]
        self.seen = len(lines)
        return new

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the whole session: the child and anything it started
        except ProcessLookupError:
            pass
        self.proc.wait()

    def why_ended(self) -> str:
        self.reader.join(timeout=5)
        lines = [ln for ln in self.tail if ln.strip()]
        return f"process exited with code {self.proc.returncode}" + (f": {lines[-1][-300:]}" if lines else "")


def run_group(group, backends: list[str], args, workdir: Path, state: dict, poll_s: float = 0.2) -> None:
    """Run every (workload, backend) case of ``group``; results land in state["cases"][workload][backend]."""
    pending = [(wl.id, b) for wl in group.workloads for b in backends]
    cases, launches = state["cases"], 0
    while pending:
        launches += 1
        progress = workdir / f"{group.id}.{launches}.jsonl"
        cmd = [sys.executable, "-m", "bench.model_runner", "--group", group.id,
               "--cases", ",".join(f"{w}:{b}" for w, b in pending), "--progress", str(progress),
               "--workdir", str(workdir), "--reps", str(args.reps), "--warmup", str(args.warmup),
               "--seed", str(args.seed)] + (["--dry-run"] if args.dry_run else [])
        print(f"[bench.models] {group.id}: starting a process for {len(pending)} case(s): "
              f"{', '.join(f'{w}/{b}' for w, b in pending)}", flush=True)
        child = Child(cmd, progress, dict(os.environ))  # the installed package: no path edits
        watch = {"deadline": time.monotonic() + args.build_timeout, "current": None}

        def handle(ev, watch=watch):
            kind = ev["event"]
            if kind == "environment":
                state.setdefault("environment", ev["environment"])
            elif kind == "built":  # a training group's fit may build again, with fewer layers
                state["built"][group.id] = {k: ev.get(k) for k in ("build_s", "params", "layers", "full_layers",
                                                                    "dropped")}
                watch["deadline"] = time.monotonic() + args.case_timeout  # the capture forward comes next
            elif kind == "workload":
                state["workloads"][ev["workload"]] = {"calls": ev["calls"], "tokens": ev["tokens"]}
            elif kind == "case_start":
                watch["current"] = (ev["workload"], ev["backend"])
                watch["deadline"] = time.monotonic() + args.case_timeout
                print(f"[bench.models] {ev['workload']} / {ev['backend']}: started "
                      f"(timeout {args.case_timeout:.0f} s)", flush=True)
            elif kind == "case_done":
                key = (ev["workload"], ev["backend"])
                cases.setdefault(key[0], {})[key[1]] = ev["result"]
                if key in pending:
                    pending.remove(key)
                watch["current"] = None
                watch["deadline"] = time.monotonic() + args.case_timeout  # until the next case starts

        while True:
            for ev in child.events():
                handle(ev)
            if child.proc.poll() is not None:
                for ev in child.events():  # written just before it exited
                    handle(ev)
                why, current = child.why_ended(), watch["current"]
                if current is not None:
                    _fail(cases, pending, [current], "failed", why)
                elif pending and group.id not in state["built"]:
                    _fail(cases, pending, list(pending), "failed", f"the model was not built ({why})")
                elif pending and child.proc.returncode == 0:
                    _fail(cases, pending, list(pending), "failed", "the process ended without running this case")
                break
            if time.monotonic() > watch["deadline"]:
                child.kill()
                current = watch["current"]
                what = f"{current[0]} / {current[1]}" if current else f"{group.id} (starting, building or capturing)"
                print(f"[bench.models] HANG: {what} gave no result in time; killed its process", flush=True)
                limit = args.case_timeout if current or group.id in state["built"] else args.build_timeout
                message = f"no result within {limit:.0f} s (watchdog): the process was killed"
                _fail(cases, pending, [current] if current else list(pending), "hang", message)
                break
            time.sleep(poll_s)


def _fail(cases, pending, keys, status, message) -> None:
    for key in keys:
        cases.setdefault(key[0], {})[key[1]] = {"status": status, "message": message}
        if key in pending:
            pending.remove(key)


EMPTY_CASE = {"message": None, "step_ms": None, "attention_ms": None, "memory_gib": None, "speedup_step": None,
              "speedup_attention": None, "errors": {}, "routing": None}


def assemble(state: dict, groups, run_id: str, run: dict) -> dict:
    """The record of this run, from what the child processes reported."""
    models = {}
    for group in groups:
        built = state["built"].get(group.id, {})
        for wl in group.workloads:
            got = state["cases"].get(wl.id)
            if not got:
                continue
            info = state["workloads"].get(wl.id, {})
            ref = got.get("sdpa", {})
            cases = {}
            for name, result in got.items():
                case = {**EMPTY_CASE, **result}
                if case["status"] == "ok" and ref.get("status") == "ok":
                    case["speedup_step"] = ref["step_ms"]["median"] / case["step_ms"]["median"]
                    if ref.get("attention_ms") and case.get("attention_ms"):
                        case["speedup_attention"] = ref["attention_ms"] / case["attention_ms"]
                if name == "sdpa":  # its outputs against themselves say nothing; its gradients (against the
                    # flash-backend reference) and its run-to-run differences do
                    case["errors"] = {k: v for k, v in case["errors"].items() if k.startswith("rel_err_grads")}
                cases[name] = case
            label, workload = layered(group, wl, built, run["dry_run"])
            models[wl.id] = {"run": run_id, "label": label, "library": group.library,
                             "config_source": group.config_source, "workload": workload,
                             "tokens": info.get("tokens") or wl.tokens(run["dry_run"]),
                             "params": built.get("params"), "build_s": built.get("build_s"), "strict": group.strict,
                             "attention_calls": info.get("calls", []), "cases": cases}
    return {"schema_version": records.SCHEMA_VERSION, "runs": {run_id: run}, "models": models}


def layered(group, wl, built: dict, dry_run: bool) -> tuple[str, str]:
    """The workload's label and description, with the layers a training run had when it had fewer
    than the configuration (and why: the larger counts did not fit)."""
    layers, full = built.get("layers"), built.get("full_layers")
    if not group.training or layers is None or full is None:
        return wl.label, wl.workload
    workload = f"{wl.workload}; {layers} of the model's {full} layers"
    if layers == full:
        return wl.label, workload
    dropped = built.get("dropped") or []
    why = "; ".join(f"{n} layers: {reason}" for n, reason in dropped)
    return f"{wl.label}, {layers} of {full} layers", workload + (f" (fewer did not fit: {why})" if why else "")


def group_backends(group, backends: list[str]) -> list[str]:
    """The backends of ``backends`` that ``group`` runs (training: not the FlashAttention peers)."""
    return [b for b in backends if group.runs(b)]


def plan(groups, backends, args) -> str:
    lines, total = [], 0.0
    for g in groups:
        mine = group_backends(g, backends)
        skipped = [b for b in backends if b not in mine]
        for wl in g.workloads:
            per_case = wl.est_step_s * (args.warmup + args.reps + 1) + 2.0
            total += per_case * len(mine)
            lines.append(f"  {wl.id}: {', '.join(mine)} (~{per_case:.0f} s a backend)" +
                         (f"; not {', '.join(skipped)} (no backward through them here)" if skipped else ""))
        total += 30.0 + (60.0 if g.training else 0.0)  # process start, imports, the build (training: the fit)
    head = "dry run on CPU" if args.dry_run else f"estimated ~{total / 60:.1f} min on an H200 plus any JIT compiles"
    return f"[bench.models] plan ({head}):\n" + "\n".join(lines)


def write(state: dict, groups, args, argv, started: dt.datetime, commit, dirty) -> tuple[Path, dict]:
    """Merge what has run so far into the record file (after every group: a run cut short keeps it)."""
    env = {k: state.get("environment", {}).get(k) for k in records.ENV_FIELDS}
    run_id, date = runs.run_id_and_date(started)
    run = records.new_run(command_line(argv), env, dry_run=args.dry_run, date=date, git=(commit, dirty))
    record = assemble(state, groups, run_id, run)
    out = args.out
    if out is None:
        out = (Path(tempfile.gettempdir()) / "hopattn-models-dry-run.json" if args.dry_run
               else records.record_path(RESULTS_DIR, env["gpu_name"] or "unknown-gpu"))
    old = records.load(out) if out.exists() else None
    records.dump(records.merge(old, record), out)
    return out, record


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    groups = select_groups(args.models, args.training)
    backends = parse_list(args.backends, BACKENDS, "backends")
    commit, dirty = runs.git_state()
    print(runs.log_header(command_line(argv), git=(commit, dirty)), flush=True)  # first: what made the log
    print(plan(groups, backends, args), flush=True)
    started = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    state = {"cases": {}, "built": {}, "workloads": {}}
    with tempfile.TemporaryDirectory(prefix="hopattn-models-") as tmp:
        for i, group in enumerate(groups):
            run_group(group, group_backends(group, backends), args, Path(tmp), state)
            out, record = write(state, groups[: i + 1], args, argv, started, commit, dirty)
            print(f"[bench.models] wrote {runs.shown_path(out)}", flush=True)
    for model_id, model in record["models"].items():
        for name, case in model["cases"].items():
            step = case["step_ms"]["median"] if case.get("step_ms") else None
            shown = f"{step:.1f} ms" if step else case["status"]
            speed = f", {case['speedup_step']:.3f}x SDPA" if case.get("speedup_step") else ""
            print(f"  {model_id} / {name}: {shown}{speed}" + (f" ({case['message']})" if case.get("message") else ""))
    bad = [(m, n) for m, model in record["models"].items() for n, c in model["cases"].items()
           if c["status"] in ("hang", "failed", "refused")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
