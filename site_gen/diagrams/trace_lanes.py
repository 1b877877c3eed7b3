"""A trace record (hopattn.records.traces) arranged for the measured timeline: lanes, bars, the
wgmma spans from issue to retirement, and where a new output tile starts.

Pure data, no drawing (trace_timeline.py draws it), so the tests can check that every recorded
event of the window becomes exactly one bar.

- A *row* is one place a CTA holds on the SM: CTAs whose recorded spans do not overlap share a row
  (the next CTA takes over the place of the one that ended), so a window with two resident CTAs
  has two rows, and a CTA that ends and the one that follows it sit on one row.
- A *lane* is one warp of one row. The summary view draws the first warp of each role (a
  warpgroup's warps run in near lockstep) plus any warp that records an event kind its role's first
  warp does not; the full view draws every traced warp.

A backward record (Act V: hopattn.records.traces.is_backward) is laid out the same way with the
backward's vocabulary (``Kinds``): its GEMMs in flight are Sᵀ and dPᵀ (issued together, by qk),
dV with dK (dvdk) and dQ; a CTA's last work is the store of dK and dV; its first wait the one for
K and V.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hopattn.records import traces

NO_TILE = 0xFFFF  # the record's 16-bit tile field of an event that belongs to no one tile (-1)
WAITS = ("wait_q", "wait_k", "wait_v", "wait_kv", "wait_empty", "wait_turn", "wait_tile", "wait_qk", "wait_pv")
# A wgmma is issued by one event and retired by the wait that names the same K/V step.
RETIRED_BY = {"qk": "wait_qk", "pv": "wait_pv"}
# The backward's waits: every event of its recorder whose name says so (the forward's WAITS are theirs too).
BACKWARD_WAITS = tuple(e for e in traces.BACKWARD_EVENTS if e.startswith("wait_"))


@dataclass(frozen=True)
class Kinds:
    """What a lineage's events are, for the layout: its GEMMs in flight as (name, the event that
    issues it, the waits that may retire it, its track under the lane: 0 above, 1 below), the events
    a computing warp records (the roles that record one compute), a tile's last work and a new
    CTA's first wait (the boundary's stretches), and what a step and a tile are called."""

    lineage: str
    gemms: tuple[tuple[str, str, tuple[str, ...], int], ...]
    computes: tuple[str, ...]
    step: str  # the event that starts a step: the first GEMM's issue
    last_retire: tuple[str, ...]  # the waits that retire a step's last GEMM
    epilogue: str
    first_wait: str
    waits: tuple[str, ...]
    step_word: str
    tile_word: str

    def issues(self, event: str) -> list[tuple[str, tuple[str, ...]]]:
        """(gemm, the waits that retire it) of every GEMM the event issues."""
        return [(g, waits) for g, issue, waits, _ in self.gemms if issue == event]

    def track(self, gemm: str) -> int:
        return next(t for g, _, _, t in self.gemms if g == gemm)


FORWARD = Kinds("attention", (("qk", "qk", ("wait_qk",), 0), ("pv", "pv", ("wait_pv",), 1)), ("qk", "pv"), "qk",
                ("wait_pv",), "epilogue", "wait_q", WAITS, "K/V step", "output tile")
BACKWARD = Kinds(traces.BACKWARD, (("qk", "qk", ("wait_qk",), 0), ("dp", "qk", ("wait_dp",), 1),
                                   ("dvdk", "dvdk", ("wait_dq", "wait_dvdk"), 0), ("dq", "dq", ("wait_dq",), 1)),
                 ("qk", "dvdk", "dq"), "qk", ("wait_dq", "wait_dvdk"), "store_dkdv", "wait_kv", BACKWARD_WAITS,
                 "query block", "key block")


def kinds_of(record: dict) -> Kinds:
    return BACKWARD if traces.is_backward(record) else FORWARD


@dataclass(frozen=True)
class Bar:
    """One recorded event, times in ns from the window's start (not clipped)."""

    event: str
    slot: int
    warp: int
    tile: int | None  # output tile of the CTA (0, 1, ...); None: no one tile
    kv: int | None  # K/V step within the tile; None: none
    start: float
    end: float

    @property
    def kind(self) -> str:
        """'wait' (a stall), 'mark' (an instant: a copy issued) or 'work'."""
        if self.event in WAITS or self.event in BACKWARD_WAITS:
            return "wait"
        return "mark" if self.end - self.start < 0.5 else "work"


@dataclass(frozen=True)
class Span:
    """A wgmma from the start of its issue to the end of the wait that retired it: it ran somewhere
    in there (an upper bound: the wait is where the warp checked, not when the GEMM finished)."""

    gemm: str  # "qk" | "pv" (the backward's: "qk" (Sᵀ), "dp", "dvdk", "dq")
    tile: int | None
    kv: int | None
    start: float
    end: float


