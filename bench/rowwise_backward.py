"""python -m bench.rowwise_backward: the RMSNorm backward stages (Part II) against the copy ceiling and
the backward of eager torch, torch.compile, Liger and QuACK, in one process, at rows of 4k to 256k
bf16 columns (bench.rowwise's sizes).

The same method as the forward's benchmark (bench.rowwise): every arm checked against float64 first
(dx on sampled rows, dw over every row), then rounds in alternating arm order, each arm warmed, then
timed launches each after an L2 flush that reads. GB/s = (bytes of x and dy read + bytes of dx
written) / median time (the weight, rstd and dw, a row's worth each, are not counted; a stage's dw
partials are its own overhead); the copy arm moves as many bytes. Ratios are medians of per-round
ratios against each other arm of the same run. The record goes to
bench/results/rmsnorm_backward/<gpu>.json — written after every size, so a run stopped by its time
limit keeps the sizes it finished — with the environment, the git commit and each stage's source hash.

    python -m bench.rowwise_backward                          # every stage and peer, every size
    python -m bench.rowwise_backward --sizes 4k,256k --stages 3-4 --peers eager,quack
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
from bench.rowwise_backward_arms import PEERS, copy_arm, peer_arm, stage_arm

OP = "rmsnorm_backward"
SCHEMA_VERSION = rowwise.SCHEMA_VERSION
SIZES = rowwise.SIZES
EPS = rowwise.EPS
CHECK_ROWS = rowwise.CHECK_ROWS
DW_CHUNK_ELEMENTS = 1 << 25  # the float64 dw reference, a few rows at a time (256 MB a temporary)
RESULTS = Path(__file__).resolve().parent / "results" / OP


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.rowwise_backward", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="all", help=f"comma-separated from {','.join(SIZES)}, or all")
    p.add_argument("--stages", default="all", help="RMSNorm backward stages: all, none, or e.g. 2-4")
    p.add_argument("--peers", default="all", help=f"all, none, or some of {','.join(PEERS)}")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--launches", type=int, default=10, help="timed launches per arm and round (at most)")
    p.add_argument("--out", type=Path, default=None, help=f"record (default bench/results/{OP}/<gpu>.json)")
    p.add_argument("--seed", type=int, default=None, help="input seed (default: fresh, printed)")
    return p.parse_args(argv)


def references(torch, x, w, dy, rstd):
    """float64 dx on sampled rows (and which rows), and dw over every row (in chunks)."""
    rows = torch.linspace(0, x.shape[0] - 1, min(CHECK_ROWS, x.shape[0]), device=x.device).long()

    def dx_of(xs, ds, rs):
        xd, g, r = xs.double(), ds.double() * w.double(), rs.double().unsqueeze(-1)
        m = r * (xd * g).sum(-1, keepdim=True) / x.shape[-1]
        return r * (g - xd * r * m)

    dw = torch.zeros(x.shape[-1], dtype=torch.float64, device=x.device)
    chunk = max(1, DW_CHUNK_ELEMENTS // x.shape[-1])
    for start in range(0, x.shape[0], chunk):
        sl = slice(start, start + chunk)
        dw += (dy[sl].double() * x[sl].double() * rstd[sl].double().unsqueeze(-1)).sum(0)
    return rows, dx_of(x[rows], dy[rows], rstd[rows]), dw


def rel_errs(torch, grads, refs) -> tuple[float, float]:
    """Largest |dx - float64| over the sampled rows and |dw - float64| over the columns, each relative
    to the largest |float64| there."""
    rows, ref_dx, ref_dw = refs
    dx, dw = grads
    ex = ((dx[rows].double() - ref_dx).abs().max() / ref_dx.abs().max()).item()
    ew = ((dw.double() - ref_dw).abs().max() / ref_dw.abs().max()).item()
    return ex, ew


def measure_size(torch, log, timer, size: str, stages: list, peers: list, rounds: int, launches: int, gen) -> list[dict]:
    from hopattn import rmsnorm

    rows, cols = SIZES[size]
    x = torch.randn(rows, cols, generator=gen, device="cuda").to(torch.bfloat16)
    w = (1 + 0.5 * torch.randn(cols, generator=gen, device="cuda")).to(torch.bfloat16)
    dy = torch.randn(rows, cols, generator=gen, device="cuda").to(torch.bfloat16)
    _, rstd = rmsnorm.rms_norm(x, w, EPS, return_rstd=True)
    refs = references(torch, x, w, dy, rstd)
    moved = 3 * x.numel() * x.element_size()
    arms = [copy_arm(torch, x)]
    arms += [stage_arm(torch, rmsnorm, n, x, w, dy, rstd) for n in stages]
    arms += [peer_arm(torch, name, x, w, dy, EPS) for name in peers]
    entries, live = {}, {}
    for arm in arms:
        base = {"size": size, "rows": rows, "cols": cols, "dtype": "bf16", "arm": arm.key, "kind": arm.kind,
                "bytes": moved, "variant": arm.variant}
        if arm.launch is None:
            entries[arm.key] = dict(base, status="missing", reason=arm.reason)
            log(f"{size} {arm.key}: missing ({arm.reason})")
            continue
        try:
            arm.launch()
            torch.cuda.synchronize()
            errs = (None, None) if arm.output is None else rel_errs(torch, arm.output(), refs)
            first = timer.one(arm.launch)
        except Exception as exc:  # noqa: BLE001  (recorded with the reason; the run goes on)
            entries[arm.key] = dict(base, status="error", reason=f"{type(exc).__name__}: {str(exc)[:300]}")
            log(f"{size} {arm.key}: error ({entries[arm.key]['reason']})")
            continue
        entries[arm.key] = dict(base, status="ok", max_rel_err=errs[0], dw_rel_err=errs[1])
        live[arm.key] = (arm, first)
    counts = {k: timing.launches_for(first, launches, rowwise.BUDGET_MS) for k, (_, first) in live.items()}
    warm = {k: timing.warm_launches(first, rowwise.WARM_MS) for k, (_, first) in live.items()}
    result = timing.run_rounds(timer, {k: a.launch for k, (a, _) in live.items()}, rounds, counts, warm=warm)
    round_ms = result["round_ms"]
    for key in live:
        e = entries[key]
        e.update(stats.summarize(round_ms[key]))
        e["gbps"] = moved / (e["median_ms"] * 1e-3) / 1e9
        e["vs"] = {ref: stats.ratio(round_ms[key], round_ms[ref]) for ref in live if ref != key}
        log(f"{size} {key:9s} {e['gbps']:7.0f} GB/s  {e['median_ms']:.4f} ms  spread {e['spread_pct']:.1f} %  "
            f"vs copy {e['vs'].get('copy', math.nan):.3f}  err dx {e.get('max_rel_err') or 0:.2e} "
            f"dw {e.get('dw_rel_err') or 0:.2e}  {e['variant'] or ''}")
    return list(entries.values())


def record(entries: list[dict], environment: dict, command: str, stages: dict, gpu: str) -> dict:
    from hopattn.records import runs

    def clean(e):
        e = {k: v for k, v in e.items() if v is not None}
        for k in ("median_ms", "min_ms", "max_ms", "spread_pct", "gbps", "max_rel_err", "dw_rel_err"):
            if k in e:
                e[k] = rowwise._round(e[k])
        if "vs" in e:
            e["vs"] = {k: rowwise._round(v, 4) for k, v in e["vs"].items()}
        if e["kind"] == "stage":
            e["source_hash"] = stages[int(e["arm"].split()[1])]
        return e

    return {"schema_version": SCHEMA_VERSION, "op": OP, "gpu": gpu, "run": runs.new_run(command, environment),
            "entries": [clean(e) for e in entries]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch
    from hopattn import lineage, rmsnorm, rowwise_build
    from hopattn.records import files, results, runs

    sizes = rowwise._choose(args.sizes, SIZES, "sizes")
    peers = rowwise._choose(args.peers, PEERS, "peers")
    available = [s.number for s in rmsnorm.backward_stages()]
    stages = [] if args.stages.strip().lower() == "none" else lineage.parse_selection(args.stages, available)
    command = "python -m bench.rowwise_backward " + " ".join(argv if argv is not None else sys.argv[1:])
    log = Log()
    log.header(runs.log_header(command.strip()))
    if not torch.cuda.is_available():
        log("no CUDA GPU: nothing to measure")
        return 2
    seed = args.seed if args.seed is not None else time.time_ns() % 2**31
    log(f"seed {seed}; sizes {', '.join(sizes)}; stages {stages}; peers {peers}; {args.rounds} rounds")
    if stages:
        rowwise_build.main(["--lineage", "rmsnorm_backward", *[str(n) for n in stages]])
    rowwise_build.main([str(rmsnorm.final_stage())])  # the forward that makes rstd
    gen = torch.Generator(device="cuda").manual_seed(seed)
    timer = rowwise.ReadFlushTimer(torch)
    before = env.read_clocks()
    slug = results.gpu_slug(torch.cuda.get_device_name())
    out = args.out or RESULTS / f"{slug}.json"
    hashes = {s.number: s.source_hash() for s in rmsnorm.backward_stages()}
    entries = []
    for size in sizes:
        entries += measure_size(torch, log, timer, size, stages, peers, args.rounds, args.launches, gen)
        torch.cuda.empty_cache()
        environment = env.collect(torch, before, env.read_clocks())
        files.write_atomic(out, json.dumps(record(entries, environment, command.strip(), hashes, slug), indent=1,
                                           sort_keys=True) + "\n")
        log(f"wrote {runs.shown_path(out)} ({len(entries)} entries so far)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
