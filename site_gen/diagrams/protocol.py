"""The warp-role protocol of a stage, as data: lanes (roles), rings (shared-memory slots and the
barriers that hand them over), and a few KV tiles of events placed in logical time, with the
signals between roles (a slot filled, a slot freed, a turn passed on).

Everything comes from stage.toml: the roles, the shared-memory buffers (a ring is a tensor buffer
with N buffers and its full/empty barriers; its depth is the buffer count, which the tests check
against KV_STAGES, Q_STAGES, SCHED_STAGES of kernel.cu), and the [[schedule]] ops with their
dependencies. Two rules replace the spec's modelling shortcuts:

- a load into a ring slot waits for the consumers' release of the tile that slot held ``depth``
  tiles earlier (the ring's depth, not the spec's ``prev2``, which the timing model uses);
- an op's tile is found from the data it consumes: a PV that depends on the previous iteration's
  softmax multiplies the previous tile (intra-warpgroup overlap), and a load belongs to the tile of
  the first op of its iteration that reads it.

Time is logical: each op takes one step, a role issues its ops in program order, an asynchronous op
(TMA, cp.async, wgmma) lets the role go on, and a track runs one op at a time. The pipeline
timeline (timeline.py) draws the same stage to scale.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import engines, facts

ONCE = ("load_q", "store_o")


@dataclass(frozen=True)
class Lane:
    role: str
    label: str
    warps: tuple[int, ...]
    registers: int
    colour: str  # palette key
    loads_only: bool  # a producer: issues copies and computes nothing

    @property
    def threads(self) -> int:
        return 32 * len(self.warps)


@dataclass(frozen=True)
class Ring:
    key: str  # "KV", "K", "V", "Q", "ID"
    label: str  # "K/V ring"
    tensors: tuple[str, ...]
    depth: int
    slot_bytes: int
    full: str  # how a consumer learns that a slot is full
    empty: str  # how the filler learns that a slot is free
    colour: str
    per: str  # "KV tile" or "output tile"

    @property
    def mbarriers(self) -> bool:
        return self.empty.startswith("empty")


@dataclass(frozen=True)
class Event:
    lane: str  # role
    track: str  # "copy", "tensor", "softmax"
    kind: str  # schedule kind, or "claim" / "read_id"
    label: str
    tile: int  # KV tile (-1: not a KV tile's)
    start: int
    end: int
    ring: str | None = None  # the ring a load fills
    slot: int | None = None
    by_one_thread: bool = False  # TMA and the tile-id claim: one elected thread issues it


@dataclass(frozen=True)
class Signal:
    kind: str  # "full", "empty", "turn", "sync"
    src: Event
    dst: Event
    ring: str | None = None
    slot: int | None = None


@dataclass(frozen=True)
class Occupancy:
    """A tile in a ring slot: from the copy that fills it to the last release of it."""

    ring: str
    slot: int
    tile: int
    label: str
    start: int
    end: int
    load: Event


@dataclass(frozen=True)
class Barrier:
    time: int
    label: str
    kind: str  # "full" (a tile has landed) or "empty" (every warp is done with a buffer)
    lanes: tuple[str, ...]


@dataclass
class Protocol:
    lanes: list[Lane]
    rings: list[Ring]
    events: list[Event]
    signals: list[Signal]
    tiles: int
    turns: bool  # the consumers take turns on named barriers (pingpong)
    cta_sync: str | None  # a CTA-wide barrier that frees buffers ("__syncthreads", ...)
    barriers: list[Barrier]  # where every warp of the CTA meets (the stages without empty mbarriers)
    occupancy: list[Occupancy]
    epilogue: str = ""  # how O leaves, when it is more than every thread's own stores
    notes: list[str] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return max(e.end for e in self.events)

    def features(self) -> dict[str, str]:
        """What the protocol is made of, as (feature -> description): the roles figure's caption says
        which of these are new or changed against the previous stage."""
        out = {}
        for ln in self.lanes:
            regs = f", setmaxnreg {ln.registers}" if ln.registers else ""
            out[f"lane {ln.role}"] = f"{ln.label} ({len(ln.warps)} warps{regs})"
        for r in self.rings:
            out[f"ring {r.key}"] = (f"{r.label}: {r.depth} slot{'s' if r.depth > 1 else ''} of "
                                    f"{_kib(r.slot_bytes)}, filled on {r.full}, freed on {r.empty}")
        if self.turns:
            out["turns"] = "the consumer warpgroups take turns at the tensor cores on two named barriers"
        if self.cta_sync:
            out["cta sync"] = f"a buffer is refilled after a {self.cta_sync}"
        overlap = [ln.role for ln in self.lanes if _overlaps(self, ln.role)]
        if overlap:
            out["overlap"] = "each consumer's softmax runs while its own PV of the previous tile is in flight"
        if self.epilogue:
            out["epilogue"] = self.epilogue
        for note in self.notes:
            out[f"note {note}"] = note
        return out


def _kib(n: int) -> str:
    return f"{n // 1024} KiB" if n % 1024 == 0 else f"{n} B"


def _overlaps(p: Protocol, role: str) -> bool:
    mine = [e for e in p.events if e.lane == role]
    pv = [e for e in mine if e.kind == "pv"]
    sm = [e for e in mine if e.kind == "softmax"]
    return any(a.start < b.end and b.start < a.end for a in pv for b in sm)


# --- lanes and rings ---------------------------------------------------------------------------


def lanes(stage) -> list[Lane]:
    loaders = {op.role for op in stage.schedule if op.kind.startswith("load")}
    computers = {op.role for op in stage.schedule if not op.kind.startswith("load")}
    out, consumers = [], 0
    for r in stage.roles:
        producer = r.name in loaders and r.name not in computers
        if producer:
            label, colour = "producer", "producer"
        elif len(stage.roles) == 1:
            label = "one warpgroup" if facts.mma_family(stage) == "wgmma" and len(r.warps) == 4 else "all warps"
            colour = "consumer"
        else:
            label = f"consumer {consumers}" if r.name.startswith("consumer") else f"warpgroup {consumers}"
            colour = "consumer" if consumers % 2 == 0 else "consumer2"
            consumers += 1
        out.append(Lane(r.name, label, r.warps, r.registers, colour, producer))
    return out


def _barrier_rings(stage) -> dict[str, set[str]]:
    """Ring key -> {"full", "empty"} from the names of the mbarrier buffers."""
    out: dict[str, set[str]] = {}
    for b in facts.barriers(stage):
        name = b.name.lower()
        m = re.match(r"^(.*?)\b(full|empty)\b", name)
        if not m:
            continue
        prefix = m.group(1).strip()
        key = {"": "KV", "q": "Q", "k": "K", "v": "V", "tile-id": "ID"}.get(prefix)
        if key:
            out.setdefault(key, set()).add(m.group(2))
    return out


def rings(stage) -> list[Ring]:
    """The stage's rings: K/V (joint, or K and V apart), Q when it has full/empty barriers, and the
    tile-id ring of a dynamic scheduler."""
    t = facts.Tiles.of(stage)
    bars = _barrier_rings(stage)
    any_mbarrier = bool(facts.barriers(stage))
    kv_load = facts.load_family(stage, "K")
    cta = "CTA barrier" if len(stage.roles) > 1 else "__syncthreads"

    def how(key, tensors):
        if "full" in bars.get(key, ()):
            full = "full mbarriers (TMA bytes)"
        elif any_mbarrier:
            full = "an mbarrier (TMA bytes)"
        elif kv_load == "cp.async":
            full = "cp.async.wait_group + __syncthreads"
        else:
            full = "__syncthreads"
        empty = "empty mbarriers (consumer arrivals)" if "empty" in bars.get(key, ()) else cta
        return full, empty

    out = []
    k, v = facts.smem_of(stage, "K"), facts.smem_of(stage, "V")
    if k and v:
        if "K" in bars and "V" in bars:
            for x, bufs, tile in (("K", k, t.k), ("V", v, t.v)):
                full, empty = how(x, (x,))
                out.append(Ring(x, f"{x} ring", (x,), bufs[0].buffers, tile, full, empty, x.lower(), "KV tile"))
        else:
            full, empty = how("KV", ("K", "V"))
            out.append(Ring("KV", "K/V ring", ("K", "V"), k[0].buffers, t.k + t.v, full, empty, "k", "KV tile"))
    q = facts.smem_of(stage, "Q")
    if q and "Q" in bars and "empty" in bars["Q"]:
        full, empty = how("Q", ("Q",))
        out.append(Ring("Q", "Q ring", ("Q",), q[0].buffers, t.q, full, empty, "q", "output tile"))
    ids = [b for b in stage.smem if b.layout != "mbarrier" and "tile id" in b.name.lower()]
    if ids and "ID" in bars:
        full, empty = "tile-id full mbarriers", "tile-id empty mbarriers (consumer arrivals)"
        out.append(Ring("ID", "tile-id ring", ("ID",), ids[0].buffers, ids[0].bytes // ids[0].buffers, full, empty,
                        "accent", "output tile"))
    return out


# --- events ------------------------------------------------------------------------------------

LOAD_TENSORS = {"load_k": ("K",), "load_v": ("V",), "load_kv": ("K", "V"), "load_q": ("Q",)}
READS = {"qk": ("Q", "K"), "pv": ("V",), "softmax": (), "store_o": ()}
SHORT = {"load_k": "K", "load_v": "V", "load_kv": "K V", "load_q": "Q", "qk": "QKᵀ", "softmax": "softmax",
         "pv": "PV", "store_o": "store O", "claim": "claim", "read_id": "id"}


def _parse(dep: str) -> tuple[str, int]:
    if dep.startswith("prev2."):
        return dep[6:], 2
    if dep.startswith("prev."):
        return dep[5:], 1
    return dep, 0


def _track(op) -> str:
    if op.kind.startswith("load"):
        return "copy"
    if op.kind in ("qk", "pv"):
        return "tensor"
    return "softmax"


def _shift(stage, op) -> int:
    """1 for a PV that multiplies the previous tile's P (it waits on prev.softmax of its role)."""
    if op.kind != "pv":
        return 0
    by_name = {o.op: o for o in stage.schedule}
    for dep in op.after:
        name, back = _parse(dep)
        if back == 1 and by_name[name].kind == "softmax" and by_name[name].role == op.role:
            return 1
    return 0


