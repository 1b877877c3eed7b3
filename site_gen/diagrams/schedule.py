"""A small schedule model: where the ops of a stage's KV loop fall in time on one SM.

Rules (the timeline's caption repeats them):
1. The spec's [[schedule]] ops are one KV iteration; the loop repeats them. An op of kind load_q
   is the prologue (once per output tile, before its first iteration); an op of kind store_o is the
   epilogue (once per output tile, after its last iteration). A spec without a store gets an
   implicit store of O after the last PV, issued by the role that runs PV.
2. Dependencies: "x" = op x of the same iteration, "prev.x" / "prev2.x" = one / two iterations
   back (absent before the first iteration).
3. Each role issues its ops in program order (iteration by iteration, spec order within one).
   A synchronous op holds its role until it finishes; an asynchronous one (engines cp.async, TMA,
   wgmma) is issued and the role moves on; the op then runs when its unit is free, in issue order.
   Asynchronous copies (cp.async, TMA) are prefetches: a role issues them in their own program
   order, as early as their dependencies allow (the `after` list, e.g. "prev2.qk" for a free
   buffer of a double buffer, says how far ahead the pipeline lets them run).
4. A unit (load, tensor, softmax, epilogue) runs one op at a time. List scheduling: repeatedly
   take, among the roles' next ops whose dependencies are placed, the one that can start first,
   and place it in the earliest gap of its unit.
5. Durations come from FLOP and byte counts at the H200 rates of rates.py; an op covers
   block_m / (number of ops of its kind) query rows unless its [[schedule]] entry says `rows`.
   K/V loads move the bytes that facts.l2_bytes_per_iter counts (per warp without shared memory,
   once per CTA with it, 1/cluster of the tile with multicast).

The backward (Act V, stage.backward) walks the other axis: a CTA owns a block of keys and its loop
runs over the query blocks. Its iteration loads Q and dO (L2 hits: every key block of the head reads
them) and runs five GEMMs (qk, dp, dv, dk, dq; 2·block_m·block_n·head_dim FLOP each); the prologue
is its K/V load (once per CTA) and the epilogue the dK/dV store (kind store_dkdv; implicit after
the last dK and dV when the spec has none). The dQ atomics (or bulk reduce-adds) are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import engines, facts, rates

UNITS = ("load", "tensor", "softmax", "epilogue")
ONCE = ("load_q", "store_o")  # once per output tile, not per KV iteration
BACKWARD_PROLOGUE = ("load_k", "load_v", "load_kv")  # the backward: once per CTA (its key block)
BACKWARD_EPILOGUE = ("store_dkdv",)
BACKWARD_GEMMS = ("qk", "dp", "dv", "dk", "dq")


def prologue_kinds(stage) -> tuple[str, ...]:
    """The kinds an output tile (forward) or a key block (backward) runs once, before its loop."""
    return BACKWARD_PROLOGUE if stage.backward else ("load_q",)


def epilogue_kinds(stage) -> tuple[str, ...]:
    return BACKWARD_EPILOGUE if stage.backward else ("store_o",)


def once_kinds(stage) -> tuple[str, ...]:
    """Kinds that run once per output tile (forward: ONCE) or per key block (backward), not per iteration."""
    return prologue_kinds(stage) + epilogue_kinds(stage) if stage.backward else ONCE
UNIT_LABEL = {"load": "load / TMA", "tensor": "tensor cores", "softmax": "softmax (MUFU / FMA)",
              "epilogue": "epilogue"}


class ScheduleError(ValueError):
    """The spec's schedule cannot be run (a dependency cycle)."""


@dataclass(frozen=True)
class Op:
    """A schedule op as the model sees it (spec ops plus the implicit epilogue)."""

    name: str
    kind: str
    unit: str
    engine: str
    role: str
    after: tuple[str, ...]
    implicit: bool = False
    rows: int | None = None  # optional `rows` of the spec entry; default: block_m split evenly


@dataclass(frozen=True)
class Slot:
    op: Op
    it: int  # global iteration index (the epilogue carries its tile's last iteration)
    tile: int
    start: float  # seconds
    end: float

    @property
    def key(self):
        return (self.op.name, self.it)