@dataclass(frozen=True)
class Lane:
    row: int
    role: str
    role_warps: tuple[int, ...]
    warp: int
    bars: tuple[Bar, ...]
    spans: tuple[Span, ...]


@dataclass(frozen=True)
class Boundary:
    """Where, on one row, the work of a new output tile begins (a new CTA, or the CTA's next tile)."""

    row: int
    t: float
    slot: int
    tile: int | None
    new_cta: bool


@dataclass(frozen=True)
class Layout:
    length: float  # the window, ns
    rows: tuple[tuple[int, ...], ...]  # the slots on each row, in time order
    lanes: tuple[Lane, ...]
    boundaries: tuple[Boundary, ...]
    blocks: dict  # slot -> linear block index
    kinds: Kinds = FORWARD

    @property
    def gemm_roles(self) -> set[str]:
        return {ln.role for ln in self.lanes if any(b.event in self.kinds.computes for b in ln.bars)}


def role_label(name: str) -> str:
    """'consumer0' -> 'consumer 0', 'wg1' -> 'warpgroup 1'."""
    name = re.sub(r"^wg(?=\d)", "warpgroup", name)
    return re.sub(r"(?<=[a-z])(?=\d+$)", " ", name)


def bars_of(record: dict) -> list[Bar]:
    out = []
    for slot, warp, event, tile, kv, t0, t1 in record["events"]:
        out.append(Bar(event, slot, warp, None if tile == NO_TILE or tile < 0 else tile, None if kv < 0 else kv,
                       float(t0), float(t1)))
    return out


def _rows(bars: list[Bar]) -> list[list[int]]:
    """Slots to rows: a slot joins the first row whose last slot ended before it began."""
    span: dict[int, list[float]] = {}
    for b in bars:
        s = span.setdefault(b.slot, [b.start, b.end])
        s[0], s[1] = min(s[0], b.start), max(s[1], b.end)
    rows: list[list[int]] = []
    ends: list[float] = []
    for slot in sorted(span, key=lambda k: (span[k][0], k)):
        for i, end in enumerate(ends):
            if end <= span[slot][0]:
                rows[i].append(slot)
                ends[i] = span[slot][1]
                break
        else:
            rows.append([slot])
            ends.append(span[slot][1])
    return sorted(rows, key=min)  # slot 0's row first


def spans_of(bars: list[Bar], kinds: Kinds = FORWARD) -> list[Span]:
    """Pair each wgmma issue with the first later wait of its kind in the same warp: a warp's wgmma
    groups retire in the order they were issued. (Not by the K/V step's label: a boundary stamp
    carries the step of the record that stored it, and a PV issued in one step and retired in the
    next is stored with two different labels.)"""
    out = []
    for i, b in enumerate(bars):
        if b.kv is None:
            continue
        for gemm, waits in kinds.issues(b.event):
            for w in bars[i + 1:]:
                if w.event in waits and (w.slot, w.warp) == (b.slot, b.warp) and w.end >= b.start:
                    out.append(Span(gemm, b.tile, b.kv, b.start, w.end))
                    break
    return out


def layout(record: dict, every_warp: bool = False) -> Layout:
    vocab = kinds_of(record)
    bars = bars_of(record)
    length = record["window"]["end_ns"] - record["window"]["start_ns"]
    roles = record["roles"]
    role_order = list(dict.fromkeys(roles))
    rows = _rows(bars)
    row_of = {slot: i for i, slots in enumerate(rows) for slot in slots}
    by_lane: dict[tuple[int, int], list[Bar]] = {}
    for b in bars:  # record order: by start time
        by_lane.setdefault((row_of[b.slot], b.warp), []).append(b)
    lanes = []
    for r in range(len(rows)):
        for role in role_order:
            warps = tuple(w for w, name in enumerate(roles) if name == role)
            present = [w for w in warps if (r, w) in by_lane]
            if not every_warp:
                shown, kinds = [], set()
                for w in present:  # the first warp, then any warp with an event kind not yet shown
                    mine = {b.event for b in by_lane[(r, w)]}
                    if not shown or mine - kinds:
                        shown.append(w)
                        kinds |= mine
                present = shown
            for w in present:
                mine = by_lane[(r, w)]
                lanes.append(Lane(r, role, warps, w, tuple(mine), tuple(spans_of(mine, vocab))))
    return Layout(length, tuple(tuple(s) for s in rows), tuple(lanes), tuple(_boundaries(bars, rows, roles, vocab)),
                  {c["slot"]: c["block"] for c in record["ctas"]}, vocab)