def _ring_of(ring_list, kind) -> Ring | None:
    tensors = LOAD_TENSORS[kind]
    for r in ring_list:
        if set(tensors) <= set(r.tensors):
            return r
    return None


def tile_count(stage) -> int:
    """KV tiles drawn: enough for the deepest K/V ring to wrap once, at least three, at most five."""
    kv = [r.depth for r in rings(stage) if r.per == "KV tile"]
    return max(3, min(5, (max(kv) if kv else 2) + 1))


def build(stage, tiles: int | None = None) -> Protocol:
    lane_list = lanes(stage)
    ring_list = rings(stage)
    tiles = tiles or tile_count(stage)
    by_name = {o.op: o for o in stage.schedule}
    loop = [o for o in stage.schedule if o.kind not in ONCE]
    shift = {o.op: _shift(stage, o) for o in loop}

    # The tile of each loop op: loads take the tile of the first same-iteration op that reads them.
    def tile_of(o, it):
        if o.kind.startswith("load"):
            readers = [r for r in loop if o.op in r.after]
            return it - min((shift[r.op] for r in readers), default=0)
        return it - shift[o.op]

    instances = []  # (op, it, tile) in program order per role
    for it in range(tiles + 1):
        for o in loop:
            tile = tile_of(o, it)
            if 0 <= tile < tiles:
                instances.append((o, it, tile))
    keys = {(o.op, it) for o, it, _ in instances}
    tile_at = {(o.op, it): tile for o, it, tile in instances}

    # Releases: the last op of each consumer role that reads a tile of a ring.
    def releases(ring, tile):
        out = []
        for o, it, t in instances:
            if t == tile and set(READS.get(o.kind, ())) & set(ring.tensors) - {"Q"}:
                out.append((o.op, it))
        last = {}
        for name, it in out:
            role = by_name[name].role
            prev = last.get(role)
            if prev is None or (it, loop.index(by_name[name])) > (prev[1], loop.index(by_name[prev[0]])):
                last[role] = (name, it)
        return sorted(last.values(), key=lambda k: (k[1], loop.index(by_name[k[0]])))

    deps: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for o, it, tile in instances:
        ring = _ring_of(ring_list, o.kind) if o.kind.startswith("load") else None
        if o.kind.startswith("load") and ring is not None:
            deps[(o.op, it)] = [k for k in releases(ring, tile - ring.depth) if k in keys]
            continue
        out = []
        for dep in o.after:
            name, back = _parse(dep)
            key = (name, it - back)
            if key in keys:
                out.append(key)
            elif by_name[name].role != o.role and it - back >= 0:
                # The op would belong to a tile before the first (a PV one tile behind): the turn
                # still passes after what its role ran before it in that iteration.
                before = [x for x in loop[:loop.index(by_name[name])] if x.role == by_name[name].role]
                sub = next(((x.op, it - back) for x in reversed(before) if (x.op, it - back) in keys), None)
                if sub is not None:
                    out.append(sub)
        deps[(o.op, it)] = out

    # Logical list scheduling. A role issues from two streams: its asynchronous copies (prefetches,
    # as far ahead as their barriers allow) and everything else, each in program order.
    def stream(o):
        return f"{o.role} copies" if engines.family(o.engine) in ("cp.async", "tma") else o.role

    roles = [ln.role for ln in lane_list]
    streams = []
    for o, _it, _t in instances:
        if stream(o) not in streams:
            streams.append(stream(o))
    streams.sort(key=lambda st: (roles.index(st.split(" ")[0]), st))
    seq = {st: [(o, it) for o, it, _ in instances if stream(o) == st] for st in streams}
    ev: dict[tuple[str, int], Event] = {}
    cursor = {st: 0 for st in streams}
    track_free: dict[tuple[str, str], int] = {}
    pos = {st: 0 for st in streams}
    q_ready = _prologue(stage, lane_list, ring_list, ev, cursor, track_free)
    total = sum(len(v) for v in seq.values())
    placed = 0
    while placed < total:
        best = None
        for si, st in enumerate(streams):
            if pos[st] >= len(seq[st]):
                continue
            o, it = seq[st][pos[st]]
            d = deps[(o.op, it)]
            if any(k not in ev for k in d):
                continue
            ready = max([cursor[st], track_free.get((o.role, _track(o)), 0)] + [ev[k].end for k in d])
            if o.kind == "qk" and tile_at[(o.op, it)] == 0:
                ready = max(ready, q_ready.get(o.role, 0))
            cand = (ready, si)
            if best is None or cand < best:
                best = cand
        if best is None:
            raise ValueError(f"stage {stage.id}: the role protocol deadlocks")
        start, si = best
        st = streams[si]
        o, it = seq[st][pos[st]]
        tile = tile_at[(o.op, it)]
        ring = _ring_of(ring_list, o.kind) if o.kind.startswith("load") else None
        e = Event(o.role, _track(o), o.kind, f"{SHORT[o.kind]} {tile}", tile, start, start + 1,
                  ring.key if ring else None, tile % ring.depth if ring else None,
                  by_one_thread=engines.family(o.engine) == "tma")
        ev[(o.op, it)] = e
        track_free[(o.role, e.track)] = e.end
        cursor[st] = start if engines.is_async(o.engine) else e.end
        pos[st] += 1
        placed += 1

    events = sorted(ev.values(), key=lambda e: (e.start, roles.index(e.lane), e.track))
    events += _epilogue(stage, lane_list, ring_list, ev, cursor, track_free)
    lane_of = {ln.role: ln for ln in lane_list}
    producer_roles = {ln.role for ln in lane_list if ln.loads_only}

    signals = []
    for (name, it), e in ev.items():
        if name.startswith("_"):
            continue
        o = by_name[name]
        for k in deps[(name, it)]:
            src = ev[k]
            so = by_name[k[0]]
            if o.kind.startswith("load"):
                ring = _ring_of(ring_list, o.kind)
                if src.lane != e.lane and ring is not None and ring.mbarriers:
                    signals.append(Signal("empty", src, e, ring.key, e.slot))
            elif so.kind.startswith("load"):
                ring = _ring_of(ring_list, so.kind)
                if ring is not None and (src.lane != e.lane or src.by_one_thread):
                    signals.append(Signal("full", src, e, ring.key, src.slot))
            elif src.lane != e.lane and so.kind in ("qk", "pv") and o.kind in ("qk", "pv") and producer_roles:
                signals.append(Signal("turn", src, e))
    claim = ev.get(("_claim", 0))
    for e2 in [e for e in ev.values() if e.kind == "read_id"]:
        if claim is not None:
            signals.append(Signal("full", claim, e2, "ID", 0))
    q = ev[("_load_q", 0)]
    for (n2, it2), e2 in ev.items():
        if not n2.startswith("_") and by_name[n2].kind == "qk" and tile_at[(n2, it2)] == 0 \
                and (e2.lane != q.lane or q.by_one_thread):
            signals.append(Signal("full", q, e2, "Q" if any(r.key == "Q" for r in ring_list) else None, 0))
    signals.sort(key=lambda s: (s.dst.start, s.src.start, s.kind, s.src.lane, s.dst.lane))

    turns = any(s.kind == "turn" for s in signals)
    kv = next((r for r in ring_list if r.per == "KV tile"), None)
    cta_sync = None
    barriers = []
    if kv is not None and not kv.mbarriers:
        cta_sync = kv.empty
        everyone = tuple(ln.role for ln in lane_list)
        for e in events:
            if e.ring == kv.key and e.tile >= kv.depth:
                barriers.append(Barrier(e.start, cta_sync, "empty", everyone))
            if e.kind == "qk" and "__syncthreads" in kv.full and e.lane == everyone[0]:
                barriers.append(Barrier(e.start, "wait_group + __syncthreads" if "wait_group" in kv.full
                                        else "__syncthreads", "full", everyone))
        merged: dict[int, Barrier] = {}
        for b in sorted(set(barriers), key=lambda b: (b.time, b.kind != "full")):
            merged.setdefault(b.time, b)  # one barrier at a time: a full one also frees the buffer
        barriers = [merged[t] for t in sorted(merged)]
    notes = []
    if stage.causal:
        notes.append("causal: the tiles past the diagonal are never loaded, the diagonal tile is masked")
    if stage.tails:
        notes.append("any length: TMA fills zeros past the end, the last tile is masked")
    if stage.lse:
        notes.append("the epilogue also writes the log-sum-exp of each row")
    if lane_of and not any(ln.loads_only for ln in lane_list) and kv is not None:
        loaders = {op.role for op in stage.schedule if op.kind.startswith("load")}
        if len(lane_list) > 1 and len(loaders) == 1:
            notes.append(f"one thread of {lane_of[next(iter(loaders))].label} issues the copies for both")
    occupancy = _occupancy(ring_list, lane_list, events, ev, releases, keys)
    epilogue = ""
    if facts.o_path(stage)[-1] == "tma-store":
        epilogue = ("each consumer stages O in shared memory between two named-barrier syncs of its own "
                    "128 threads; one thread issues the TMA store, which runs under the next tile")
    return Protocol(lane_list, ring_list, events, signals, tiles, turns, cta_sync, barriers, occupancy,
                    epilogue=epilogue, notes=notes)


