"""The backward's traces (Act V; needs a GPU): per-warp timelines of the backward stages that have
trace points, as bench.trace records the forward's. Run through it:

    python -m bench.trace --lineage backward              # every backward stage with trace points
    python -m bench.trace --lineage backward --stages 3   # some of them

A stage has trace points when its kernel.cu includes common/trace_backward.cuh (stage 03 on; 01 and
02, on mma.sync, have none). Each is compiled a second time with -DHOPATTN_TRACE and the backward's
recorder force-included (kernels/attention_backward/common/trace_recorder_backward.cuh: every event
one 16-byte row, a step's events as boundary stamps). At the fixed 8k shape, non-causal and causal,
the producer runs the forward's final stage once for out and lse (hopattn.attention, return_lse),
launches the plain and the traced backward on the same q, k, v, out, lse and a random dO — the
traced build's dK and dV must equal the plain build's bit for bit, its dQ must agree to the rounding
of its atomics' order — reads back the records of the CTAs that ran on one SM, converts cycles to
nanoseconds with the SM clock over each traced CTA's run, and writes
bench/results/traces/<gpu>/backward/<NN>[-causal].json through hopattn.records.traces: a window
around slot 0's end and the next CTA's start on the SM, the median time per query block, per-event
statistics over everything recorded, and what recording costs, measured as the forward's is — the
traced launch against the plain one (interleaved rounds, same process), the traced build recording
nothing, and the time per query block with every event recorded against one record a step. A
launch is the preprocess, the main kernel and the dQ conversion; only the main kernel is traced.
"""

from __future__ import annotations

import math
import statistics

from hopattn import build, lineage
from hopattn.records import traces

from . import shapes

TARGET_SM = 0
MAX_CTAS = 8  # CTAs traced on the target SM: the first to start there (one at a time: 144 KB or more of smem)
SHAPE = shapes.SHAPES["8k"]
OVERHEAD_ROUNDS = 9  # interleaved rounds of 10 launches, as the forward's
DQ_RTOL = 2e-2  # dQ's fp32 atomics add in arrival order: the traced and plain builds may round apart
MARKER = '#include "../common/trace_backward.cuh"'


def traced_stages(stages: list[lineage.Stage]) -> list[lineage.Stage]:
    """The backward stages with trace points (their kernel.cu includes common/trace_backward.cuh)."""
    return [s for s in stages if MARKER in s.kernel_path.read_text()]


def select(stages: list[lineage.Stage], text: str) -> list[lineage.Stage]:
    """--stages for the backward: 'all' is every stage with trace points; a stage named that has
    none is an error that says which have them."""
    wanted = shapes.parse_stages(text, [s.number for s in stages])
    with_points = traced_stages(stages)
    missing = [s.id for s in stages if s.number in wanted and s not in with_points]
    if missing and text.strip() != "all":
        have = ", ".join(s.id for s in with_points) or "none"
        raise ValueError(f"--stages: backward stage {', '.join(missing)} has no trace points (stages with them: {have})")
    return [s for s in with_points if s.number in wanted]


def kind_mask(light: bool = False) -> int:
    """The event kinds a warp records, as the backward's recorder counts them (bit e − 32 for event
    e): every kind, or (light) the issue of Sᵀ and dPᵀ alone, one row a step on the warps that
    compute, to time the steps with one record each."""
    if light:
        return 1 << traces.BACKWARD_EVENTS.index("qk")
    return (1 << len(traces.BACKWARD_EVENTS)) - 1


