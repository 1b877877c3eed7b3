"""python -m bench.rowwise_cross_entropy: the cross-entropy stages (Part II, kernels/cross_entropy) against
the copy ceiling, eager torch, torch.compile, Liger and
QuACK, in one process, at rows of 4k to 256k bf16 classes (32k and 128k: the sizes of the numbers to
beat), each size 128 MB of logits.

Three directions, each with its own byte count (the same for every arm of it; the copy arm moves as
many bytes, half read and half written):

  forward   loss and lse per row, no gradient: the logits read, targets read, loss and lse written
            (N·V·e + 16·N). QuACK: cross_entropy_fwd(return_lse=True); eager and compile:
            F.cross_entropy(reduction="none"); Liger has no forward without its gradient (missing).
  fused     loss, lse and dlogits in one launch: the logits read and dlogits written (2·N·V·e + 16·N).
            QuACK: cross_entropy_fwd(return_lse=True, return_dx=True); Liger: liger_cross_entropy on
            logits that require grad (its forward writes the gradient into them); eager and compile:
            the forward and torch.autograd.grad of the mean.
  backward  dlogits for a given per-row dloss, lse recomputed (the stages) or read (QuACK):
            2·N·V·e + 16·N. QuACK: cross_entropy_bwd; eager and compile: torch.autograd.grad of the
            saved forward graph (retain_graph); Liger: none (its backward is a scale; missing).

The method is bench.rowwise's: every arm checked against float64 on sampled rows first, then rounds
in alternating arm order, each arm warmed, then timed launches each after an L2 flush that reads.
GB/s = bytes / median time. Records: bench/results/cross_entropy_<direction>/<gpu>.json (under --out),
written after every size; the site's pages show the fused one.

    python -m bench.rowwise_cross_entropy                                   # every direction and size
    python -m bench.rowwise_cross_entropy --direction fused --sizes 32k,128k --peers quack
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
# The sizes to beat first (a run stopped by its time limit keeps the sizes it finished).
SIZES = {"32k": (2048, 32768), "128k": (512, 131072), "4k": (16384, 4096), "16k": (4096, 16384),
         "256k": (256, 262144)}
PEERS = ("eager", "compile", "liger", "quack")
DIRECTIONS = ("fused", "forward", "backward")  # the fused forward first: what a training step runs
CHECK_ROWS = rowwise.CHECK_ROWS
RESULTS = Path(__file__).resolve().parent / "results"  # bench/results: cross_entropy_<direction>/<gpu>.json


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.rowwise_cross_entropy", description=__doc__.splitlines()[0])
    p.add_argument("--direction", default="all", help=f"all, or some of {','.join(DIRECTIONS)}")
    p.add_argument("--sizes", default="all", help=f"comma-separated from {','.join(SIZES)}, or all")
    p.add_argument("--stages", default="all", help="stages: all, none, or e.g. 2-4")
    p.add_argument("--peers", default="all", help=f"all, none, or some of {','.join(PEERS)}")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--launches", type=int, default=10, help="timed launches per arm and round (at most)")
    p.add_argument("--seed", type=int, default=None, help="input seed (default: fresh, printed)")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the records go (cross_entropy_<direction>/<gpu>.json under it)")
    return p.parse_args(argv)


def moved_bytes(rows: int, cols: int, element_size: int, direction: str) -> int:
    """The bytes a direction must move: the logits once (forward) or read and written (fused, backward),
    plus 16 bytes a row (targets; loss and lse, or dloss and loss)."""
    return rows * cols * element_size * (1 if direction == "forward" else 2) + 16 * rows


def _peer_arm(torch, name: str, direction: str, x, t, dloss) -> Arm:
    import torch.nn.functional as F

    state = {}
    if name in ("eager", "compile"):
        def ce_rows(a, b):
            return F.cross_entropy(a, b, reduction="none")
        fn = ce_rows if name == "eager" else torch.compile(ce_rows, dynamic=False, fullgraph=True)
        if direction == "forward":
            def launch():
                state["out"] = (fn(x, t), None)
        elif direction == "fused":
            xr = x.detach().clone().requires_grad_()

            def launch():
                loss = fn(xr, t)
                state["out"] = (loss, torch.autograd.grad(loss.sum(), (xr,))[0])
        else:
            xr = x.detach().clone().requires_grad_()

            def launch():
                if "graph" not in state:
                    state["graph"] = fn(xr, t)
                state["out"] = (None, torch.autograd.grad(state["graph"], (xr,), dloss, retain_graph=True)[0])
        return Arm(name, "peer", launch, lambda: state.get("out"))
    if name == "liger":
        if direction != "fused":
            return Arm(name, "peer", None, reason=f"Liger has no {direction} of its own (its forward writes the "
                                                  f"gradient, its backward scales it)")
        from liger_kernel.transformers.functional import liger_cross_entropy

        xr = x.detach().clone().requires_grad_()

        def launch():  # overwrites xr with its gradient: the first (checked) call reads the logits
            loss = liger_cross_entropy(xr, t, reduction="sum")
            state["out"] = (None, xr.detach())
            return loss
        return Arm(name, "peer", launch, lambda: state.get("out"))
    if name == "quack":
        from quack.cross_entropy import cross_entropy_bwd, cross_entropy_fwd

        if direction == "forward":
            def launch():
                loss, _ = cross_entropy_fwd(x, t, return_lse=True)
                state["out"] = (loss, None)
        elif direction == "fused":
            def launch():
                loss, _, dx = cross_entropy_fwd(x, t, return_lse=True, return_dx=True)
                state["out"] = (loss, dx)
        else:
            _, lse = cross_entropy_fwd(x, t, return_lse=True)

            def launch():
                state["out"] = (None, cross_entropy_bwd(x, t, dloss, lse))
        return Arm(name, "peer", launch, lambda: state.get("out"))
    raise ValueError(f"unknown peer {name!r}; expected one of {', '.join(PEERS)}")


def arms_for(torch, ce, direction: str, stages: list, peers: list, x, t, dloss) -> list[Arm]:
    moved = moved_bytes(x.shape[0], x.shape[1], x.element_size(), direction)
    src = torch.empty(moved // 2, dtype=torch.uint8, device=x.device)
    dst = torch.empty_like(src)
    arms = [Arm("copy", "ceiling", lambda: dst.copy_(src), None)]
    rows = x.shape[0]
    for n in stages:
        loss = torch.empty(rows, dtype=torch.float32, device=x.device)
        lse = torch.empty(rows, dtype=torch.float32, device=x.device) if direction != "backward" else None
        dl = torch.empty_like(x) if direction != "forward" else None
        g = dloss if direction == "backward" else None
        info = ce.stage_info(n, x.shape[-1], x.dtype, direction != "forward")
        arms.append(Arm(f"stage {n:02d}", "stage",
                        lambda n=n, loss=loss, lse=lse, dl=dl, g=g: ce._cross_entropy_into(x, t, loss, lse, dl,
                                                                                         stage=n, dloss=g),
                        lambda loss=loss, dl=dl, direction=direction: (None if direction == "backward" else loss, dl),
                        variant=info["variant"]))
    for name in peers:
        try:
            arms.append(_peer_arm(torch, name, direction, x, t, dloss))
        except ImportError as err:
            arms.append(Arm(name, "peer", None, reason=f"not importable: {err}"))
    return arms


def rel_err(torch, ce, direction: str, got, x, t, dloss) -> float:
    """The largest error of the arm's loss and gradient over sampled rows, relative to the largest
    float64 value."""
    rows = torch.linspace(0, x.shape[0] - 1, min(CHECK_ROWS, x.shape[0]), device=x.device).long()
    loss, grad = got
    ref_loss, _, ref_grad = ce.reference(x[rows], t[rows], -100, 0.0, None if dloss is None else dloss[rows])
    err = 0.0
    if loss is not None:
        err = max(err, ((loss[rows].double() - ref_loss).abs().max() / ref_loss.abs().max()).item())
    if grad is not None and direction != "forward":
        err = max(err, ((grad[rows].double() - ref_grad).abs().max() / ref_grad.abs().max()).item())
    return err


def measure_size(torch, log, timer, direction: str, size: str, stages, peers, rounds, launches, gen) -> list[dict]:
    from hopattn import cross_entropy_ops as ce

    rows, cols = SIZES[size]
    x = (2 * torch.randn(rows, cols, generator=gen, device="cuda")).to(torch.bfloat16)
    t = torch.randint(0, cols, (rows,), generator=gen, device="cuda")
    t[::7] = -100
    dloss = torch.randn(rows, generator=gen, device="cuda") if direction == "backward" else None
    moved = moved_bytes(rows, cols, x.element_size(), direction)
    entries, live = {}, {}
    for arm in arms_for(torch, ce, direction, stages, peers, x, t, dloss):
        base = {"size": size, "rows": rows, "cols": cols, "dtype": "bf16", "arm": arm.key, "kind": arm.kind,
                "bytes": moved, "variant": arm.variant, "direction": direction}
        if arm.launch is None:
            entries[arm.key] = dict(base, status="missing", reason=arm.reason)
            log(f"{direction} {size} {arm.key}: missing ({arm.reason})")
            continue
        try:
            arm.launch()
            torch.cuda.synchronize()
            err = None if arm.output is None else rel_err(torch, ce, direction, arm.output(), x, t, dloss)
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
    directions = rowwise._choose(args.direction, DIRECTIONS, "direction")
    command = "python -m bench.rowwise_cross_entropy " + " ".join(argv if argv is not None else sys.argv[1:])
    log = Log()
    log.header(runs.log_header(command.strip()))
    if not torch.cuda.is_available():
        log("no CUDA GPU: nothing to measure")
        return 2
    from hopattn import cross_entropy_ops as ce

    seed = args.seed if args.seed is not None else time.time_ns() % 2**31
    log(f"seed {seed}; directions {directions}; sizes {', '.join(sizes)}; peers {peers}; {args.rounds} rounds; "
        f"stages from {ce.stages()[0].dir.parent}")
    rowwise_build.build_all(ce.stages())
    ce.build_native()
    timer = rowwise.ReadFlushTimer(torch)
    slug = results.gpu_slug(torch.cuda.get_device_name())
    table = ce.stages()
    available = [s.number for s in table]
    stages = [] if args.stages.strip().lower() == "none" else lineage.parse_selection(args.stages, available)
    hashes = {s.number: s.source_hash() for s in table}
    for direction in directions:
        op = f"cross_entropy_{direction}"
        out = Path(args.out) / op / f"{slug}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        gen = torch.Generator(device="cuda").manual_seed(seed)
        before = env.read_clocks()
        entries = []
        for size in sizes:
            entries += measure_size(torch, log, timer, direction, size, stages, peers, args.rounds, args.launches, gen)
            torch.cuda.empty_cache()
            data = record(op, entries, env.collect(torch, before, env.read_clocks()), command.strip(), hashes, slug)
            files.write_atomic(out, json.dumps(data, indent=1, sort_keys=True) + "\n")
            log(f"wrote {out} ({len(entries)} entries so far)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
