"""The trace producer (needs a GPU): per-warp timelines of every stage, recorded by its trace points.

    python -m bench.trace                    # every stage: 8k non-causal, and causal from stage 17 on
    python -m bench.trace --stages 19-20     # some stages
    python -m bench.trace --stages 24 --head-dim 256   # at another head dim the stages serve (stage 24's)
    python -m bench.trace --lineage backward [--stages 3]   # the backward's (bench/trace_backward.py)

Each stage is compiled a second time with -DHOPATTN_TRACE (common/trace.cuh): the warps of the CTAs
that run on one SM record the SM clock at the end of their events (a K/V step's events as boundary
stamps, stored once a step; the others with their start too), a persistent stage's CTA its first
output tiles only, the ones the timeline's window shows. The producer launches it at the fixed shape,
reads the records back, converts cycles to nanoseconds with the SM clock over the traced CTAs' run (each
CTA's clock and global timer at its start and at the end of its last epilogue), and
writes one committed record per stage and mask through hopattn.records.traces
(bench/results/traces/<gpu>/<NN>[-d<head dim>][-causal].json, no -d at head dim 128): a window of the
steady state with a tile boundary in it, the median time per K/V step, per-event statistics over everything recorded, and what
recording costs: the traced build's kernel time against the untraced build's (interleaved, same
process), recording and recording nothing (the trace points alone), and the time per K/V step with
every event recorded against the time per step with the step records alone.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

from hopattn import build, lineage
from hopattn.records import runs, traces

from . import env, shapes

TARGET_SM = 0
MAX_CTAS = 8  # CTAs traced on the target SM: the first to start there (non-persistent stages keep several)
PERSISTENT_TILES = 3  # output tiles a persistent CTA records: the window needs the first boundary
SHAPE = shapes.SHAPES["8k"]
OVERHEAD_ROUNDS = 9  # interleaved rounds of 10 launches: the spread of their ratios goes in the record


def _launcher(torch, lib, q, k, v, out, causal):
    b, h, lq, d = q.shape
    st_q, st_k, st_v, st_o = (t.stride()[:3] for t in (q, k, v, out))
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def run():
        lib.launch(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), st_q, st_k, st_v, st_o, b, h, lq, lq, d,
                   1 / math.sqrt(d), causal, sms, torch.cuda.current_stream().cuda_stream, h, 0)
    return run


def trace_shape(stage: lineage.Stage) -> shapes.Shape:
    """The shape a stage is traced at: 8k (B 4, H 16, D 128), at another head dim the issue's 8k point
    of it (H·D = 2048: 8k-d256 is B 4, H 8)."""
    if stage.head_dim == traces.HEAD_DIM:
        return SHAPE
    dv = stage.head_dim_v(stage.head_dim)  # the point of the head dim: 8k-d256, 8k-d192v128
    return shapes.HEAD_DIM_SHAPES[f"8k-d{stage.head_dim}" + (f"v{dv}" if dv != stage.head_dim else "")]


def record_shape(shape: shapes.Shape) -> dict:
    """The shape as a record holds it: its dims (the head dim among them), and V's where it is not q's."""
    return dict(shape.dims, **({"head_dim_v": shape.dv} if shape.dv != shape.head_dim else {}))


def _median_ms(torch, fn, before=None, n=10) -> float:
    """Median of n launches timed with CUDA events; `before` runs ahead of each, outside the events."""
    times = []
    for _ in range(n):
        if before is not None:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _sm_mhz(torch, bases, ends) -> tuple[float, str]:
    """The SM clock during the launch, and where it came from: each CTA's (clock64, globaltimer) at
    its start and at the end of its last epilogue (the median over the CTAs); else the CTAs' start
    pairs when several CTAs started at different times; else as the driver reports it right after
    the launch."""
    spans = [(int(c1) - int(c0), int(n1) - int(n0)) for (c0, n0), (c1, n1) in zip(bases, ends)]
    rates = [clk / ns * 1000.0 for clk, ns in spans if ns > 20_000 and clk > 0]  # 20 us at least
    if rates:
        return statistics.median(rates), "each CTA's start and last epilogue"
    pairs = sorted((int(ns), int(clk)) for clk, ns in bases)
    if len(pairs) >= 2 and pairs[-1][0] - pairs[0][0] > 20_000:
        return (pairs[-1][1] - pairs[0][1]) / (pairs[-1][0] - pairs[0][0]) * 1000.0, "the CTAs' starts"
    try:
        return float(torch.cuda.clock_rate()), "the driver, after the launch"
    except Exception:  # noqa: BLE001  (no NVML): nvidia-smi's reading
        return float(env.read_clocks()["sm_mhz"]), "nvidia-smi, after the launch"


def _bit(name: str) -> int:
    return 1 << (traces.EVENTS.index(name) + 1)


def kind_masks(stage: lineage.Stage, light: bool = False) -> list[int]:
    """The event kinds each warp records (bit e: event e, as common/trace_recorder.cuh counts them).
    light: only QKᵀ, on the warps that record it: with boundary stamps, the step records alone (a
    stamp kind enables them) and none of the other events, to time the steps with one record each."""
    everything = sum(_bit(e) for e in traces.EVENTS)
    masks = [everything] * (stage.threads // 32)
    if light:
        masks = [m & _bit("qk") for m in masks]
    return masks


def records_per_warp(stage: lineage.Stage, capacity: int) -> int:
    """A persistent CTA's first PERSISTENT_TILES output tiles (up to 12 events per K/V step, and a
    few per tile), else everything that fits."""
    if not stage.persistent:
        return capacity
    steps = math.ceil(trace_shape(stage).len_k / stage.block_n)
    return min(capacity, PERSISTENT_TILES * (12 * steps + 16))


def trace_stage(torch, stage: lineage.Stage, causal: bool) -> dict:
    """``stage`` at the head dim to trace (Stage.at_head_dim): its tile sets the records' size."""
    from hopattn import api

    native = api._native()
    plain = native.StageLibrary(str(build.compile_stage(stage).library))
    traced = native.StageLibrary(str(build.compile_stage(stage, traced=True).library))
    capacity = traced.trace_capacity()
    warps = stage.threads // 32
    shape = trace_shape(stage)
    gen = torch.Generator(device="cuda").manual_seed(stage.number)
    q, k, v = ((torch.randn(shape.batch, shape.heads, shape.len_q, d, generator=gen, device="cuda") * 2)
               .to(torch.bfloat16) for d in (shape.head_dim, shape.head_dim, shape.dv))
    out = torch.empty_like(v)
    events = torch.zeros(MAX_CTAS * warps * capacity * 4, dtype=torch.int32, device="cuda")
    base = torch.zeros(2 * MAX_CTAS * 2, dtype=torch.int64, device="cuda")  # the starts, then the last epilogues
    info = torch.zeros(MAX_CTAS * 2, dtype=torch.int32, device="cuda")
    # [0] the slot counter (zeroed before each launch), [1] records per warp, [2 + w] warp w's kinds
    per_warp = records_per_warp(stage, capacity)
    control = torch.tensor([0, per_warp, *kind_masks(stage)], dtype=torch.int64).to(torch.int32).cuda()
    slots = control[:1]
    run_plain, run_traced = (_launcher(torch, lib, q, k, v, out, causal) for lib in (plain, traced))

    # The buffers' addresses, once; each traced launch then starts with the slot counter at 0.
    traced.trace_setup(events.data_ptr(), base.data_ptr(), info.data_ptr(), control.data_ptr(), MAX_CTAS, warps,
                       TARGET_SM)
    run_plain()
    expected = out.clone()
    run_traced()  # warm-up, and the trace points must not change a single output bit
    torch.cuda.synchronize()
    if not torch.equal(out, expected):
        raise RuntimeError(f"stage {stage.id}: the traced build's output differs from the plain build's")
    full, idle = (torch.tensor(kind_masks(stage) if r else [0] * warps, dtype=torch.int64).to(torch.int32).cuda()
                  for r in (True, False))

    def run_idle():  # the traced build recording nothing: what its trace points cost by themselves
        control[2:] = idle
        run_traced()
        control[2:] = full

    plain_ms, traced_ms, idle_ms = [], [], []
    for _ in range(OVERHEAD_ROUNDS):  # interleaved, so clock drift falls on all alike
        plain_ms.append(_median_ms(torch, run_plain))
        traced_ms.append(_median_ms(torch, run_traced, before=slots.zero_))
        idle_ms.append(_median_ms(torch, run_idle, before=slots.zero_))

    def recorded():  # one traced launch, its records read back
        for buffer in (events, base, info, slots):
            buffer.zero_()
        run_traced()
        torch.cuda.synchronize()
        used = min(int(slots.item()), MAX_CTAS)
        pairs = base.view(2, MAX_CTAS, 2)[:, :used].cpu().tolist()
        return (events.view(MAX_CTAS, warps, capacity, 4)[:used].cpu().numpy(), pairs[0],
                info.view(MAX_CTAS, 2)[:used].cpu().tolist(), pairs[1])

    records, bases, infos, ends = recorded()  # the launch whose records are kept
    clock_mhz, clock_from = _sm_mhz(torch, bases, ends)
    # The same launch with one record a K/V step: how much recording every event stretches a step.
    control[2:] = torch.tensor(kind_masks(stage, light=True), dtype=torch.int64).to(torch.int32).cuda()
    light_step = traces.step_ns(traces.decode(*recorded()[:3], clock_mhz)[0])
    control[2:] = torch.tensor(kind_masks(stage), dtype=torch.int64).to(torch.int32).cuda()
    return traces.from_device(stage, record_shape(shape), causal, records, bases, infos, clock_mhz,
                              plain_ms=statistics.median(plain_ms), traced_ms=statistics.median(traced_ms),
                              idle_ms=statistics.median(idle_ms), light_step_ns=light_step, per_warp=per_warp,
                              pct_range=_pct_range(traced_ms, plain_ms), idle_pct_range=_pct_range(idle_ms, plain_ms),
                              clock_from=clock_from)