def kind_masks(stage: lineage.Stage, light: bool = False) -> list[int]:
    return [kind_mask(light)] * (stage.threads // 32)


def records_per_warp(capacity: int) -> int:
    """Everything that fits: a CTA is one key block (no persistent backward stage yet); stage 03's
    lead warp writes about 16 rows a query block, 128 blocks at 8k."""
    return capacity


def _signed32(values: list[int]):
    return [v - (1 << 32) if v >= 1 << 31 else v for v in values]


def _launcher(torch, lib, tensors, lse, causal, row_stats, dq_accum):
    q = tensors[0]
    b, h, lq, d = q.shape
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    strides = [tuple(t.stride()[:3]) for t in tensors]  # all contiguous BHSD

    def run():
        lib.launch([t.data_ptr() for t in tensors], strides, lse.data_ptr(), 0, row_stats.data_ptr(),
                   dq_accum.data_ptr(), b, h, h, lq, lq, d, 1 / math.sqrt(d), causal, False, sms,
                   torch.cuda.current_stream().cuda_stream)
    return run


def trace_stage(torch, stage: lineage.Stage, causal: bool) -> dict:
    from hopattn import api

    from .trace import _median_ms, _pct_range, _sm_mhz

    native = api._native()
    plain = native.BackwardLibrary(str(build.compile_stage(stage).library))
    traced = native.BackwardLibrary(str(build.compile_stage(stage, traced=True).library))
    capacity = traced.trace_capacity()
    warps = stage.threads // 32
    gen = torch.Generator(device="cuda").manual_seed(100 + stage.number)
    q, k, v, dout = (torch.randn(SHAPE.batch, SHAPE.heads, SHAPE.len_q, 128, generator=gen, device="cuda")
                     .to(torch.bfloat16) for _ in range(4))
    out, lse = api.attention(q, k, v, causal=causal, return_lse=True)  # the forward's final stage
    grads = [torch.empty_like(q) for _ in range(3)]
    tensors = (q, k, v, out, dout, *grads)
    stats_n, accum_n = plain.workspace(SHAPE.batch, SHAPE.heads, SHAPE.kv, SHAPE.len_q, False)
    row_stats = torch.empty(stats_n, dtype=torch.float32, device="cuda")
    dq_accum = torch.empty(max(accum_n, 1), dtype=torch.float32, device="cuda")
    events = torch.zeros(MAX_CTAS * warps * capacity * 4, dtype=torch.int32, device="cuda")
    base = torch.zeros(2 * MAX_CTAS * 2, dtype=torch.int64, device="cuda")  # the starts, then the ends
    info = torch.zeros(MAX_CTAS * 2, dtype=torch.int32, device="cuda")
    per_warp = records_per_warp(capacity)
    full, idle, light = (torch.tensor(_signed32(m), dtype=torch.int64).to(torch.int32).cuda()
                         for m in (kind_masks(stage), [0] * warps, kind_masks(stage, light=True)))
    control = torch.cat([torch.tensor([0, per_warp], dtype=torch.int32).cuda(), full])
    slots = control[:1]
    run_plain, run_traced = (_launcher(torch, lib, tensors, lse, causal, row_stats, dq_accum)
                             for lib in (plain, traced))

    traced.trace_setup(events.data_ptr(), base.data_ptr(), info.data_ptr(), control.data_ptr(), MAX_CTAS, warps,
                       TARGET_SM)
    run_plain()
    expected = [g.clone() for g in grads]
    run_traced()  # warm-up; and the trace points must not change what the kernel computes
    torch.cuda.synchronize()
    for name, got, want in zip(("dq", "dk", "dv"), grads, expected):
        same = torch.equal(got, want) if name != "dq" else torch.allclose(
            got.float(), want.float(), rtol=DQ_RTOL, atol=DQ_RTOL * float(want.float().abs().max()))
        if not same:
            raise RuntimeError(f"backward stage {stage.id}: the traced build's {name} differs from the plain build's")

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
    control[2:] = light  # the same launch with one record a step: how much recording every event stretches a step
    light_step = traces.step_ns(traces.decode(*recorded()[:3], clock_mhz)[0])
    control[2:] = full
    return traces.from_device(stage, SHAPE.dims, causal, records, bases, infos, clock_mhz,
                              plain_ms=statistics.median(plain_ms), traced_ms=statistics.median(traced_ms),
                              idle_ms=statistics.median(idle_ms), light_step_ns=light_step, per_warp=per_warp,
                              pct_range=_pct_range(traced_ms, plain_ms), idle_pct_range=_pct_range(idle_ms, plain_ms),
                              clock_from=clock_from)
