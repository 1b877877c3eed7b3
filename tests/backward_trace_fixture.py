"""Synthetic device buffers of a traced backward launch, as kernels/attention_backward/common/
trace_recorder_backward.cuh writes them for stage 03: two CTAs that run one after the other on the
SM, two warpgroups of four compute warps each; warp 0 also issues the TMA (K and V once, then Q and
dO a step ahead). Per step every compute warp stores one row per event, a boundary stamp
[event | tile << 8, step, 0, clock]; the waits for K and V and the store of dK and dV are rows with
their start; a copy issued is an instant (start = end). The clock's low word wraps during the launch."""

from __future__ import annotations

from hopattn import lineage
from hopattn.records import traces

MHZ = 1750.0
STEP = 7000  # cycles per query block: 4 us at 1750 MHz
# A compute warp's step: (event, cycles after the step's start at which it ends), in program order.
STEP_EVENTS = (("wait_qdo", 150), ("qk", 300), ("wait_qk", 1400), ("softmax", 1900), ("wait_dp", 2000), ("ds", 2400),
               ("dvdk", 2600), ("store_ds", 2900), ("wait_ds", 3100), ("dq", 3300), ("wait_dq", 4600),
               ("add_dq", 6500), ("wait_step", 7000))
BASE = (1 << 32) - 30_000


def event_id(name: str) -> int:
    return traces.BACKWARD_FIRST + traces.BACKWARD_EVENTS.index(name)


def buffers(steps=(12, 12), warps=8, capacity=512, gap=3000):
    """(records [slots][warps][capacity][4], bases, infos, ends): CTA s runs steps[s] query blocks,
    the next starts ``gap`` cycles after the last one's store."""
    records = [[[[0, 0, 0, 0] for _ in range(capacity)] for _ in range(warps)] for _ in steps]
    bases, infos, ends = [], [], []
    t = BASE + 200
    for slot, count in enumerate(steps):
        rows = [0] * warps
        start = t

        def put(warp, name, kv, t0, t1, slot=slot, rows=rows):
            records[slot][warp][rows[warp]] = [event_id(name) & 0xFF, kv & 0xFFFFFFFF, t0 & 0xFFFFFFFF,
                                               t1 & 0xFFFFFFFF]
            rows[warp] += 1

        bases.append([start - 100, 5_000_000 + round((start - 100 - BASE) / MHZ * 1000)])
        infos.append([slot * 17, 0])
        put(0, "load_kv", -1, t, t)
        put(0, "load_q", 0, t + 10, t + 10)
        put(0, "load_do", 0, t + 20, t + 20)
        for w in range(warps):
            put(w, "wait_kv", -1, t + 30, t + 900)
        t += 900
        for step in range(count):
            if step + 1 < count:
                put(0, "load_q", step + 1, t + 5, t + 5)
                put(0, "load_do", step + 1, t + 8, t + 8)
            for w in range(warps):
                for name, end in STEP_EVENTS:
                    put(w, name, step, 0, t + end + (w // 4) * 40)  # the second warpgroup a little behind
            t += STEP
        for w in range(warps):
            put(w, "store_dkdv", -1, t + 50, t + 650)
        t += 650
        ends.append([t, bases[-1][1] + round((t - bases[-1][0]) / MHZ * 1000)])
        t += gap
    return records, bases, infos, ends


def stage03() -> lineage.Stage:
    return next(s for s in lineage.discover(lineage.BACKWARD_DIR) if s.number == 3)


SHAPE = {"batch": 4, "heads": 16, "len_q": 8192, "len_k": 8192, "head_dim": 128}
RUN = {"date": "2026-12-03T10:00:00Z", "git_commit": "a" * 40, "git_dirty": False,
       "command": "python -m bench.trace --lineage backward", "environment": {"gpu_name": "NVIDIA H200"}}


def record(stage=None, causal=False, steps=(12, 12)) -> dict:
    """A backward trace record of stage 03 (or ``stage``) made from buffers(), with its run."""
    stage = stage or stage03()
    records, bases, infos, ends = buffers(steps)
    rec = traces.from_device(stage, SHAPE, causal, records, bases, infos, MHZ, plain_ms=16.1, traced_ms=16.5,
                             idle_ms=16.2, light_step_ns=3950.0, per_warp=512, pct_range=(1.5, 3.1),
                             idle_pct_range=(0.2, 1.1), clock_from="each CTA's start and last epilogue")
    return dict(rec, run=RUN)
