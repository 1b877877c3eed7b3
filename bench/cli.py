"""Command line of ``python -m bench``: parses the flags into runner.Options and runs."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from hopattn import lineage

from bench import backward, peers
from bench.shapes import (
    ALL_SHAPES,
    CAUSAL_CHOICES,
    DETERMINISTIC_CHOICES,
    QUICK_SHAPE,
    backward_shapes,
    parse_shapes,
    parse_stages,
)

RESULTS_DIR = Path(__file__).resolve().parent / "results"
WHAT = ("all", "forward", "backward")
BACKWARD_PEERS = backward.ORDER
FULL = {"rounds": 5, "launches": 10}
QUICK = {"rounds": 3, "launches": 5}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Check and time the attention stages against FlashAttention-3, FlashAttention-4, cuDNN, "
                    "FlashAttention-2, FlexAttention and memory-efficient SDPA in one process, then the backward "
                    "stages (each deterministic mode as its own entry) against the backwards of FlashAttention-3 "
                    "and -4, cuDNN and FlashAttention-2, timed alone; write bench/results/<gpu>.json.")
    p.add_argument("--what", choices=WHAT, default="all",
                   help="the passes to run: all (default: the forward, then the backward), forward, backward")
    p.add_argument("--stages", default=None, help="forward stages to run: 'all' (default), 'none', or e.g. '1,2,5-6'")
    p.add_argument("--peers", default=None,
                   help=f"forward peers to run: 'all' (default), 'none', or some of {','.join(peers.ORDER)}")
    p.add_argument("--backward-stages", default=None,
                   help="stages of the backward lineage (kernels/attention_backward) to run: 'all' (default), "
                        "'none', or e.g. '1'")
    p.add_argument("--backward-peers", default=None,
                   help=f"backward peers to run: 'all' (default), 'none', or some of {','.join(BACKWARD_PEERS)}")
    p.add_argument("--deterministic", choices=tuple(DETERMINISTIC_CHOICES), default="both",
                   help="modes of the backward stages: both (default: the default mode, and the deterministic mode "
                        "of each stage that has one, as an entry of its own), off (the default mode only), on (the "
                        "deterministic mode only)")
    p.add_argument("--shapes", default=None,
                   help=f"comma-separated, from {','.join(ALL_SHAPES)}, or a set: core (4k,8k,16k: every stage), "
                        f"users (the shapes beyond them: the full-contract stages and the reference peers), "
                        f"all (default; --quick: {QUICK_SHAPE}), head-dims (4k/8k/16k at head dims 64, 96, 128, "
                        f"192 with v 128 and 256, H*D = 2048: the stages that serve them and the peers; not in "
                        f"'all'; names like 8k-d64, 8k-d192v128), head-dims-8k (their 8k column); the backward "
                        f"runs the core ones among them")
    p.add_argument("--causal", choices=tuple(CAUSAL_CHOICES), default=None,
                   help="masks to run, both passes (default: both; --quick: off)")
    p.add_argument("--quick", action="store_true",
                   help=f"development loop: {QUICK_SHAPE} non-causal, {QUICK['rounds']} rounds of "
                        f"{QUICK['launches']} launches")
    p.add_argument("--reps", type=int, default=None,
                   help=f"rounds per shape (default {FULL['rounds']}; --quick {QUICK['rounds']})")
    p.add_argument("--launches", type=int, default=None,
                   help=f"timed launches per arm and round, the round's time is their median "
                        f"(default {FULL['launches']}; --quick {QUICK['launches']}; fewer for slow arms)")
    p.add_argument("--out", type=Path, default=None, help="results file (default bench/results/<gpu-slug>.json); "
                                                          "merged: this run's entries replace theirs")
    p.add_argument("--raw", type=Path, default=None, help="also write the run log and raw per-round timings here")
    p.add_argument("--seed", type=int, default=None, help="input seed (default: fresh each run; printed)")
    p.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes for the build")
    p.add_argument("--hang-timeout", type=float, default=300.0,
                   help="seconds one correctness check (including a peer's JIT compile) or one shape's timing may "
                        "take before the run saves what it has and exits with status 3 (0 = never; default 300)")
    return p


def parse_peers(text: str, order: tuple[str, ...] = peers.ORDER, flag: str = "--peers") -> list[str]:
    text = text.strip().lower()
    if text == "all":
        return list(order)
    if text == "none":
        return []
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in order]
    if unknown or not names:
        raise ValueError(f"{flag}: unknown peer {unknown[0] if unknown else text!r}; expected some of "
                         f"{', '.join(order)}, 'all' or 'none'")
    return [n for n in order if n in names]


def _backward_available() -> list[int]:
    return [s.number for s in lineage.discover(lineage.BACKWARD_DIR)]


def parse_options(argv: list[str], available_stages: list[int], available_backward: list[int] | None = None):
    """Flags -> runner.Options (ValueError with the flag's name on bad input). Needs no GPU: without
    --out, `out` stays None until default_out() can ask the GPU for its name. ``available_backward``:
    the backward lineage's stage numbers (default: as discovered)."""
    from bench.runner import Options

    args = build_parser().parse_args(argv)
    passes = {"all": ("forward", "backward"), "forward": ("forward",), "backward": ("backward",)}[args.what]
    for flag, value, part in (("--stages", args.stages, "forward"), ("--peers", args.peers, "forward"),
                              ("--backward-stages", args.backward_stages, "backward"),
                              ("--backward-peers", args.backward_peers, "backward")):
        if value is not None and part not in passes:
            raise ValueError(f"{flag}: selects {part} arms, and --what {args.what} runs no {part} pass")
    mode = QUICK if args.quick else FULL
    shapes = parse_shapes(args.shapes if args.shapes is not None else (QUICK_SHAPE if args.quick else "all"))
    causal = CAUSAL_CHOICES[args.causal or ("off" if args.quick else "both")]
    rounds = mode["rounds"] if args.reps is None else args.reps
    launches = mode["launches"] if args.launches is None else args.launches
    if rounds < 1:
        raise ValueError(f"--reps: expected at least 1 round, got {rounds}")
    if launches < 1:
        raise ValueError(f"--launches: expected at least 1, got {launches}")
    if args.hang_timeout < 0:
        raise ValueError(f"--hang-timeout: expected seconds >= 0, got {args.hang_timeout:g}")
    forward = "forward" in passes
    stages_text = (args.stages or "all") if forward else "none"
    stages = parse_stages(stages_text, available_stages)
    peer_names = parse_peers(args.peers or "all") if forward else []
    bwd_stages, bwd_peers = [], []
    if "backward" in passes:
        text = (args.backward_stages or "all").strip().lower()
        if text == "all":  # None: every stage the run finds (the lineage is read there, not here)
            bwd_stages = None
        else:
            available = _backward_available() if available_backward is None else available_backward
            try:
                bwd_stages = lineage.parse_selection(text, available)
            except ValueError as err:
                raise ValueError(f"--backward-stages: {err}") from None
        bwd_peers = parse_peers(args.backward_peers or "all", BACKWARD_PEERS, "--backward-peers")
        if args.what == "backward" and not backward_shapes(shapes):
            raise ValueError(f"--shapes: the backward runs the core shapes (4k, 8k, 16k); none of "
                             f"{', '.join(s.name for s in shapes)} is one")
    out = args.out
    return Options(stages=None if stages_text.strip().lower() == "all" else stages, peers=peer_names,
                   shapes=shapes, causal=causal, rounds=rounds, launches=launches, out=out, raw=args.raw,
                   seed=args.seed, jobs=args.jobs, hang_timeout=args.hang_timeout,
                   command=shlex.join(["python", "-m", "bench", *argv]),
                   backward_stages=bwd_stages, backward_peers=bwd_peers, backward_shapes=backward_shapes(shapes),
                   deterministic=DETERMINISTIC_CHOICES[args.deterministic])


def default_out(gpu_name: str) -> Path:
    from hopattn.records.results import gpu_slug

    return RESULTS_DIR / f"{gpu_slug(gpu_name)}.json"


def main(argv: list[str] | None = None) -> int:
    from hopattn.records import runs

    from bench.report import Log

    argv = list(sys.argv[1:] if argv is None else argv)
    available = [s.number for s in lineage.discover()]
    parser = build_parser()
    try:  # flag errors first, before anything imports torch
        opts = parse_options(argv, available)
    except ValueError as err:
        parser.error(str(err))
    log = Log()
    log.header(runs.log_header(opts.command))  # first: a log kept under bench/logs says what made it
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        print("python -m bench: torch is not installed; the benchmark needs torch with CUDA", file=sys.stderr)
        return 2
    if not has_gpu:
        print("python -m bench: no CUDA GPU visible to torch; the benchmark needs one (nothing written)",
              file=sys.stderr)
        return 2
    if opts.out is None:
        opts.out = default_out(torch.cuda.get_device_name(torch.cuda.current_device()))
    from bench.runner import run

    return run(opts, log)
