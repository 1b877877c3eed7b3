"""Timing of whole model steps and of the attention inside them.

A step is timed whole (CUDA events around one forward, synchronized after each). Attention alone is
timed by replaying the calls a step made — the shapes the routing report captured, each timed on its
own inputs and multiplied by how often the step made it — so the model's own timing carries no
per-call event overhead. On CPU (the dry run) wall-clock time stands in for events.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

from bench import stats


class Clock:
    """Milliseconds of fn(): CUDA events on a GPU, perf_counter on CPU."""

    def __init__(self, torch, device):
        self.torch = torch
        self.cuda = getattr(device, "type", device) == "cuda"

    def time(self, fn, n: int = 1) -> float:
        """Milliseconds of n back-to-back calls of fn, divided by n."""
        torch = self.torch
        if not self.cuda:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - t0) * 1000.0 / n
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(n):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / n


def time_step(clock: Clock, fn, warmup: int, reps: int) -> list[float]:
    """Per-repetition milliseconds of fn after ``warmup`` untimed calls (JIT compiles, allocator, clocks)."""
    if reps < 1:
        raise ValueError(f"reps: expected at least 1, got {reps}")
    for _ in range(warmup):
        fn()
    return [clock.time(fn) for _ in range(reps)]


def summarize(ms: list[float]) -> dict:
    """The record's step_ms object: median, min, max, spread (max - min over median), samples."""
    s = stats.summarize(ms)
    return {"median": s["median_ms"], "min": s["min_ms"], "max": s["max_ms"], "spread_pct": s["spread_pct"],
            "samples": s["samples"]}


def replay_attention(clock: Clock, calls, launcher_for, warmup: int = 2, launches: int = 5) -> float:
    """Milliseconds of attention in one step: sum over the captured calls of count x time of one call.

    calls: [(shape, reason, count)]; launcher_for(shape, reason) -> (fn, context factory or None),
    fn running that call once on inputs it made (outside the timing).
    """
    total = 0.0
    for shape, reason, count in calls:
        fn, context = launcher_for(shape, reason)
        with (context or nullcontext)():
            for _ in range(warmup):
                fn()
            total += count * stats.median([clock.time(fn) for _ in range(launches)])
    return total
