"""python -m bench.rowwise_softmax: the softmax stages (Part II), forward and backward, against the copy
ceiling, eager torch, torch.compile, Liger and QuACK, in one process, at rows of 4k to 256k bf16
columns (the sizes of the numbers to beat: 32768 x 4k, 16384 x 16k, 4096 x 64k, 1024 x 256k).

The method is bench.rowwise's: every arm checked against float64 on sampled rows first, then rounds
in alternating arm order, each arm warmed, then timed launches each after an L2 flush that reads.
GB/s = bytes moved / median time: x read and y written (forward), y and dy read and dx written
(backward); the copy arm moves as many bytes. A peer's backward is its own forward's autograd graph
differentiated again and again (torch.autograd.grad with retain_graph). The records:
bench/results/softmax/<gpu>.json and bench/results/softmax_backward/<gpu>.json, each written after
every size (a run stopped by its time limit keeps the sizes it finished), with the environment, the
git commit and each stage's source hash.

    python -m bench.rowwise_softmax                             # forward and backward, every size
    python -m bench.rowwise_softmax --direction backward --sizes 4k,256k --peers eager,quack
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from bench import env, rowwise, stats, timing
from bench.report import Log
from bench.rowwise_arms import Arm

SCHEMA_VERSION = rowwise.SCHEMA_VERSION
SIZES = {"4k": (32768, 4096), "16k": (16384, 16384), "64k": (4096, 65536), "256k": (1024, 262144)}
PEERS = ("eager", "compile", "liger", "quack")
DIRECTIONS = {"forward": "softmax", "backward": "softmax_backward"}
CHECK_ROWS = rowwise.CHECK_ROWS
RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.rowwise_softmax", description=__doc__.splitlines()[0])
    p.add_argument("--direction", default="both", choices=["forward", "backward", "both"])
    p.add_argument("--sizes", default="all", help=f"comma-separated from {','.join(SIZES)}, or all")
    p.add_argument("--stages", default="all", help="stages of the direction's lineage: all, none, or e.g. 2-4")
    p.add_argument("--peers", default="all", help=f"all, none, or some of {','.join(PEERS)}")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--launches", type=int, default=10, help="timed launches per arm and round (at most)")
    p.add_argument("--seed", type=int, default=None, help="input seed (default: fresh, printed)")
    return p.parse_args(argv)


def _forward_peer(torch, name: str):
    """The peer's softmax over the last axis, differentiable, or ImportError."""
    if name == "eager":
        return lambda a: torch.softmax(a, -1)
    if name == "compile":
        return torch.compile(lambda a: torch.softmax(a, -1), dynamic=False, fullgraph=True)
    if name == "liger":
        from liger_kernel.ops.softmax import LigerSoftmaxFunction

        return LigerSoftmaxFunction.apply
    if name == "quack":
        from quack.softmax import softmax as quack_softmax

        return quack_softmax
    raise ValueError(f"unknown peer {name!r}; expected one of {', '.join(PEERS)}")


def arms_for(torch, sm, direction: str, stages: list, peers: list, x, dy, y) -> list[Arm]:
    nbytes = x.numel() * x.element_size() * (2 if direction == "forward" else 3)
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=x.device)
    dst = torch.empty_like(src)
    arms = [Arm("copy", "ceiling", lambda: dst.copy_(src), None)]
    for n in stages:
        out = torch.empty_like(x)
        if direction == "forward":
            info = sm.stage_info(n, x.shape[-1], x.dtype)
            arms.append(Arm(f"stage {n:02d}", "stage", lambda n=n, out=out: sm._softmax_into(x, out, stage=n),
                            lambda out=out: out, variant=info["variant"]))
        else:
            info = sm.backward_stage_info(n, x.shape[-1], x.dtype)
            arms.append(Arm(f"stage {n:02d}", "stage",
                            lambda n=n, out=out: sm._softmax_backward_into(dy, y, out, stage=n),
                            lambda out=out: out, variant=info["variant"]))
    for name in peers:
        try:
            fn = _forward_peer(torch, name)
        except ImportError as err:
            arms.append(Arm(name, "peer", None, reason=f"not importable: {err}"))
            continue
        state = {}
        if direction == "forward":
            def launch(fn=fn, state=state):
                state["out"] = fn(x)
        else:
            xr = x.detach().clone().requires_grad_()

            def launch(fn=fn, state=state, xr=xr):  # the first (untimed) call runs the peer's forward too
                if "y" not in state:
                    state["y"] = fn(xr)
                state["out"] = torch.autograd.grad(state["y"], (xr,), dy, retain_graph=True)[0]
        arms.append(Arm(name, "peer", launch, lambda state=state: state.get("out")))
    return arms


def rel_err(torch, direction: str, got, x, dy, y) -> float:
    rows = torch.linspace(0, x.shape[0] - 1, min(CHECK_ROWS, x.shape[0]), device=x.device).long()
    if direction == "forward":
        ref = torch.softmax(x[rows].double(), -1)
    else:
        yd, g = y[rows].double(), dy[rows].double()
        ref = yd * (g - (yd * g).sum(-1, keepdim=True))
    return ((got[rows].double() - ref).abs().max() / ref.abs().max()).item()