def model_ops(stage) -> list[Op]:
    ops = [Op(o.op, o.kind, o.unit, o.engine, o.role, tuple(o.after), rows=o.rows) for o in stage.schedule]
    if stage.backward:
        if not any(o.kind in BACKWARD_EPILOGUE for o in ops):
            grads = [o for o in ops if o.kind in ("dv", "dk")] or ops[-1:]
            path = facts.o_path(stage)
            ops.append(Op("store_dkdv", "store_dkdv", "epilogue", path[-1], grads[-1].role,
                          tuple(o.name for o in grads), implicit=True))
        return ops
    if not any(o.kind == "store_o" for o in ops):
        pv = [o for o in ops if o.kind == "pv"]
        last = pv[-1] if pv else ops[-1]
        after = tuple(o.name for o in pv) or (last.name,)
        path = facts.o_path(stage)
        ops.append(Op("store_o", "store_o", "epilogue", path[-1], last.role, after, implicit=True))
    return ops


def duration(stage, op: Op) -> float:
    """Seconds one op takes on its unit (rates.py; rows split evenly among ops of one kind)."""
    fam = engines.family(op.engine)
    t = facts.Tiles.of(stage)
    if stage.backward:
        return _backward_duration(stage, op, fam)
    if op.kind in ("qk", "pv"):
        rows = op.rows or facts.rows_per_op(stage, op.kind)
        flops = 2 * rows * stage.block_n * stage.head_dim
        rate = rates.TENSOR_FLOPS_SM * (1.0 if fam == "wgmma" else rates.MMA_SYNC_FRACTION)
        return flops / rate
    if op.kind == "softmax":
        rows = op.rows or facts.rows_per_op(stage, "softmax")
        elems = rows * stage.block_n
        # exp2 with the scale folded in: max, FFMA, add per score; expf adds scale multiply and
        # its own range reduction. Plus rescaling the O accumulator row by row.
        fma_per = 3 if fam == "ex2" else 6
        fma = elems * fma_per + rows * stage.head_dim
        clocks = max(elems / rates.MUFU_PER_CLK, fma / rates.FMA_PER_CLK)
        return clocks / rates.CLOCK_HZ
    if op.kind in ("load_k", "load_v", "load_kv"):
        tensors = {"load_k": ("K",), "load_v": ("V",), "load_kv": ("K", "V")}[op.kind]
        return sum(facts.l2_bytes_per_iter(stage, x) for x in tensors) / rates.L2_BYTES_SM
    if op.kind == "load_q":
        return t.q / rates.HBM_BYTES_SM
    if op.kind == "store_o":
        rows = op.rows or facts.rows_per_op(stage, "store_o")
        return rows * stage.head_dim * facts.ELEM / rates.HBM_BYTES_SM
    raise ValueError(op.kind)


def _backward_duration(stage, op: Op, fam: str) -> float:
    n, d = stage.block_n, stage.head_dim
    if op.kind in BACKWARD_GEMMS:  # each of the five: (block_m x block_n) against head_dim, 2mnd FLOP
        rows = op.rows or facts.rows_per_op(stage, op.kind)
        rate = rates.TENSOR_FLOPS_SM * (1.0 if fam == "wgmma" else rates.MMA_SYNC_FRACTION)
        return 2 * rows * n * d / rate
    if op.kind == "softmax":
        # P = 2^(S·c − lse): one FFMA and one exp2 per score; dS = P ∘ (dP − D): a subtract and a
        # multiply; the bf16 packing of both: about 4 FMA-pipe instructions per score.
        rows = op.rows or facts.rows_per_op(stage, "softmax")
        elems = rows * n
        clocks = max(elems / rates.MUFU_PER_CLK, 4 * elems / rates.FMA_PER_CLK)
        return clocks / rates.CLOCK_HZ
    if op.kind in ("load_q", "load_do"):  # re-read by every key block of the head: L2 hits
        rows = op.rows or facts.rows_per_op(stage, op.kind)
        return rows * d * facts.ELEM / rates.L2_BYTES_SM
    if op.kind in BACKWARD_PROLOGUE:  # K and V of the CTA's key block, once, from HBM
        tensors = {"load_k": 1, "load_v": 1, "load_kv": 2}[op.kind]
        return tensors * n * d * facts.ELEM / rates.HBM_BYTES_SM
    if op.kind in BACKWARD_EPILOGUE:  # dK and dV, bf16, once per key block
        return 2 * n * d * facts.ELEM / rates.HBM_BYTES_SM
    raise ValueError(op.kind)


def _deps(op: Op, it: int, keys: set) -> list[tuple[str, int]]:
    out = []
    for dep in op.after:
        back, name = 0, dep
        if dep.startswith("prev2."):
            back, name = 2, dep[6:]
        elif dep.startswith("prev."):
            back, name = 1, dep[5:]
        key = (name, it - back)
        if key in keys:  # instances that never exist (before the first iteration) impose nothing
            out.append(key)
    return out


