"""The backward's warp roles: the CTA's warps by role, then one lane per role over a few query
blocks in logical time (each op one step, a role issuing in program order, an asynchronous op
letting its role go on), the hand-offs between roles as arrows, and, where the warps share tiles
through shared memory without mbarriers, the CTA barriers every warp meets at.

The data is protocol(stage), from the spec's [[roles]], [[schedule]] and [[smem]]; the K/V load of
the prologue and the dK/dV store of the epilogue are drawn once (implicit when the schedule has
none: the roles' tasks say "once"). An asynchronous copy (TMA, cp.async) is a prefetch, issued as
early as its `after` list allows (the schedule model's rule), so a double buffer's next tiles land
during the step before.

Who owns which rows of each product (ownership) comes from the GEMMs' form (facts.gemms) and the
instruction: mma.sync splits a product's M among the role's warps, 16 rows each; wgmma among its
warpgroups, 64 rows each, and an M too small to split is split along N instead. When the owner of
a product's rows changes between products, the warps read each other's P or dS: that is a CTA
barrier. The barriers (one role, tiles in shared memory): after loads that land without an
mbarrier; before the first GEMM that reads P or dS from shared memory; and before a step may
overwrite what the previous one read — the next loads (ordinary loads), or, when the loads are a
thread's TMA completing on mbarriers with no "empty" barrier, at the end of every step.

Where the GEMMs are one role's among several (a producer beside the consumers), the warpgroups of
that role meet at named barriers of its threads (bar.sync with a count) where they share dS, and
the roles hand tiles over on mbarriers (the [[smem]] "full" and "empty" ones): the hand-off arrows.
When dQ goes through shared memory (facts.dq_path().bulk), each query block's bulk reduce-add is
an event of the role whose task issues it, after the dQ GEMM it adds: on its copies track, or, when
warps of another role issue it (a producer's dQ warps), on a track of its own.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .. import engines
from ..diagram import Diagram
from ..protocol import lanes as forward_lanes
from ..svg import Canvas, text_width, wrap
from ..timeline import BACKWARD_COLOUR
from . import facts
from .operands import plan

W = 860
LEFT = 168
X0, X1 = LEFT + 8, W - 14
TRACK_H, TRACK_GAP = 26, 4
BLOCKS = 2  # query blocks drawn
TRACKS = {"copy": "copies", "tensor": "tensor cores", "softmax": "softmax, epilogue", "reduce": "dQ reduce-adds"}
SHORT = {"load_q": "Q", "load_do": "dO", "load_k": "K", "load_v": "V", "load_kv": "K V", "qk": "S", "dp": "dP",
         "softmax": "P dS", "dv": "dV", "dk": "dK", "dq": "dQ", "store_dkdv": "dK dV", "reduce_dq": "+dQ"}
GEMMS = ("qk", "dp", "dv", "dk", "dq")
LOADS = ("load_q", "load_do", "load_k", "load_v", "load_kv")
PER_CTA = ("load_k", "load_v", "load_kv", "store_dkdv")


@dataclass(frozen=True)
class Event:
    lane: str
    track: str
    kind: str
    label: str
    block: int  # query block (-1: once per CTA)
    start: int
    end: int


@dataclass(frozen=True)
class Sync:
    time: int
    label: str
    threads: int | None = None  # a named barrier of this many threads (one role's); None: the CTA's


@dataclass
class Protocol:
    lanes: list
    events: list[Event]
    handoffs: list[tuple[Event, Event]]
    syncs: list[Sync]
    notes: list[str]

    @property
    def steps(self) -> int:
        return max(e.end for e in self.events)


def _track(kind: str) -> str:
    if kind in LOADS:
        return "copy"
    if kind in ("store_dkdv", "softmax"):
        return "softmax"
    return "tensor"


def short(stage, kind: str) -> str:
    """An op's label in a lane: the product as the stage holds it (S or Sᵀ, ...)."""
    held = {"qk": "S", "dp": "dP"}
    if kind in held:
        return facts.held_name(stage, held[kind])
    if kind == "softmax":
        return f"{facts.held_name(stage, 'P')} {facts.held_name(stage, 'dS')}"
    return SHORT[kind]


def _and(items) -> str:
    items = list(items)
    if len(items) < 2:
        return "".join(items)
    join = ", and " if any(" and " in x for x in items) else " and "
    return ", ".join(items[:-1]) + join + items[-1]


@dataclass(frozen=True)
class Owner:
    """Which part of a product one unit (a warp of mma.sync, a warpgroup of wgmma) computes."""

    unit: str  # "warp" or "warpgroup"
    dim: str  # the GEMM's M: "q" or "k"
    rows: int  # rows of M per unit
    cols: int | None  # columns of N per unit when M is too small to split (None: all of N)
    n: int  # N of the whole product
    k_dim: str
    k_size: int


def computing_role(stage) -> str | None:
    """The role that runs the five GEMMs, when one does (None: they are split among roles)."""
    roles = {op.role for op in stage.schedule if op.kind in GEMMS}
    return next(iter(roles)) if len(roles) == 1 else None


def _role(stage, name):
    return next((r for r in stage.roles if r.name == name), None)