def _boundaries(bars: list[Bar], rows: list[list[int]], roles: list[str], kinds: Kinds = FORWARD) -> list[Boundary]:
    """On each row, the first event of every (CTA, tile) after the row's first, in the warps that
    compute: a producer loads the next tile's Q long before its consumers start on it."""
    gemm_roles = {roles[b.warp] for b in bars if b.event in kinds.computes}
    out = []
    for r, slots in enumerate(rows):
        first: dict[tuple[int, int], float] = {}
        for b in bars:
            if b.slot in slots and b.tile is not None and (roles[b.warp] in gemm_roles or not gemm_roles):
                key = (b.slot, b.tile)
                first[key] = min(first.get(key, b.start), b.start)
        ordered = sorted(first, key=lambda k: (first[k], k))
        for prev, key in zip(ordered, ordered[1:]):
            out.append(Boundary(r, first[key], key[0], key[1], new_cta=key[0] != prev[0]))
    return out


def zoom(lay: Layout, per_step: float | None, steps: float = 2.5) -> tuple[float, float] | None:
    """About ``steps`` K/V steps of the steady state, for a magnified panel: they start at a QKᵀ of
    the first computing warp, the last steps of its first tile in the window that are followed by
    another QKᵀ (so no epilogue), or the window's last steps. None when the window is too short
    to need one or has no QKᵀ."""
    lane = next((ln for ln in lay.lanes if ln.role in lay.gemm_roles), None)
    if not per_step or lane is None or lay.length < 2.5 * steps * per_step:
        return None
    qk = [b for b in lane.bars if b.event == lay.kinds.step and 0 <= b.start <= lay.length]
    if not qk:
        return None
    group = (qk[0].slot, qk[0].tile)
    starts = [b.start for b in qk if (b.slot, b.tile) == group]
    steady = [t for t in starts if t + steps * per_step <= starts[-1] + 0.25 * per_step] or starts[:1]
    start = steady[-1]
    end = min(start + steps * per_step, lay.length)
    return start, end


def _union(intervals) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def both_in_flight(lay: Layout, row: int, until: float | None = None) -> tuple[list[tuple[float, float]], float] | None:
    """Where the first warps of two computing roles of a row (the two consumer warpgroups) both
    have a wgmma in flight, and that time over the time either has one; None without two such
    roles. Pingpong keeps it near zero: one consumer's GEMMs wait for the other's turn. ``until``:
    only the spans that end by then (the steady state before a boundary)."""
    firsts: dict[str, Lane] = {}
    for ln in lay.lanes:
        if ln.row == row and ln.spans and ln.role not in firsts:
            firsts[ln.role] = ln
    if len(firsts) < 2:
        return None
    a, b = (_union((s.start, s.end) for s in ln.spans if until is None or s.end <= until)
            for ln in list(firsts.values())[:2])
    both = []
    for s0, e0 in a:
        for s1, e1 in b:
            lo, hi = max(s0, s1), min(e0, e1)
            if hi > lo:
                both.append((lo, hi))
    either = sum(e - s for s, e in _union(a + b))
    return both, (sum(e - s for s, e in both) / either if either else 0.0)


def steps(lay: Layout) -> tuple[int, int | None]:
    """How many K/V steps (QKᵀ issues of the first computing warp on row 0) the window holds before
    and after that row's first tile boundary; (steps, None) for a window without one, (steps, 0)
    where the window ends before the next tile's first step."""
    lane = next((ln for ln in lay.lanes if ln.role in lay.gemm_roles and ln.row == 0), None)
    if lane is None:
        return 0, None
    groups: dict[tuple, set] = {}
    for b in lane.bars:
        if b.event == lay.kinds.step and 0 <= b.start <= lay.length:
            groups.setdefault((b.slot, b.tile), set()).add(b.kv)
    order = sorted(groups, key=lambda k: min(b.start for b in lane.bars if (b.slot, b.tile) == k))
    boundary = any(b.row == 0 for b in lay.boundaries)
    if boundary and len(order) >= 2:
        return len(groups[order[0]]), len(groups[order[1]])
    # a boundary whose next steps fall after the window's end: none of them in it
    return (len(groups[order[0]]) if order else 0), (0 if boundary else None)