def _fit(busy: list[tuple[float, float]], ready: float, dur: float) -> float:
    start = ready
    for s, e in busy:  # sorted by start
        if e <= start + 1e-15:
            continue
        if s >= start + dur - 1e-15:
            break
        start = max(start, e)
    return start


def stream(op: Op) -> str:
    return f"{op.role} copies" if engines.family(op.engine) in ("cp.async", "tma") else op.role


def simulate(stage, iterations: int = 4, tiles: int = 1) -> list[Slot]:
    ops = model_ops(stage)
    loop = [o for o in ops if o.kind not in once_kinds(stage)]
    stores = [o for o in ops if o.kind in epilogue_kinds(stage)]
    prologue = [o for o in ops if o.kind in prologue_kinds(stage)]
    roles = []  # issue streams: a role, plus "<role> copies" for its prefetching copies
    for o in ops:
        if stream(o) not in roles:
            roles.append(stream(o))
    seq: dict[str, list[tuple[Op, int, int]]] = {r: [] for r in roles}
    for t in range(tiles):
        for o in prologue:
            seq[stream(o)].append((o, t * iterations, t))
        for i in range(iterations):
            for o in loop:
                seq[stream(o)].append((o, t * iterations + i, t))
        for o in stores:
            seq[stream(o)].append((o, t * iterations + iterations - 1, t))
    keys = {(o.name, it) for r in roles for o, it, _ in seq[r]}
    order = {o.name: i for i, o in enumerate(ops)}
    done: dict[tuple[str, int], Slot] = {}
    cursor = {r: 0.0 for r in roles}
    pos = {r: 0 for r in roles}
    busy: dict[str, list[tuple[float, float]]] = {u: [] for u in UNITS}
    last_end: dict[tuple[str, str], float] = {}
    slots: list[Slot] = []
    total = sum(len(v) for v in seq.values())
    while len(slots) < total:
        best = None
        for r in roles:
            if pos[r] >= len(seq[r]):
                continue
            o, it, t = seq[r][pos[r]]
            deps = _deps(o, it, keys)
            if any(d not in done for d in deps):
                continue
            ready = max([cursor[r]] + [done[d].end for d in deps])
            cand = (ready, it, order[o.name], r)
            if best is None or cand < best:
                best = cand
        if best is None:
            waiting = [f"{seq[r][pos[r]][0].name}@{seq[r][pos[r]][1]}" for r in roles if pos[r] < len(seq[r])]
            raise ScheduleError(f"stage {stage.id}: schedule deadlocks; waiting: {', '.join(waiting)}")
        ready, _, _, r = best
        o, it, t = seq[r][pos[r]]
        dur = duration(stage, o)
        asyn = engines.is_async(o.engine)
        earliest = max(ready, last_end.get((r, o.unit), 0.0)) if asyn else ready
        start = _fit(busy[o.unit], earliest, dur)
        slot = Slot(o, it, t, start, start + dur)
        busy[o.unit].append((slot.start, slot.end))
        busy[o.unit].sort()
        last_end[(r, o.unit)] = slot.end
        done[slot.key] = slot
        slots.append(slot)
        cursor[r] = ready if asyn else slot.end
        pos[r] += 1
    slots.sort(key=lambda s: (s.start, UNITS.index(s.op.unit), s.op.name))
    return slots


@dataclass(frozen=True)
class Prediction:
    period: float  # steady-state seconds per KV iteration
    busy: dict  # unit -> seconds of work per iteration
    bound: str  # the busiest unit

    def utilisation(self, unit: str) -> float:
        return self.busy.get(unit, 0.0) / self.period if self.period else 0.0


def predict(stage, iterations: int = 12) -> Prediction:
    """Steady-state time per iteration: spacing of iteration ends deep in a long run."""
    once = once_kinds(stage)
    slots = [s for s in simulate(stage, iterations) if s.op.kind not in once]
    ends = {}
    for s in slots:
        ends[s.it] = max(ends.get(s.it, 0.0), s.end)
    a, b = iterations // 2, iterations - 1
    period = (ends[b] - ends[a]) / (b - a)
    busy = {u: 0.0 for u in UNITS if u != "epilogue"}
    for o in model_ops(stage):
        if o.kind not in once:
            busy[o.unit] += duration(stage, o)
    # Greedy placement can squeeze the last measured iterations; no unit does more than its work.
    period = max(period, max(busy.values()))
    bound = max(busy, key=lambda u: (busy[u], -UNITS.index(u)))
    return Prediction(period, busy, bound)