def _pct_range(times: list[float], plain: list[float]) -> tuple[float, float]:
    """The lowest and highest of the rounds' ratios, in percent against plain (same round)."""
    pcts = [(t / p - 1) * 100 for t, p in zip(times, plain)]
    return min(pcts), max(pcts)


LINEAGES = {"attention": "the forward (kernels/attention)", "backward": "the backward (kernels/attention_backward)"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.trace", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lineage", choices=sorted(LINEAGES), default="attention",
                        help="whose stages: " + "; ".join(f"{k}, {v}" for k, v in LINEAGES.items()))
    parser.add_argument("--stages", default="all", help="stage numbers and ranges (1,5-6) or 'all' (the backward's: "
                                                        "those with trace points)")
    parser.add_argument("--head-dim", type=int, default=None,
                        help="the head dim to trace at, one every chosen stage serves (stage 24: 64, 96, 128, 192, "
                             "256); default: each stage's [tile] head dim, 128. Traced at its 8k point (H·D = 2048)")
    parser.add_argument("--out", default=None, help="folder for the records (default bench/results/traces/<gpu>, "
                                                    "the backward's bench/results/traces/<gpu>/backward)")
    args = parser.parse_args(argv)
    try:
        args.plan = plan(args)
    except ValueError as err:
        parser.error(str(err))
    return args