def _occupancy(ring_list, lane_list, events, ev, releases, keys) -> list[Occupancy]:
    out = []
    end_of = max(e.end for e in events)
    for r in ring_list:
        for e in [e for e in events if e.ring == r.key and e.kind in ("load_k", "load_v", "load_kv", "load_q", "claim")]:
            if r.per == "KV tile":
                rel = [ev[k].end for k in releases(r, e.tile) if k in ev]
                end = max(rel) if rel else end_of
            elif r.key == "Q":
                pv = [x.end for x in events if x.kind == "pv"]
                end = max(pv) if e.slot == 0 and pv else end_of
            else:  # tile ids: each consumer reads the id, then arrives on the slot's empty barrier
                reads = [x.end for x in events if x.kind == "read_id" and x.slot == e.slot]
                end = max(reads) if reads else end_of
            label = f"tile {e.tile}" if e.tile >= 0 else {
                ("Q", 0): "Q of this output tile", ("Q", 1): "Q of the next one",
                ("ID", 0): "this tile's id", ("ID", 1): "the next id"}.get((r.key, e.slot), e.label)
            out.append(Occupancy(r.key, e.slot, e.tile, label, e.start, max(end, e.end), e))
    return out


def _prologue(stage, lane_list, ring_list, ev, cursor, track_free) -> dict[str, int]:
    """The tile-id claim and the Q load before the first KV tile; returns when Q is in, per role."""
    q_ops = [o for o in stage.schedule if o.kind == "load_q"]
    loader = q_ops[0].role if q_ops else next(o.role for o in stage.schedule if o.kind.startswith("load"))
    t = 0
    ids = next((r for r in ring_list if r.key == "ID"), None)
    if ids is not None:
        ev[("_claim", 0)] = Event(loader, "copy", "claim", "id", -1, 0, 1, "ID", 0, by_one_thread=True)
        t = 1
        for ln in lane_list:
            if not ln.loads_only:
                ev[(f"_read_id_{ln.role}", 0)] = Event(ln.role, "softmax", "read_id", "id", -1, 1, 2, "ID", 0)
    fam = facts.load_family(stage, "Q")
    q_ring = next((r for r in ring_list if r.key == "Q"), None)
    ev[("_load_q", 0)] = Event(loader, "copy", "load_q", "Q", -1, t, t + 1, "Q" if q_ring else None,
                               0 if q_ring else None, by_one_thread=fam == "tma")
    track_free[(loader, "copy")] = t + 1
    for st in cursor:
        if st == loader and fam not in engines.ASYNC:
            cursor[st] = t + 1
        elif ids is not None and not st.endswith(" copies") and st != loader:
            cursor[st] = max(cursor[st], 2)
    ready = {ln.role: t + 1 for ln in lane_list}
    return ready