def measure_size(torch, log, timer, direction: str, size: str, stages, peers, rounds, launches, gen) -> list[dict]:
    from hopattn import softmax_ops as sm

    rows, cols = SIZES[size]
    x = (2 * torch.randn(rows, cols, generator=gen, device="cuda")).to(torch.bfloat16)
    dy = torch.randn(rows, cols, generator=gen, device="cuda").to(torch.bfloat16) if direction == "backward" else None
    y = sm.softmax(x) if direction == "backward" else None
    moved = x.numel() * x.element_size() * (2 if direction == "forward" else 3)
    entries, live = {}, {}
    for arm in arms_for(torch, sm, direction, stages, peers, x, dy, y):
        base = {"size": size, "rows": rows, "cols": cols, "dtype": "bf16", "arm": arm.key, "kind": arm.kind,
                "bytes": moved, "variant": arm.variant}
        if arm.launch is None:
            entries[arm.key] = dict(base, status="missing", reason=arm.reason)
            log(f"{direction} {size} {arm.key}: missing ({arm.reason})")
            continue
        try:
            arm.launch()
            torch.cuda.synchronize()
            err = None if arm.output is None else rel_err(torch, direction, arm.output(), x, dy, y)
            first = timer.one(arm.launch)
        except Exception as exc:  # noqa: BLE001  (recorded with the reason; the run goes on)
            entries[arm.key] = dict(base, status="error", reason=f"{type(exc).__name__}: {str(exc)[:300]}")
            log(f"{direction} {size} {arm.key}: error ({entries[arm.key]['reason']})")
            continue
        entries[arm.key] = dict(base, status="ok", max_rel_err=err)
        live[arm.key] = (arm, first)
    counts = {k: timing.launches_for(first, launches, rowwise.BUDGET_MS) for k, (_, first) in live.items()}
    warm = {k: timing.warm_launches(first, rowwise.WARM_MS) for k, (_, first) in live.items()}
    round_ms = timing.run_rounds(timer, {k: a.launch for k, (a, _) in live.items()}, rounds, counts,
                                 warm=warm)["round_ms"]
    for key in live:
        e = entries[key]
        e.update(stats.summarize(round_ms[key]))
        e["gbps"] = moved / (e["median_ms"] * 1e-3) / 1e9
        e["vs"] = {ref: stats.ratio(round_ms[key], round_ms[ref]) for ref in live if ref != key}
        log(f"{direction} {size} {key:9s} {e['gbps']:7.0f} GB/s  {e['median_ms']:.4f} ms  spread "
            f"{e['spread_pct']:.1f} %  vs copy {e['vs'].get('copy', math.nan):.3f}  err {e.get('max_rel_err') or 0:.2e}"
            f"  {e['variant'] or ''}")
    return list(entries.values())


def record(op: str, entries: list[dict], environment: dict, command: str, hashes: dict, gpu: str) -> dict:
    from hopattn.records import runs

    def clean(e):
        e = {k: v for k, v in e.items() if v is not None}
        for k in ("median_ms", "min_ms", "max_ms", "spread_pct", "gbps", "max_rel_err"):
            if k in e:
                e[k] = rowwise._round(e[k])
        if "vs" in e:
            e["vs"] = {k: rowwise._round(v, 4) for k, v in e["vs"].items()}
        if e["kind"] == "stage":
            e["source_hash"] = hashes[int(e["arm"].split()[1])]
        return e

    return {"schema_version": SCHEMA_VERSION, "op": op, "gpu": gpu, "run": runs.new_run(command, environment),
            "entries": [clean(e) for e in entries]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch
    from hopattn import lineage, rowwise_build
    from hopattn.records import files, results, runs

    sizes = rowwise._choose(args.sizes, SIZES, "sizes")
    peers = rowwise._choose(args.peers, PEERS, "peers")
    directions = ["forward", "backward"] if args.direction == "both" else [args.direction]
    command = "python -m bench.rowwise_softmax " + " ".join(argv if argv is not None else sys.argv[1:])
    log = Log()
    log.header(runs.log_header(command.strip()))
    if not torch.cuda.is_available():
        log("no CUDA GPU: nothing to measure")
        return 2
    from hopattn import softmax_ops as sm

    seed = args.seed if args.seed is not None else time.time_ns() % 2**31
    log(f"seed {seed}; directions {directions}; sizes {', '.join(sizes)}; peers {peers}; {args.rounds} rounds")
    rowwise_build.main(["--lineage", "softmax,softmax_backward"])
    timer = rowwise.ReadFlushTimer(torch)
    slug = results.gpu_slug(torch.cuda.get_device_name())
    for direction in directions:
        table = sm.stages() if direction == "forward" else sm.backward_stages()
        available = [s.number for s in table]
        stages = [] if args.stages.strip().lower() == "none" else lineage.parse_selection(args.stages, available)
        hashes = {s.number: s.source_hash() for s in table}
        op = DIRECTIONS[direction]
        out = RESULTS / op / f"{slug}.json"
        gen = torch.Generator(device="cuda").manual_seed(seed)
        before = env.read_clocks()
        entries = []
        for size in sizes:
            entries += measure_size(torch, log, timer, direction, size, stages, peers, args.rounds, args.launches, gen)
            torch.cuda.empty_cache()
            data = record(op, entries, env.collect(torch, before, env.read_clocks()), command.strip(), hashes, slug)
            files.write_atomic(out, json.dumps(data, indent=1, sort_keys=True) + "\n")
            log(f"wrote {runs.shown_path(out)} ({len(entries)} entries so far)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
