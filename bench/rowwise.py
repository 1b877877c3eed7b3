"""python -m bench.rowwise: the RMSNorm stages (Part II) against the copy ceiling, eager torch,
torch.compile, Liger and QuACK, in one process, at rows of 4k to 256k bf16 columns.

Each size moves at least 64 MB (512 MB of input and as much output at 8k-256k; 256 MB at 4k: the
shapes of the numbers to beat). Every arm is checked against float64 on sampled rows first, then
timed: rounds in alternating arm order, each arm warmed for WARM_MS, then LAUNCHES launches each
after an L2 flush, a round's time the median of its launches. GB/s = (bytes of x read + bytes of
out written) / median time (the weight and rstd, a row's worth, are not counted). Ratios are
medians of per-round ratios, against the copy and each peer of the same run. The record goes to
bench/results/rmsnorm/<gpu>.json (apart from the attention results, which bench/results/*.json
holds), with the environment, the git commit and each stage's source hash.

    python -m bench.rowwise                         # every stage and peer, every size
    python -m bench.rowwise --sizes 4k,256k --stages 4-5 --peers eager,quack
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from hopattn.records import rowwise as rowwise_records

from bench import env, stats, timing
from bench.report import Log
from bench.rowwise_arms import PEERS, Arm, copy_arm, peer_arm, stage_arm

SCHEMA_VERSION = 1
SIZES = rowwise_records.SIZES  # size -> (rows, columns), shared with the site's figures
EPS = 1e-6
WARM_MS = 30.0       # per arm and round (timing.WARM_MS is 300: too long for 5 sizes x 11 arms)
BUDGET_MS = 120.0    # timed launches per arm-round stay near this (a slow stage gets fewer)
CHECK_ROWS = 64      # rows of each arm's output compared with float64
RESULTS = Path(__file__).resolve().parent / "results" / "rmsnorm"


class ReadFlushTimer(timing.Timer):
    """timing.Timer with an L2 flush that reads: summing the buffer evicts the previous launch's
    lines and leaves clean ones behind. The inherited flush writes the buffer, and up to 50 MB of
    its dirty lines would then be written back during the timed launch — 5 % of a 1 GB RMSNorm."""

    def flush(self) -> None:
        self.flush_buffer.sum(dtype=self.torch.int32)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.rowwise", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="all", help=f"comma-separated from {','.join(SIZES)}, or all")
    p.add_argument("--stages", default="all", help="RMSNorm stages: all, none, or e.g. 1,4-5")
    p.add_argument("--peers", default="all", help=f"all, none, or some of {','.join(PEERS)}")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--launches", type=int, default=10, help="timed launches per arm and round (at most)")
    p.add_argument("--out", type=Path, default=None, help="record (default bench/results/rmsnorm/<gpu>.json)")
    p.add_argument("--seed", type=int, default=None, help="input seed (default: fresh, printed)")
    return p.parse_args(argv)


def _choose(text: str, options, what: str) -> list:
    if text.strip().lower() == "all":
        return list(options)
    if text.strip().lower() == "none":
        return []
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in options]
    if unknown:
        raise SystemExit(f"--{what}: unknown {unknown[0]!r}; expected some of {', '.join(options)}, all or none")
    return [n for n in options if n in names]


def max_rel_err(torch, out, x, w) -> float:
    """Largest |out - float64| over sampled rows, relative to the largest |float64| there."""
    rows = torch.linspace(0, x.shape[0] - 1, min(CHECK_ROWS, x.shape[0]), device=x.device).long()
    xd = x[rows].double()
    ref = xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + EPS) * w.double()
    return ((out[rows].double() - ref).abs().max() / ref.abs().max()).item()


def _round(v, digits=6):
    return None if v is None else float(f"{v:.{digits}g}")


def measure_size(torch, log, timer, size: str, stages: list, peers: list, rounds: int, launches: int, gen) -> list[dict]:
    from hopattn import rmsnorm

    rows, cols = SIZES[size]
    x = torch.randn(rows, cols, generator=gen, device="cuda").to(torch.bfloat16)
    w = (1 + 0.5 * torch.randn(cols, generator=gen, device="cuda")).to(torch.bfloat16)
    moved = 2 * x.numel() * x.element_size()
    arms: list[Arm] = [copy_arm(torch, x)]
    arms += [stage_arm(torch, rmsnorm, n, x, w, EPS) for n in stages]
    arms += [peer_arm(torch, name, x, w, EPS) for name in peers]
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
            err = None if arm.output is None else max_rel_err(torch, arm.output(), x, w)
            first = timer.one(arm.launch)
        except Exception as exc:  # noqa: BLE001  (recorded with the reason; the run goes on)
            entries[arm.key] = dict(base, status="error", reason=f"{type(exc).__name__}: {str(exc)[:300]}")
            log(f"{size} {arm.key}: error ({entries[arm.key]['reason']})")
            continue
        entries[arm.key] = dict(base, status="ok", max_rel_err=err)
        live[arm.key] = (arm, first)
    counts = {k: timing.launches_for(first, launches, BUDGET_MS) for k, (_, first) in live.items()}
    warm = {k: timing.warm_launches(first, WARM_MS) for k, (_, first) in live.items()}
    result = timing.run_rounds(timer, {k: a.launch for k, (a, _) in live.items()}, rounds, counts, warm=warm)
    round_ms = result["round_ms"]
    for key in live:
        e = entries[key]
        e.update(stats.summarize(round_ms[key]))
        e["gbps"] = moved / (e["median_ms"] * 1e-3) / 1e9
        e["vs"] = {ref: stats.ratio(round_ms[key], round_ms[ref]) for ref in live if ref != key}
        log(f"{size} {key:9s} {e['gbps']:7.0f} GB/s  {e['median_ms']:.4f} ms  spread {e['spread_pct']:.1f} %  "
            f"vs copy {e['vs'].get('copy', math.nan):.3f}  err {e.get('max_rel_err') or 0:.2e}  {e['variant'] or ''}")
    return list(entries.values())


def record(entries: list[dict], environment: dict, command: str, stages: dict, gpu: str) -> dict:
    from hopattn.records import runs

    def clean(e):
        e = {k: v for k, v in e.items() if v is not None}
        for k in ("median_ms", "min_ms", "max_ms", "spread_pct", "gbps", "max_rel_err"):
            if k in e:
                e[k] = _round(e[k])
        if "vs" in e:
            e["vs"] = {k: _round(v, 4) for k, v in e["vs"].items()}
        if e["kind"] == "stage":
            e["source_hash"] = stages[int(e["arm"].split()[1])]
        return e

    return {"schema_version": SCHEMA_VERSION, "op": "rmsnorm", "gpu": gpu, "run": runs.new_run(command, environment),
            "entries": [clean(e) for e in entries]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch
    from hopattn import lineage, rmsnorm, rowwise_build
    from hopattn.records import files, results, runs

    sizes = _choose(args.sizes, SIZES, "sizes")
    peers = _choose(args.peers, PEERS, "peers")
    available = [s.number for s in rmsnorm.stages()]
    stages = [] if args.stages.strip().lower() == "none" else lineage.parse_selection(args.stages, available)
    command = "python -m bench.rowwise " + " ".join(argv if argv is not None else sys.argv[1:])
    log = Log()
    log.header(runs.log_header(command.strip()))
    if not torch.cuda.is_available():
        log("no CUDA GPU: nothing to measure")
        return 2
    seed = args.seed if args.seed is not None else time.time_ns() % 2**31
    log(f"seed {seed}; sizes {', '.join(sizes)}; stages {stages}; peers {peers}; {args.rounds} rounds")
    rowwise_build.main([str(n) for n in stages] or ["1"])
    gen = torch.Generator(device="cuda").manual_seed(seed)
    timer = ReadFlushTimer(torch)
    before = env.read_clocks()
    entries = []
    for size in sizes:
        entries += measure_size(torch, log, timer, size, stages, peers, args.rounds, args.launches, gen)
        torch.cuda.empty_cache()
    environment = env.collect(torch, before, env.read_clocks())
    slug = results.gpu_slug(torch.cuda.get_device_name())
    data = record(entries, environment, command.strip(), {s.number: s.source_hash() for s in rmsnorm.stages()}, slug)
    out = args.out or RESULTS / f"{slug}.json"
    files.write_atomic(out, json.dumps(data, indent=1, sort_keys=True) + "\n")
    log(f"wrote {runs.shown_path(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