def moved_events(stats: dict, prev_stats: dict, shown: int = 3) -> tuple[list[tuple[str, float, float]], list[str]]:
    """Against the previous stage's record: the events whose median duration moved by a fifth or
    more, the largest moves in time first, as (event, median ns, previous median ns); and the
    events the previous stage did not record."""
    moved, new = [], []
    for event in sorted(stats):
        mine, theirs = stats[event], prev_stats.get(event)
        if theirs is None:
            new.append(event)
        elif theirs["median_ns"] >= 20 and mine["median_ns"] >= 1:
            ratio = mine["median_ns"] / theirs["median_ns"]
            if abs(ratio - 1) > 0.2:
                moved.append((abs(mine["median_ns"] - theirs["median_ns"]), event, mine["median_ns"], theirs["median_ns"]))
    moved.sort(key=lambda m: (-m[0], m[1]))
    return [(e, m, t) for _, e, m, t in moved[:shown]], new


def lead_lanes(lay: Layout, row: int = 0) -> list[Lane]:
    """The first lane of each computing role on a row (consumer 0's and consumer 1's lead warps)."""
    out, seen = [], set()
    for ln in lay.lanes:
        if ln.row == row and ln.role in lay.gemm_roles and ln.role not in seen:
            seen.add(ln.role)
            out.append(ln)
    return out


def first_boundary(lay: Layout, row: int = 0) -> Boundary | None:
    return min((b for b in lay.boundaries if b.row == row), key=lambda b: b.t, default=None)


def boundary_zoom(lay: Layout, per_step: float | None) -> tuple[float, float] | None:
    """Row 0's first tile boundary, for the magnified panel of a stage whose change is there: from a
    third of a step before the first computing warp's last PV of the tile before retired, to a step
    and a fifth after the last one's first QKᵀ of the next tile (its first softmax). None without a
    boundary whose both sides the window holds."""
    ends = [(old, new) for _label, old, new in _boundary_sides(lay)]
    if not per_step or not ends:
        return None
    start = max(0.0, min(old for old, _ in ends) - per_step / 3)
    end = min(lay.length, max(new for _, new in ends) + 1.2 * per_step)
    return (start, end) if end - start < 0.8 * lay.length else None


def _boundary_sides(lay: Layout) -> list[tuple[str, float, float]]:
    """(role, last PV of the tile before retired, next tile's first QKᵀ issued) for each computing
    role's lead warp at row 0's first boundary."""
    bd = first_boundary(lay)
    if bd is None:
        return []
    out = []
    for ln in lead_lanes(lay):
        old, new = _sides(ln, bd)
        retired = [b.end for b in old if b.event in lay.kinds.last_retire]
        first_qk = next((b.start for b in new if b.event == lay.kinds.step), None)
        if retired and first_qk is not None:
            out.append((role_label(ln.role), retired[-1], first_qk))
    return out


def _sides(ln: Lane, bd: Boundary) -> tuple[list[Bar], list[Bar]]:
    """A lane's bars of the tile before a boundary and of the tile after it."""
    if bd.new_cta:
        old = [b for b in ln.bars if b.start < bd.t]
        new = [b for b in ln.bars if b.start >= bd.t - 1e-6]
    else:
        old = [b for b in ln.bars if b.slot == bd.slot and b.tile is not None and b.tile < (bd.tile or 0)]
        new = [b for b in ln.bars if b.start >= bd.t - 1e-6 and b.tile == bd.tile]
    return old, new


def boundary_stretches(lay: Layout) -> list[tuple[str, float]]:
    """What row 0's first tile boundary is made of, in ns, as (label, duration) of each computing
    role's lead warp: from the last PV of the tile before retired to the next tile's first QKᵀ
    issued (the tensor cores get nothing from that warp in between), and for the first role its
    epilogue, the stretch from the epilogue's end to the wait for Q (the store, the next tile's id and
    coordinates), and, where the warp waits for a tile id, from reading it to the wait for Q."""
    bd = first_boundary(lay)
    if bd is None:
        return []
    k = lay.kinds
    words = (("last PV retired → next tile's first QKᵀ", "epilogue", "epilogue's end → wait for Q") if k is FORWARD else
             ("last dQ retired → next key block's first Sᵀ", "store of dK and dV", "store's end → wait for K and V"))
    out = [(f"{name}: {words[0]}", first_qk - retired) for name, retired, first_qk in _boundary_sides(lay)]
    for ln in lead_lanes(lay)[:1]:
        old, new = _sides(ln, bd)
        name = role_label(ln.role)
        epi = [b for b in old if b.event == k.epilogue]
        wait_q = next((b for b in new if b.event == k.first_wait), None)
        if epi:
            out.append((f"{name}: {words[1]}", epi[-1].end - epi[-1].start))
            if wait_q is not None:
                out.append((f"{name}: {words[2]}", wait_q.start - epi[-1].end))
        tile_id = next((b for b in new if b.event == "wait_tile"), None)
        if tile_id is not None and wait_q is not None:
            out.append((f"{name}: tile id read → wait for Q", wait_q.start - tile_id.end))
    return [(label, ns) for label, ns in out if ns >= 0]