def units(stage) -> tuple[str, int]:
    """("warp", 4) or ("warpgroup", 2): what issues one MMA, and how many the computing role has."""
    comp = _role(stage, computing_role(stage))
    warps = len(forward_lanes(stage)[0].warps) if len(stage.roles) == 1 else len(comp.warps) if comp else 4
    if facts.mma(stage) == "wgmma":
        return "warpgroup", max(1, warps // 4)
    return "warp", warps


def ownership(stage) -> dict[str, Owner]:
    """Per product kind (qk, dp, softmax, dv, dk, dq): what each unit of the role computes."""
    unit, count = units(stage)
    gran = 64 if unit == "warpgroup" else 16
    size = {"q": stage.block_m, "k": stage.block_n, "d": stage.head_dim}
    out = {}
    for g in facts.gemms(stage):
        m = size[g.m]
        tiles = max(1, m // gran)
        if tiles >= count:
            out[g.kind] = Owner(unit, g.m, m // count, None, size[g.n], g.k, size[g.k])
        else:
            out[g.kind] = Owner(unit, g.m, m, size[g.n] * tiles // count, size[g.n], g.k, size[g.k])
        if g.kind == "qk":
            out["softmax"] = out["qk"]
    return out


def ownership_notes(stage, barrier_between: bool) -> list[str]:
    """The notes under the lanes: who owns what, and how the operands are read."""
    own = ownership(stage)
    gem = {g.kind: g for g in facts.gemms(stage)}
    names = {"qk": gem["qk"].out_shown, "dp": gem["dp"].out_shown, "dv": "dV", "dk": "dK", "dq": "dQ",
             "softmax": f"{facts.held_name(stage, 'P')} and {facts.held_name(stage, 'dS')}"}
    groups: dict[tuple, list[str]] = {}  # by the rows a unit owns
    for kind in ("qk", "dp", "softmax", "dv", "dk", "dq"):
        if kind in own:
            o = own[kind]
            groups.setdefault((o.unit, o.dim, o.rows, o.cols), []).append(kind)
    word = {"q": "query rows", "k": "keys"}
    places = {(g.kind, ch.role): ch.place for g, chips in plan(stage) for ch in chips}
    parts = []
    for i, kinds in enumerate(groups.values()):
        o = own[kinds[0]]
        if o.cols is None:
            text = f"{_and(names[k] for k in kinds)}: each {o.unit} its {o.rows} {word[o.dim]}"
        else:
            text = (f"{_and(names[k] for k in kinds)}: each {o.unit} the step's {o.rows} {word[o.dim]} × {o.cols} of "
                    f"the {o.n} head-dim columns, over all {o.k_size} {word.get(o.k_dim, 'head-dim columns')}")
        if i > 0:  # the point of view changed: what the group reads the other way round
            reads = [places[(k, r)] for r in ("A", "B") for k in kinds if (k, r) in places]
            flipped = [pl.base for pl in reads if pl.how in ("ldmatrix.trans", "wgmma desc., MN-major")]
            if flipped:
                how = "transposed" if any(pl.how == "ldmatrix.trans" for pl in reads) else "MN-major"
                text += f", reading {_and(dict.fromkeys(flipped))} {how}"
            if barrier_between:
                text += " (the barrier between is where the point of view changes)"
        parts.append(text)
    notes = ["; ".join(parts)]
    if facts.mma(stage) == "wgmma":
        regs = [pl.tensor for (k, r), pl in places.items() if r == "A" and pl.level == "regs"]
        frag = engines.family(stage.movement.kv_fragments or "wgmma")
        notes.append(f"Every product is one {units(stage)[0]}'s wgmma: A and B from shared memory through descriptors"
                     + (f", or A from registers ({_and(regs)})" if regs else "")
                     + ("; nothing goes through ldmatrix" if frag != "ldmatrix" else ""))
    return notes


def first_group(stage) -> int:
    """The warpgroup index of the computing role's first warp (1 when a producer warpgroup comes first)."""
    comp = _role(stage, computing_role(stage))
    return min(comp.warps) // 4 if comp else 0


def duties(stage) -> dict[int, str]:
    """What each warp of a role that runs no GEMM does, from its tasks ("warp 0, one thread: the TMA
    of ...", "warps 1 and 2 ...: cp.reduce.async.bulk", "warp 3: nothing"): "load", "dQ · wg N"
    (the i-th dQ warp adds the computing role's i-th warpgroup's tiles) or "idle"."""
    comp = computing_role(stage)
    out: dict[int, str] = {}
    for r in stage.roles:
        if r.name == comp:
            continue
        for t in r.tasks:
            warps = facts._warps_named(t)
            if facts.BULK_RE.search(t):
                names = [f"dQ · wg {first_group(stage) + i}" for i in range(len(warps))]
            elif re.search(r"\btma\b|\bload", t, re.I):
                names = ["load"] * len(warps)
            elif re.search(r"\bnothing\b|\bidle\b", t, re.I):
                names = ["idle"] * len(warps)
            else:
                continue
            for w, name in zip(warps, names):
                out.setdefault(w, name)
    return out


def _job_runs(jobs: dict[int, str]) -> list[tuple[list[int], str]]:
    """Consecutive warps of one duty, labelled once: "dQ · wg 1" and "dQ · wg 2" make "dQ: wg 1, 2"."""
    runs: list[tuple[list[int], str]] = []
    for w, job in sorted(jobs.items()):
        kind = job.split(" ·")[0]
        if runs and runs[-1][0][-1] == w - 1 and runs[-1][1].split(" ·")[0].split(":")[0] == kind:
            runs[-1][0].append(w)
            runs[-1] = (runs[-1][0], runs[-1][1] + "\0" + job)
        else:
            runs.append(([w], job))
    out = []
    for ws, label in runs:
        parts = label.split("\0")
        if len(parts) > 1 and all(" · wg " in x for x in parts):
            label = f"{parts[0].split(' · ')[0]}: wg " + ", ".join(x.split(" · wg ")[1] for x in parts)
        else:
            label = parts[0]
        out.append((ws, label))
    return out


def _mbarrier_names(stage) -> str:
    return " ".join(b.name.lower() for b in stage.smem if b.layout == "mbarrier")


def handed_back(stage) -> bool:
    """The roles hand buffers back on "empty" mbarriers as well as over on "full" ones."""
    names = _mbarrier_names(stage)
    return "full" in names and "empty" in names


def loads_on_mbarriers(stage) -> bool:
    """Q and dO land on an mbarrier (a TMA's transaction count), so no CTA barrier says they are in."""
    engine = stage.movement.q_load or next((o.engine for o in stage.schedule if o.kind in ("load_q", "load_do")),
                                           "ld.global")
    return engines.family(engine) == "tma"


def _free_at_step_end(stage) -> bool:
    """One thread refills a stage's buffers (TMA) with no "empty" mbarrier to say every thread is done
    with them: a CTA barrier at the end of every step says it."""
    return loads_on_mbarriers(stage) and not any("empty" in b.name.lower() for b in stage.smem
                                                 if b.layout == "mbarrier")


def _parse(dep: str) -> tuple[str, int]:
    for prefix, back in (("prev2.", 2), ("prev.", 1)):
        if dep.startswith(prefix):
            return dep[len(prefix):], back
    return dep, 0


def _lanes(stage):
    """The lanes of protocol.lanes, the computing role named for its warpgroups ("consumers") when
    it is one role of several."""
    lanes = forward_lanes(stage)
    comp = computing_role(stage)
    if len(lanes) > 1 and units(stage)[1] > 1:
        lanes = [dataclasses.replace(ln, label=f"{ln.role}s") if ln.role == comp and ln.role.startswith("consumer")
                 else ln for ln in lanes]
    return lanes


def protocol(stage, blocks: int = BLOCKS) -> Protocol:
    lane_list = _lanes(stage)
    roles = [ln.role for ln in lane_list]
    by_name = {o.op: o for o in stage.schedule}
    loop = [o for o in stage.schedule if o.kind not in PER_CTA]
    loader = next((o.role for o in stage.schedule if o.kind in LOADS), roles[0])
    events: dict[tuple[str, int], Event] = {}
    cursor = {r: 0 for r in roles}
    busy: dict[tuple[str, str], int] = {}
    # The prologue: K and V of the CTA's key block, once.
    pro = [o for o in stage.schedule if o.kind in ("load_k", "load_v", "load_kv")]
    t = 0
    for o in pro or [None]:
        kind = o.kind if o else "load_kv"
        role = o.role if o else loader
        events[(o.op if o else "_kv", -1)] = Event(role, "copy", kind, SHORT[kind], -1, t, t + 1)
        t += 1
    for r in roles:
        cursor[r] = t if r == loader else cursor[r]
    if pro or any(o.kind in LOADS and engines.is_async(o.engine) for o in loop):
        busy[(loader, "copy")] = t  # a prefetch queues behind the prologue's copies
    kv_done = t
    one_role = len(lane_list) == 1
    barriers = one_role and not any(b.layout == "mbarrier" for b in stage.smem)
    step_end = one_role and _free_at_step_end(stage)
    ends: list[int] = []  # step_end: where each block's closing CTA barrier falls
    # The loop, block by block, each op one step.
    for it in range(blocks):
        if step_end and it > 0:  # every thread has passed the previous block's closing barrier
            ends.append(max(e.end for (n2, i2), e in events.items() if i2 == it - 1 and e.kind not in LOADS))
            for r in roles:
                cursor[r] = max(cursor[r], ends[-1])
        for o in loop:
            deps = []
            for dep in o.after:
                name, back = _parse(dep)
                if (name, it - back) in events:
                    deps.append(events[(name, it - back)])
            prefetch = o.kind in LOADS and engines.is_async(o.engine)  # issued as early as `after` allows
            start = max([0 if prefetch else cursor[o.role], busy.get((o.role, _track(o.kind)), 0)]
                        + [e.end for e in deps])
            if o.kind in ("qk", "dp", "dv", "dk", "dq") and it == 0:
                start = max(start, kv_done)
            if barriers and o.kind not in LOADS and any(e.kind in LOADS for e in deps):
                # a CTA barrier: every warp's loads of this block have landed
                start = max([start] + [e.end for (n2, i2), e in events.items() if i2 == it and e.kind in LOADS])
            e = Event(o.role, _track(o.kind), o.kind, short(stage, o.kind), it, start, start + 1)
            events[(o.op, it)] = e
            busy[(o.role, e.track)] = e.end
            if not prefetch:
                cursor[o.role] = start if engines.is_async(o.engine) else e.end
    if step_end:  # the last block's closing barrier
        ends.append(max(e.end for (n2, i2), e in events.items() if i2 == blocks - 1 and e.kind not in LOADS))
    # dQ through shared memory: each block's bulk reduce-add, once its tile holds the dQ GEMM's share
    # (issued, not waited for: the issuing role goes on, and the closing barrier does not wait for it)
    bulk = facts.dq_path(stage).bulk
    reduce_handoffs = []
    dq_op = next((o.op for o in loop if o.kind == "dq"), None)
    if bulk and dq_op and bulk.issuer_role in roles:
        track = "copy" if bulk.issuer_role == computing_role(stage) else "reduce"
        for it in range(blocks):
            src = events[(dq_op, it)]
            start = max(src.end, busy.get((bulk.issuer_role, track), 0))
            e = Event(bulk.issuer_role, track, "reduce_dq", SHORT["reduce_dq"], it, start, start + 1)
            events[("_reduce", it)] = e
            busy[(bulk.issuer_role, track)] = e.end
            if src.lane != e.lane:
                reduce_handoffs.append((src, e))
    # The epilogue: dK and dV, once, after the role's last dK/dV (and the last block's closing barrier).
    stores = [o for o in stage.schedule if o.kind == "store_dkdv"]
    grads = [e for e in events.values() if e.kind in ("dk", "dv")]
    owners = [o.role for o in stores] or sorted({e.lane for e in grads}, key=roles.index) or [roles[-1]]
    for role in owners:
        last = max(([e.end for e in grads if e.lane == role] or [max(e.end for e in events.values())]) + ends[-1:])
        events[(f"_store_{role}", -1)] = Event(role, "softmax", "store_dkdv", SHORT["store_dkdv"], -1, last, last + 2)

    handoffs = []
    for (name, it), e in events.items():
        if name.startswith("_") or name not in by_name:
            continue
        for dep in by_name[name].after:
            dname, back = _parse(dep)
            src = events.get((dname, it - back))
            if src is not None and src.lane != e.lane:
                handoffs.append((src, e))
    handoffs += reduce_handoffs
    handoffs.sort(key=lambda p: (p[1].start, p[0].start, p[0].lane))

    comp = computing_role(stage)
    if one_role:
        syncs = _syncs(stage, events, by_name, blocks, barriers, ends)
    elif comp is not None:
        syncs = _role_syncs(stage, events, by_name, blocks, comp)
    else:
        syncs = []
    notes = []
    if one_role or comp is not None:
        notes += ownership_notes(stage, any(_shared_reads(stage)))
    loader_role = next((o.role for o in stage.schedule if o.kind in LOADS), None)
    if loads_on_mbarriers(stage) and loader_role is not None and loader_role != comp and handed_back(stage):
        notes.append(_handed_loads_note(stage, loader_role, comp))
    elif loads_on_mbarriers(stage):
        q_bufs = facts.smem_of(stage, "Q")
        depth = q_bufs[0].buffers if q_bufs else 1
        ahead = f" a step ahead, into the other of the {depth} stages" if depth > 1 else ""
        notes.append(f"Loads: one thread starts each TMA (K and V once; Q and dO{ahead}); every thread waits on "
                     "the tiles' mbarrier, not at a CTA barrier")
    path = facts.dq_path(stage)
    if path.bulk:
        notes.append(_bulk_note(stage, path))
    elif path.atomic:
        notes.append(f"dQ: each warp adds its rows into the fp32 accumulator by {path.mechanism} "
                     f"({path.adds_label}), without waiting for anyone")
    if stage.gqa:
        notes.append("The loop runs over the query blocks of every query head of the CTA's K/V head")
    return Protocol(lane_list, sorted(events.values(), key=lambda e: (e.start, roles.index(e.lane), e.track)),
                    handoffs, syncs, notes)


def _handed_loads_note(stage, loader, comp) -> str:
    """Loads by a warp of another role, handed over on full mbarriers and back on empty ones."""
    q_bufs = facts.smem_of(stage, "Q")
    depth = q_bufs[0].buffers if q_bufs else 1
    load_warps = [w for w, d in duties(stage).items() if d == "load"]
    warp = f"load warp (warp {load_warps[0]}, one thread)" if len(load_warps) == 1 else "loading thread"
    stats = ", lse₂ and D with them" if facts.stats_load(stage) else ""
    n = len(_role(stage, comp).warps)
    return (f"Loads: the {loader}'s {warp} starts each TMA (K and V once; Q and dO into the {depth} stages{stats}) "
            f"on the stage's full mbarrier, which the {comp} warps wait on; each {comp} warp arrives on the stage's "
            f"empty mbarrier once its products that read Q and dO are done, and the {warp.split(' (')[0]} refills the "
            f"stage when all {n} have")


def _bulk_note(stage, path) -> str:
    """dQ through shared memory: who stores the tile, who adds it, and (ordered) who waits for the turns."""
    b = path.bulk
    group = facts.group_name(b.writers)
    comp = computing_role(stage)
    text = facts.text_of(stage)
    if b.own_warps:
        ws = list(b.issuer_warps)
        named = " and ".join(", ".join(map(str, ws[:-1])).split(", ") + [str(ws[-1])]) if len(ws) > 1 else str(ws[0])
        out = (f"dQ: each {comp} {group} stores its {b.tile_rows}×{b.tile_cols} share into "
               + ("its tile" if b.tiles_per_op == 1 else f"one of its {b.tiles_per_op} tiles in turn")
               + f" ({b.store}, {b.stores} per thread)"
               + (", and every thread arrives on the tile's full mbarrier" if handed_back(stage) else "")
               + f"; its dQ warp (warp{'s' if len(ws) > 1 else ''} {named} of the {b.issuer_role}, one per {group}) "
               f"adds the tile with one bulk reduce-add ({b.tile_bytes // 1024} KiB)"
               + (" and hands it back on its empty mbarrier once the operation is done" if handed_back(stage) else ""))
        if path.ordered:
            out += (f". Deterministic mode: the dQ warp waits for the query block's turn before each reduce-add and "
                    f"for its completion after it; the {comp}s wait only if they get {b.tiles_per_op} tiles ahead")
        return out
    barriers = " between two barriers of its 128 threads" if "warpgroup barrier" in text and b.writers == 128 else ""
    out = (f"dQ: each {group} stores its {b.tile_rows}×{b.tile_cols} share into its shared tile ({b.store}, "
           f"{b.stores} per thread){barriers}; one thread adds the tile with one bulk reduce-add "
           f"({b.tile_bytes // 1024} KiB) and the {group} goes on")
    if path.ordered:
        out += (". Deterministic mode: that thread first waits for the query block's turn, and after the add for "
                f"its completion, while its {group} waits for it" + (" at the step's closing barrier"
                                                                    if _free_at_step_end(stage) else ""))
    return out


def _role_syncs(stage, events, by_name, blocks, comp) -> list[Sync]:
    """Where the warpgroups of the computing role meet, when it is one role of several: named
    barriers of its threads around the P or dS it shares through shared memory — before it is
    overwritten (every warpgroup's readers of the block before are done; a single buffer, no CTA
    barrier closing the step) and once it is in, before its first reader."""
    shared = _shared_reads(stage)
    threads = 32 * len(_role(stage, comp).warps)
    if not shared or units(stage)[1] < 2:
        return []
    readers = [g for g, chips in plan(stage) for ch in chips
               if ch.role != "C" and ch.place.base in ("P", "dS") and ch.place.level == "smem"]
    single = all(b.buffers == 1 for b in facts.smem_of(stage, "P") + facts.smem_of(stage, "dS"))
    unit = units(stage)[0]
    out = []
    for it in range(blocks):
        mine = sorted(((by_name[n], e) for (n, i), e in events.items() if i == it and n in by_name
                       and e.lane == comp), key=lambda oe: oe[1].start)
        first = next((e for o, e in mine if o.kind in {g.kind for g in readers}), None)
        if first is None:
            continue
        if single:
            out.append(Sync(first.start, f"bar.sync: {_and(shared)} may be overwritten: every {unit}'s "
                                         f"{_and(dict.fromkeys(g.out_shown for g in readers))} of the block before "
                                         "has read it", threads))
        out.append(Sync(first.start, f"bar.sync: {_and(shared)} in shared memory", threads))
    return out


def _shared_reads(stage) -> list[str]:
    """P and dS as the GEMMs read them from shared memory ("P", "dSᵀ", ...), in order."""
    out = []
    for _g, chips in plan(stage):
        for ch in chips:
            if ch.role != "C" and ch.place.base in ("P", "dS") and ch.place.level == "smem":
                out.append(ch.place.base)
    return [facts.held_name(stage, t) for t in sorted(set(out), key=("P", "dS").index)]


def _syncs(stage, events, by_name, blocks, barriers=True, ends=()) -> list[Sync]:
    """Where every warp meets (one role): before the first reader of the tiles the warps loaded
    together into shared memory (no mbarriers), before the first GEMM that reads P or dS from
    shared memory, and before a step overwrites what the previous one read: the next loads, or the
    end of the step (``ends``, when one thread's TMA refills the buffers)."""
    shared = _shared_reads(stage)
    readers = {g.kind for g, chips in plan(stage) for ch in chips
               if ch.role != "C" and ch.place.base in ("P", "dS") and ch.place.level == "smem"}
    out: dict[int, str] = {}
    for it in range(blocks):
        mine = sorted(((by_name[n], e) for (n, i), e in events.items() if i == it and n in by_name),
                      key=lambda oe: oe[1].start)
        loaded = [o.kind for o, _e in mine if o.kind in LOADS]
        seen_loads = seen_p = seen_free = False
        for o, e in mine:
            kinds = {by_name[_parse(d)[0]].kind for d in o.after if _parse(d)[0] in by_name}
            if o.kind in LOADS:
                if barriers and it > 0 and any(_parse(d)[1] > 0 for d in o.after) and not seen_free:
                    seen_free = True
                    out.setdefault(e.start, "bar.sync: the tiles are free again")
            elif barriers and kinds & set(LOADS) and not seen_loads:
                seen_loads = True
                out.setdefault(e.start, f"bar.sync: {', '.join(SHORT[k] for k in loaded)} in shared memory")
            elif "softmax" in kinds and o.kind in readers and shared and not seen_p:
                seen_p = True
                out.setdefault(e.start, f"bar.sync: {', '.join(shared)} in shared memory")
    if ends:
        loaded = [SHORT[k] for k in dict.fromkeys(o.kind for o in stage.schedule if o.kind in ("load_q", "load_do"))]
        label = f"bar.sync: every read of the step's {_and(loaded + shared)} is done: they may be overwritten"
        for t in ends:
            out.setdefault(t, label)
    return [Sync(t, out[t]) for t in sorted(out)]


def _units_text(stage, prev) -> str:
    """", 2 warpgroups of 64 keys": what issues the products, when that changed since ``prev`` (or the
    roles did)."""
    unit, count = units(stage)
    if (unit, count) == units(prev) and len(stage.roles) == len(prev.roles):
        return ""
    if len(stage.roles) != 1 and computing_role(stage) is None:
        return ""
    own = ownership(stage)["qk"]
    return f": {count} {unit}{'s' if count > 1 else ''} of {own.rows} {dict(q='query rows', k='keys')[own.dim]}"


def _lane_text(stage, prev, ln) -> str:
    """What a lane's warps are, for the caption: the computing role's units (when they changed), or
    another role's warps by duty (": a load warp, 2 dQ warps")."""
    if len(stage.roles) == 1 or ln.role == computing_role(stage):
        return _units_text(stage, prev)
    jobs = [d for w, d in sorted(duties(stage).items()) if w in ln.warps]
    parts = []
    for word, test in (("load", lambda d: d == "load"), ("dQ", lambda d: d.startswith("dQ"))):
        k = sum(1 for d in jobs if test(d))
        if k:
            parts.append(f"{'a' if k == 1 else k} {word} warp{'s' if k > 1 else ''}")
    return f": {', '.join(parts)}" if parts else ""


def _since(stage, prev, p, old) -> str:
    """What else changed since ``prev``: how the loads land, the barriers, and dQ's way."""
    out = ""
    comp = computing_role(stage)
    loader = next((o.role for o in stage.schedule if o.kind in LOADS), None)
    if loads_on_mbarriers(stage) and not loads_on_mbarriers(prev):
        out += "; the loads one thread's TMA, completing on mbarriers"
    elif loader is not None and loader != comp and handed_back(stage) and not handed_back(prev):
        out += f"; the loads the {loader}'s, handed over on full mbarriers and back on empty ones"
    labels = list(dict.fromkeys(x.label.split(": ", 1)[1] for x in p.syncs))
    if labels and labels != list(dict.fromkeys(x.label.split(": ", 1)[1] for x in old.syncs)):
        named = next((x.threads for x in p.syncs if x.threads), None)
        kind = "CTA barrier" if named is None else "named barrier"
        of = "" if named is None else f" of the {named} {comp} threads"
        out += f"; {len(labels)} {kind}{'s' if len(labels) != 1 else ''}{of} a query block ({'; '.join(labels)})"
    out += _dq_since(stage, prev)
    return out


def _dq_since(stage, prev) -> str:
    """How dQ's way changed since ``prev``, when it goes through shared memory now."""
    new, old = facts.dq_path(stage), facts.dq_path(prev)
    b = new.bulk
    if b is None:
        return ""
    group = facts.group_name(b.writers)
    if old.bulk is None:
        who = "one of its threads adds" if not b.own_warps else f"the {b.issuer_role}'s dQ warps add"
        return f"; dQ through a shared tile per {group}, which {who} with one bulk reduce-add (+dQ)"
    out = ""
    if b.own_warps and not old.bulk.own_warps:
        out += (f"; dQ's bulk reduce-adds by the {b.issuer_role}'s dQ warps (one per {group}, "
                f"{b.tiles_per_op} tiles each)")
    if new.ordered and not old.ordered:
        who = "the issuing thread" if not b.own_warps else "the dQ warp"
        out += f"; in the deterministic mode {who} waits for each query block's turn"
    return out


def signature(p: Protocol) -> str:
    return repr(([(ln.role, ln.label, ln.warps, ln.registers) for ln in p.lanes],
                 [(e.lane, e.track, e.kind, e.block, e.start, e.end) for e in p.events],
                 [(a.kind, b.kind, b.start) for a, b in p.handoffs], [(s.time, s.label) for s in p.syncs], p.notes))


def _ranges(ws) -> str:
    ws = sorted(ws)
    return f"{ws[0]}–{ws[-1]}" if len(ws) > 1 and ws[-1] - ws[0] == len(ws) - 1 else ", ".join(map(str, ws))


def roles_diagram(stage, stages) -> Diagram:
    p = protocol(stage)
    did = f"b{stage.id}-roles"
    prev = next((s for s in stages if s.number == stage.number - 1), None)
    lanes = p.lanes
    tracks = {ln.role: [t for t in TRACKS if any(e.lane == ln.role and e.track == t for e in p.events)]
              for ln in lanes}
    unit, count = units(stage)
    comp = computing_role(stage)
    # the warpgroups, each its rows (of the one role, or of the computing role among several)
    groups = unit == "warpgroup" and count > 1 and (len(lanes) == 1 or comp is not None)
    jobs = duties(stage)  # what each warp of another role does (a producer's load and dQ warps)
    y_warps = 48 + (24 if groups or jobs else 0)
    y_proto = y_warps + 32 + 44 + 12
    lane_h = {ln.role: len(tracks[ln.role]) * (TRACK_H + TRACK_GAP) + 10 for ln in lanes}
    top_of, y = {}, y_proto + 40
    for ln in lanes:
        top_of[ln.role] = y
        y += max(lane_h[ln.role], 62) + 8
    y_bottom = y
    title = f"Backward stage {stage.id} warp roles"
    named = next((x.threads for x in p.syncs if x.threads), None)
    where = ("the CTA barriers where every warp waits" if named is None else
             f"the named barriers where the {named} {comp} threads wait")
    desc = (f"The {stage.threads} threads of a backward stage {stage.id} CTA ({stage.warps} warps) by role ("
            + "; ".join(f"{ln.label}: warps {_ranges(ln.warps)}" for ln in lanes)
            + f"), then {BLOCKS} query blocks of its loop in logical time: which role loads which tile and runs "
            f"which of the five GEMMs, and {where} "
            f"({len(set(x.label for x in p.syncs))} a query block).")
    c = Canvas(did, W, 900, title, desc)
    c.heading(f"{stage.id} · backward", ": who does what, one query block after another")
    c.text(12, y_warps + 17, f"CTA · {stage.threads} threads", size=12, weight="600")
    colour = {ln.role: ln.colour for ln in lanes}
    role_of = {w: ln.role for ln in lanes for w in ln.warps}
    bw = (X1 - X0) / stage.warps
    for w in range(stage.warps):
        x = X0 + w * bw
        c.rect(x + 1, y_warps, bw - 2, 26, fill=colour[role_of[w]], stroke=colour[role_of[w]], opacity=0.28,
               rx=3, cls="hd-warp")
        c.text(x + bw / 2, y_warps + 17, f"warp {w}", size=12 if bw > 52 else 11, anchor="middle")
    if groups:
        own = ownership(stage)["qk"]
        word = {"q": "query rows", "k": "keys"}[own.dim]
        g0 = first_group(stage)
        for i in range(count):
            x0, x1 = X0 + 4 * (g0 + i) * bw + 2, X0 + 4 * (g0 + i + 1) * bw - 2
            c.path([(x0, y_warps - 3), (x0, y_warps - 8), (x1, y_warps - 8), (x1, y_warps - 3)], stroke="muted", sw=1.2)
            c.text((x0 + x1) / 2, y_warps - 13, f"warpgroup {g0 + i} · {own.rows} {word}: {i * own.rows}–"
                                                f"{(i + 1) * own.rows - 1}", size=12, anchor="middle")
    for ws, job in _job_runs(jobs):  # a label over each run of warps with the same duty
        c.text(X0 + (ws[0] + ws[-1] + 1) / 2 * bw, y_warps - 8, job, size=12, anchor="middle",
               fill="muted" if job == "idle" else "fg")
    yb = y_warps + 32
    for ln in lanes:
        xs = [X0 + w * bw for w in ln.warps]
        x0, x1 = min(xs) + 2, max(xs) + bw - 2
        c.path([(x0, yb), (x0, yb + 5), (x1, yb + 5), (x1, yb)], stroke=colour[ln.role], sw=1.5)
        regs = f"setmaxnreg {ln.registers}" if ln.registers else "compiler-chosen registers"
        label = f"{ln.label} · {ln.threads} threads · {regs}"
        if text_width(label, 12) > x1 - x0:
            label = f"{ln.label} · {ln.threads} threads"
        c.text((x0 + x1) / 2, yb + 20, label, size=12, anchor="middle")

    steps = p.steps
    step = (X1 - X0) / steps

    def tx(t):
        return X0 + t * step

    c.text(12, y_proto + 6, f"{BLOCKS} query blocks", size=12, weight="600")
    c.text(X1, y_proto + 6, "logical steps, in order (the schedule below is to scale)", size=12, anchor="end",
           fill="muted")
    box_at = {}
    for ln in lanes:
        top, h = top_of[ln.role], max(lane_h[ln.role], 62)
        c.rect(X0 - 4, top, X1 - X0 + 8, h, fill="panel", stroke="grid", rx=4)
        c.rect(8, top, 6, h, fill=ln.colour, stroke=None, rx=2)
        c.text(20, top + 17, ln.label, size=13, weight="700")
        c.text(20, top + 34, f"warps {_ranges(ln.warps)}", size=12, fill="muted")
        c.text(20, top + 50, f"{ln.threads} threads", size=12, fill="muted")
        for ti, tr in enumerate(tracks[ln.role]):
            ty = top + 5 + ti * (TRACK_H + TRACK_GAP)
            for e in [e for e in p.events if e.lane == ln.role and e.track == tr]:
                box_at[id(e)] = (tx(e.start) + 1, ty, tx(e.end) - tx(e.start) - 2, TRACK_H)
    # Query blocks: a band label over each block's steps.
    # (a prefetch belongs to its block but runs in the one before; a reduce-add runs on into the next)
    ahead = {o.kind for o in stage.schedule if o.kind in LOADS and engines.is_async(o.engine)} | {"reduce_dq"}
    for b in range(BLOCKS):
        mine = [e for e in p.events if e.block == b and e.kind not in ahead] or [e for e in p.events if e.block == b]
        x0, x1 = tx(min(e.start for e in mine)), tx(max(e.end for e in mine))
        c.path([(x0 + 1, y_proto + 36), (x0 + 1, y_proto + 31), (x1 - 1, y_proto + 31), (x1 - 1, y_proto + 36)],
               stroke="muted", sw=1)
        c.text((x0 + x1) / 2, y_proto + 27, f"query block {b}", size=12, anchor="middle", fill="muted")
    for src, dst in p.handoffs:
        a, b = box_at[id(src)], box_at[id(dst)]
        if b[1] < a[1]:  # to a lane above: from the top of the source to the bottom of the target
            c.line(a[0] + a[2] / 2, a[1], b[0] + 5, b[1] + b[3] + 2, stroke="fg", sw=1.2, arrow=True)
        else:
            c.line(a[0] + a[2] / 2, a[1] + a[3], b[0] + 5, b[1] - 2, stroke="fg", sw=1.2, arrow=True)
    for e in p.events:
        x, ty, w, th = box_at[id(e)]
        fill = BACKWARD_COLOUR.get(e.kind, "warp")
        c.rect(x, ty, w, th, fill=fill, stroke="bg", opacity=0.95, rx=3, sw=0.8)
        for label in (f"{e.label} {e.block}" if e.block >= 0 else e.label, e.label, SHORT[e.kind]):
            if text_width(label, 12, bold=True) <= w - 6:
                c.text(x + w / 2, ty + th / 2 + 4.5, label, size=12, anchor="middle", fill="bg", weight="600")
                break
    labelled = []
    for s in p.syncs:
        x = tx(s.time) - 0.5
        if s.threads:  # a named barrier: across its role's lane only
            top = top_of[comp]
            c.line(x, top - 2, x, top + max(lane_h[comp], 62) + 2, stroke="bar", sw=1.6, dash="6 3")
        else:
            c.line(x, y_proto + 38, x, y_bottom - 6, stroke="bar", sw=1.6, dash="6 3")
        if s.label not in labelled:
            labelled.append(s.label)
    # Legend: the colours, then the barriers and hand-offs.
    y = y_bottom + 22
    kinds = []
    for e in p.events:
        if e.kind not in kinds:
            kinds.append(e.kind)
    x = 12
    from ..timeline import backward_legend

    for k, label in backward_legend(stage):
        if k not in kinds:
            continue
        wid = 17 + text_width(label, 12) + 16
        if x + wid > W - 12:
            x, y = 12, y + 20
        c.rect(x, y - 11, 12, 12, fill=BACKWARD_COLOUR[k], stroke=None, rx=2)
        c.text(x + 17, y, label, size=12, fill="muted")
        x += wid
    y += 26
    if labelled:
        c.line(12, y - 4, 42, y - 4, stroke="bar", sw=1.6, dash="6 3")
        others = _and(ln.label for ln in lanes if ln.role != comp)
        c.text(50, y, "CTA barrier (__syncthreads): every warp waits here; in order within a block:" if named is None
               else f"named barrier (bar.sync of the {named} {comp} threads): the {comp} warps wait here, the "
                    f"{others} never; in order within a block:", size=12, fill="muted")
        for label in dict.fromkeys(s.label.split(": ", 1)[1] for s in p.syncs):
            y += 18
            c.text(50, y, f"· {label}", size=12)
        y += 24
    if p.handoffs:
        c.line(12, y - 4, 42, y - 4, stroke="fg", sw=1.2, arrow=True)
        c.text(50, y, "hand-off: a role waits for another's op" + (
            ", on a full mbarrier; the buffer comes back on an empty one" if handed_back(stage) else ""),
               size=12, fill="muted")
        y += 24
    for note in p.notes:
        for line in wrap(note + ".", W - 24, 12):
            c.text(12, y, line, size=12)
            y += 18
        y += 2
    c.height = height = int(y + 6)
    if prev is None:
        cap = (f"{lanes[0].label.capitalize() if len(lanes) == 1 else 'The roles'} of backward stage {stage.id} over "
               f"{BLOCKS} query blocks of the loop: K and V once, then per block the loads, the five GEMMs and the "
               f"softmax step between them{', and the CTA barriers where the warps hand tiles to each other' if p.syncs else ''}.")
    else:
        old = protocol(prev)
        cap = (f"The roles and their hand-offs are those of backward stage {prev.id}." if signature(old) == signature(p)
               else f"Since backward stage {prev.id}: roles " + ", ".join(f"{ln.label} ({len(ln.warps)} warps"
                                                                         + _lane_text(stage, prev, ln) + ")"
                                                                         for ln in lanes) + _since(stage, prev, p, old)
               + ".")
    return Diagram(did, title, "roles", stage.number, c.tostring(), cap, W, height, signature(p))