def plan(args) -> list[tuple[lineage.Stage, bool]]:
    """(stage, causal) in the order they are recorded: each chosen stage (at --head-dim's tile, where
    given) non-causal, then causal where it has a causal path."""
    if args.lineage == "backward":
        from . import trace_backward

        chosen = trace_backward.select(lineage.discover(lineage.BACKWARD_DIR), args.stages)
    else:
        stages = lineage.discover()
        wanted = shapes.parse_stages(args.stages, [s.number for s in stages])
        chosen = [s for s in stages if s.number in wanted]
    if args.head_dim is not None:
        try:
            chosen = [s.at_head_dim(args.head_dim) for s in chosen]
        except ValueError as err:
            raise ValueError(f"--head-dim: {err}") from None
    return [(s, causal) for s in chosen for causal in ((False, True) if s.causal else (False,))]


def main(argv=None) -> int:
    args = parse_args(argv)
    command = " ".join(["python -m bench.trace", *(argv or sys.argv[1:])])
    print(runs.log_header(command), flush=True)  # first: a log kept under bench/logs says what made it
    import torch

    if not torch.cuda.is_available():
        print("python -m bench.trace needs a CUDA GPU", file=sys.stderr)
        return 2
    backward = args.lineage == "backward"
    if backward:
        from . import trace_backward
    environment = env.collect(torch, env.read_clocks(), env.read_clocks())
    run = runs.new_run(command, environment)
    folder = traces.folder(environment["gpu_name"], backward) if args.out is None else args.out
    start = time.perf_counter()
    for stage, causal in args.plan:
        record = (trace_backward.trace_stage if backward else trace_stage)(torch, stage, causal)
        path = traces.write(folder, run, record)
        o = record["overhead"]
        print(f"[{time.perf_counter() - start:6.1f}s] {'backward ' if backward else ''}stage {stage.id} "
              f"head dim {stage.head_dim} {'causal' if causal else 'non-causal'}: "
              f"{len(record['events'])} events in the window, "
              f"{record['per_step_ns']:.0f} ns per {'query block' if backward else 'K/V step'}, "
              f"traced {o['traced_ms']:.3f} ms vs {o['plain_ms']:.3f} ms ({o['pct']:+.1f} %), "
              f"recording nothing {o['idle_pct']:+.1f} %, step {o.get('step_pct', float('nan')):+.1f} % against "
              f"one record a step -> {runs.shown_path(path)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