def _epilogue(stage, lane_list, ring_list, ev, cursor, track_free) -> list[Event]:
    """Each computing role's store of O after its last PV; a persistent stage's producer then
    loads the next output tile's Q into the other slot of the Q ring."""
    out = []
    for ln in lane_list:
        if ln.loads_only:
            continue
        mine = [e for e in ev.values() if e.lane == ln.role and e.kind == "pv"]
        if not mine:
            continue
        last = max(e.end for e in mine)
        label = "O, LSE" if stage.lse else "store O"
        e = Event(ln.role, "softmax", "store_o", label, -1, last, last + 2)
        ev[(f"_store_{ln.role}", 0)] = e
        out.append(e)
    q_ring = next((r for r in ring_list if r.key == "Q"), None)
    if q_ring is not None and q_ring.depth > 1:
        producer = next((ln.role for ln in lane_list if ln.loads_only), None)
        if producer is not None:
            at = max(e.end for e in ev.values() if e.lane == producer)
            ids = next((r for r in ring_list if r.key == "ID"), None)
            if ids is not None:
                e = Event(producer, "copy", "claim", "id", -1, at, at + 1, "ID", 1, by_one_thread=True)
                ev[("_claim", 1)] = e
                out.append(e)
                at += 1
            e = Event(producer, "copy", "load_q", "Q", -1, at, at + 1, "Q", 1, by_one_thread=True)
            ev[("_load_q", 1)] = e
            out.append(e)
    return out
