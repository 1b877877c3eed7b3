"""GPU timing with CUDA events: L2 flushed before every timed launch, rounds with alternating arm order."""

from __future__ import annotations

import math
from contextlib import nullcontext

from bench import stats

FLUSH_BYTES = 256 << 20  # larger than any Hopper L2 (50-60 MB); grown to 4x L2 where a GPU has more
HEAD_START_CYCLES = 2_000_000  # about 1 ms of GPU spin so the host queues the first launch before it runs
# GPU time each arm runs untimed right before its timed launches, in every round. Without it an arm
# inherits the clocks and power headroom its predecessor left (seen on the H200: FlashAttention-4
# 14% faster after a light arm than after cuDNN), and fast arms are timed before the chip settles.
WARM_MS = 300.0


class Timer:
    """Times zero-argument launchers on the current CUDA device."""

    def __init__(self, torch):
        self.torch = torch
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2 = getattr(props, "L2_cache_size", 0) or 0
        self.flush_buffer = torch.empty(max(FLUSH_BYTES, 4 * l2), dtype=torch.int8, device="cuda")

    def flush(self) -> None:
        # Writing a buffer several times the L2 evicts the previous launch's K/V, so every timed launch
        # reads its inputs from HBM as it would in a model.
        self.flush_buffer.fill_(1)

    def launches(self, fn, n: int) -> list[float]:
        """n timed launches of fn (flush outside each event pair); milliseconds of each."""
        torch = self.torch
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        torch.cuda.synchronize()
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is not None:
            sleep(HEAD_START_CYCLES)  # keeps the GPU busy while Python queues the first launches
        for start, end in events:
            self.flush()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]

    def warm(self, fn, n: int) -> None:
        """n untimed back-to-back launches (see WARM_MS)."""
        for _ in range(n):
            fn()

    def one(self, fn) -> float:
        return self.launches(fn, 1)[0]


def launches_for(first_ms: float, max_launches: int, budget_ms: float = 400.0, min_launches: int = 3) -> int:
    """Launches per round: max_launches, fewer for slow arms so one arm-round stays near budget_ms."""
    if first_ms <= 0:
        return max_launches
    return max(min_launches, min(max_launches, int(budget_ms // first_ms)))


def warm_launches(first_ms: float, warm_ms: float = WARM_MS) -> int:
    """Untimed launches that keep the GPU busy with one arm for about warm_ms."""
    return max(1, math.ceil(warm_ms / first_ms)) if first_ms > 0 else 1


def run_rounds(timer, arms: dict, rounds: int, launches: dict, contexts: dict | None = None,
               on_round=None, warm: dict | None = None) -> dict:
    """Per-round medians for every arm: {name: [ms of round 0, round 1, ...]}.

    arms: name -> launcher; launches: name -> launches per round; contexts: name -> context factory
    (e.g. an SDPA backend selection) entered around that arm's launches, outside the events.
    """
    contexts = contexts or {}
    names = list(arms)
    out = {name: [] for name in names}
    raw = {name: [] for name in names}
    for r in range(rounds):
        for name in stats.round_order(names, r):
            with contexts.get(name, nullcontext)():
                if warm and hasattr(timer, "warm"):
                    timer.warm(arms[name], warm[name])
                times = timer.launches(arms[name], launches[name])
            raw[name].append(times)
            out[name].append(stats.median(times))
        if on_round is not None:
            on_round(r, {name: out[name][-1] for name in names})
    return {"round_ms": out, "launch_ms": raw}
