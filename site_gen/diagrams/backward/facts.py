"""What the backward's pictures need to know about a stage, derived from its stage.toml (never
per-stage cases): where each operand of the five GEMMs lives, how it reaches the tensor cores, and
how dQ is accumulated.

The five GEMMs are the algorithm's, in one of two forms (``[diagram] transposed_scores``):

    S  = Q Kᵀ      dP  = dO Vᵀ      dV += Pᵀ dO      dK += dSᵀ Q      dQ += dS K   (FlashAttention-2's)
    Sᵀ = K Qᵀ      dPᵀ = V dOᵀ      dV += Pᵀ dO      dK += dSᵀ Q      dQ += dS K   (FlashAttention-3's)

Each GEMM is (M, N, K) over q (the step's query rows), k (the CTA's keys) and d (the head dim); an
operand is written transposed where the GEMM wants it the other way round from the tensor's own
(Q, dO: q × d; K, V: k × d; S, P, dP, dS: q × k), and read K-major or MN-major by whether its stored
rows run along the GEMM's M (or N) or its K. P and dS are held as the scores are computed (keys by
queries when transposed), in registers and in their buffers alike.

Where their operands live comes from the spec: a shared-memory buffer named after a tensor ("Q",
"dO", "P", "dS", "sK", "dQ accum", ...) puts it in shared memory; P and dS without a buffer stay in
the registers the softmax made them in, and with one, ``[diagram] p_operand = "registers"`` keeps
them there for every GEMM that wants them as they are held (transposed scores: dV's and dK's A,
while dQ's reads the dS buffer); Q, K, V and dO without a buffer are read from global memory.
The mechanisms are the spec's: ``[movement]`` (kv_fragments, o_store), the schedule's engines and the
roles' tasks (e.g. "red.global.add.f32"), folded by ``diagrams.engines.family``.

dQ's way (dq_path): reductions from registers, or — a task naming cp.reduce.async.bulk and a "dQ
accum" buffer — through shared memory: the dQ GEMM's threads store their share into the buffer's
tiles (one per bulk reduce-add of a step; its copies beyond that are tiles used in turn), and the
role whose task issues the reduce-adds adds each with one operation (a thread of the writers, or
the warps that task names: a producer's dQ warps). The deterministic mode is ``[diagram]
dq_deterministic``: a second pass, or the same kernel's additions in key-block order (the
instructions of its turns from the tasks that say "deterministic"; the key block from a ticket when
a [[smem]] "key block" slot holds it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import engines
from .. import facts as forward_facts

ELEM, ACC = 2, 4  # bf16 and fp32 bytes
NAMES = ("Q", "K", "V", "dO", "P", "dS", "dQ", "dK", "dV", "KV", "LSE")
_WORDS = {n.lower(): n for n in NAMES}
_SKIP = {"smem", "tile", "tiles", "buf", "buffer", "ring", "staging", "accum", "acc", "accumulator", "f32", "fp32"}
COLOUR = {"Q": "q", "K": "k", "V": "v", "KV": "k", "dO": "o", "S": "s", "P": "p", "dP": "p", "dS": "s",
          "dQ": "bar", "dK": "consumer2", "dV": "store", "LSE": "accent"}
LEVELS = ("global", "smem", "regs")
LEVEL_NAME = {"global": "global memory", "smem": "shared memory", "regs": "registers"}


# The tensors' own orientation (rows, columns) and how they are stored (rows, contiguous columns).
NATURAL = {"Q": ("q", "d"), "dO": ("q", "d"), "K": ("k", "d"), "V": ("k", "d"), "S": ("q", "k"), "P": ("q", "k"),
           "dP": ("q", "k"), "dS": ("q", "k"), "dQ": ("q", "d"), "dK": ("k", "d"), "dV": ("k", "d")}
DIM_WORD = {"q": "queries", "k": "keys", "d": "head-dim columns"}


def mark(name: str, dims: tuple[str, str]) -> str:
    """The tensor as a GEMM sees it: "K", or "Kᵀ" when it wants it the other way round."""
    return name if NATURAL[name] == dims else name + "ᵀ"


@dataclass(frozen=True)
class Gemm:
    kind: str  # the schedule kind
    a: str
    b: str
    out: str
    m: str  # the GEMM's M, N and K: "q" (the step's query rows), "k" (the CTA's keys), "d" (head dim)
    n: str
    k: str
    accumulates: bool  # += over the loop (dV, dK) or over the key blocks (dQ)

    @property
    def a_shown(self) -> str:
        return mark(self.a, (self.m, self.k))

    @property
    def b_shown(self) -> str:
        return mark(self.b, (self.k, self.n))

    @property
    def out_shown(self) -> str:
        return mark(self.out, (self.m, self.n))

    @property
    def formula(self) -> str:
        """As the page writes it: "S = Q Kᵀ", "Sᵀ = K Qᵀ", "dV += Pᵀ dO"."""
        return f"{self.out_shown} {'+=' if self.accumulates else '='} {self.a_shown} {self.b_shown}"


def transposed(stage) -> bool:
    """Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (M = keys) rather than S = Q Kᵀ and dP = dO Vᵀ."""
    return bool(stage.diagram.transposed_scores)


def gemms(stage) -> tuple[Gemm, ...]:
    """The five GEMMs in the algorithm's order, in the stage's form."""
    if transposed(stage):
        scores = (Gemm("qk", "K", "Q", "S", "k", "q", "d", False), Gemm("dp", "V", "dO", "dP", "k", "q", "d", False))
    else:
        scores = (Gemm("qk", "Q", "K", "S", "q", "k", "d", False), Gemm("dp", "dO", "V", "dP", "q", "k", "d", False))
    return scores + (Gemm("dv", "P", "dO", "dV", "k", "d", "q", True), Gemm("dk", "dS", "Q", "dK", "k", "d", "q", True),
                     Gemm("dq", "dS", "K", "dQ", "q", "d", "k", True))


def held(stage) -> tuple[str, str]:
    """How S, P, dP and dS are held (rows, columns): as the score GEMMs' accumulators are."""
    return ("k", "q") if transposed(stage) else ("q", "k")


def held_name(stage, name: str) -> str:
    """"P" or "Pᵀ", "dS" or "dSᵀ": a score tensor as the stage holds it."""
    return mark(name, held(stage))


def stored(stage, name: str) -> tuple[str, str]:
    """(rows, contiguous columns) of a tensor in memory: Q, dO, K, V as the caller gives them, P and dS
    as they are held."""
    return held(stage) if name in ("S", "P", "dP", "dS") else NATURAL[name]


def k_major(stage, g: Gemm, which: str) -> bool:
    """Whether operand ``which`` of ``g`` is read K-major from memory: its stored rows are contiguous
    along the GEMM's K (else MN-major: ldmatrix .trans, wgmma's transpose bit)."""
    return stored(stage, g.a if which == "a" else g.b)[1] == g.k


def from_registers(stage, g: Gemm, which: str) -> bool:
    """P or dS as an A operand straight from the registers that made them: always without a buffer;
    with one, when p_operand says registers and they are held as the GEMM wants them (M rows)."""
    name = g.a if which == "a" else g.b
    if name not in ("P", "dS"):
        return False
    if not smem_of(stage, name):
        return True
    return which == "a" and stage.diagram.p_operand == "registers" and held(stage) == (g.m, g.k)


def buffer_tensor(buf) -> str | None:
    """Which tensor a shared-memory buffer of a backward stage holds (None: barriers, scratch)."""
    if buf.layout == "mbarrier":
        return None
    for w in (w for w in re.split(r"[^a-z0-9]+", buf.name.lower()) if w and w not in _SKIP):
        if w in _WORDS:
            return _WORDS[w]
        if w.startswith("s") and w[1:] in _WORDS:  # sK, sdO
            return _WORDS[w[1:]]
    return None


def smem_of(stage, tensor: str) -> list:
    return [b for b in stage.smem if buffer_tensor(b) == tensor
            or (buffer_tensor(b) == "KV" and tensor in ("K", "V"))]


def text_of(stage) -> str:
    """The spec's free words: engines, role tasks, the one change and the movement table."""
    words = [op.engine for op in stage.schedule] + [t for r in stage.roles for t in r.tasks] + [stage.change]
    mv = stage.movement
    words += [x for x in (mv.q_load, mv.kv_load, mv.kv_fragments, *(mv.o_store or ())) if x]
    return " ".join(words).lower()


def mma(stage) -> str:
    fams = {engines.family(op.engine) for op in stage.schedule if op.unit == "tensor"}
    return "wgmma" if "wgmma" in fams else "mma.sync"


def threads_of_gemm(stage, kind: str) -> int:
    """The threads that run a GEMM (its roles' warps)."""
    roles = {op.role for op in stage.schedule if op.kind == kind} or {r.name for r in stage.roles}
    return 32 * sum(len(r.warps) for r in stage.roles if r.name in roles)


@dataclass(frozen=True)
class Place:
    """One operand or result of a GEMM: where it lives and how it gets there."""

    tensor: str  # "Q", "Pᵀ", ...
    base: str  # the tensor without its transpose mark
    level: str  # global | smem | regs
    how: str  # the mechanism (ldmatrix.trans, wgmma desc., red.global.add.f32, ...)
    shape: str  # what a box says of its size or lifetime


def _fragments(stage) -> str:
    if stage.movement.kv_fragments:
        return engines.family(stage.movement.kv_fragments)
    return "wgmma-desc" if mma(stage) == "wgmma" else "ld.shared"


def operand(stage, g: Gemm, which: str) -> Place:
    """Where operand ``which`` ("a" or "b") of GEMM ``g`` lives and how the tensor cores read it."""
    name = g.a if which == "a" else g.b
    shown = g.a_shown if which == "a" else g.b_shown
    trans = not k_major(stage, g, which)
    bufs = smem_of(stage, name)
    frag = _fragments(stage)
    if from_registers(stage, g, which):  # made by the softmax in registers, and used there
        how = ("wgmma RS, bf16" if mma(stage) == "wgmma" else "A in registers") if which == "a" else "in registers"
        return Place(shown, name, "regs", how, "bf16 fragments")
    if bufs:
        b = bufs[0]
        dims = "×".join(str(s) for s in b.shape)
        if mma(stage) == "wgmma":
            how = "wgmma desc., " + ("MN-major" if trans else "K-major")
        elif frag == "ldmatrix":
            how = "ldmatrix.trans" if trans else "ldmatrix"
        else:
            how = engines.LABEL.get(frag, frag)
        return Place(shown, name, "smem", how, f"{dims} {b.dtype}")
    load = stage.movement.q_load if name in ("Q", "dO") else stage.movement.kv_load
    return Place(shown, name, "global", engines.family(load or "ld.global"), "read by every warp")


def result(stage, g: Gemm) -> Place:
    """Where the GEMM's result goes: S and dP stay in registers for the step; dK and dV accumulate in
    registers over the whole loop; dQ goes where the dQ path says (dq_path)."""
    threads = threads_of_gemm(stage, g.kind) or stage.threads
    m, n, d = stage.block_m, stage.block_n, stage.head_dim
    if g.out in ("S", "dP"):
        return Place(g.out_shown, g.out, "regs", "per query block", f"{m * n // threads} fp32 / thread")
    if g.out in ("dK", "dV"):
        store = forward_facts.o_path(stage)
        return Place(g.out, g.out, "regs", "kept: whole kernel", f"{n * d // threads} fp32 / thread" +
                     ("" if len(store) == 1 else ", staged"))
    path = dq_path(stage)
    if path.bulk:  # the GEMM's accumulator; dq_route says where it goes from there
        return Place("dQ", "dQ", "regs", f"per {group_name(path.bulk.writers)}", f"{path.per_thread} fp32 / thread")
    if path.atomic:
        return Place("dQ", "dQ", "smem" if path.staged else "global", path.mechanism, "fp32 sum")
    return Place("dQ", "dQ", "regs", "kept: whole pass", f"{m * d // threads} fp32 / thread")


@dataclass(frozen=True)
class Bulk:
    """dQ added from shared memory by bulk reduce-adds (cp.reduce.async.bulk ... .add.f32, carried
    out by the TMA unit): each writer group stores its share into a shared tile as its registers
    hold it, and one thread adds the whole tile with one operation."""

    ptx: str  # "cp.reduce.async.bulk .add.f32"
    tile: str  # the [[smem]] buffer's name ("dQ accum")
    tile_rows: int
    tile_cols: int
    tile_bytes: int
    ops: int  # bulk reduce-adds per CTA and step (query block): block_m × head_dim / the tile's floats
    tiles_per_op: int  # tiles each writer group fills in turn (the buffer's copies / ops)
    writers: int  # threads that fill one tile (the dQ GEMM's threads / ops: a warpgroup's 128)
    store: str  # how they store it ("st.shared.v4"), from the tasks
    stores: int  # stores per thread and step
    issuer_role: str  # the role whose task issues the reduce-adds
    issuer_warps: tuple[int, ...]  # its warps that issue them, when the task names them (a dQ warp each)
    block_order: bool  # a bulk (not .tensor) operation adds contiguous bytes: the accumulator is in the tiles' order

    @property
    def own_warps(self) -> bool:
        """Issued by warps of their own (a producer's dQ warps), not by a thread of each writer group."""
        return bool(self.issuer_warps)

    @property
    def issuer(self) -> str:
        """Who issues one tile's reduce-add: "one thread of the warpgroup", "dQ warp 1 (producer)"."""
        return f"a dQ warp of the {self.issuer_role}" if self.own_warps else f"one thread of the {group_name(self.writers)}"

    @property
    def part(self) -> str:
        """What one tile of the step's dQ is: "half" for two."""
        return "half" if self.ops == 2 else f"{self.tile_cols}-column part"


def group_name(threads: int) -> str:
    """What the threads that fill one dQ tile are called: a "warpgroup" when 128."""
    return "warpgroup" if threads == 128 else f"{threads} threads"


@dataclass(frozen=True)
class Ordered:
    """The deterministic mode as ordered additions ([diagram] dq_deterministic = "ordered"): a turn
    counter per query block and dQ operation of the step; key block n's issuer waits until it reads
    n, adds, waits for the addition to complete and counts on: up from key block 0, or (a count of
    -1 in the tasks: red.release.gpu.add -1) down from the query block's last key block."""

    counters: int  # per query block: one per dQ operation of a step (bulk.ops; 1 without a bulk path)
    wait: str | None  # the instructions the spec's tasks name for each: the read of the turn (ld.acquire.gpu),
    done: str | None  # the completion wait (cp.async.bulk.wait_group 0),
    count: str | None  # and the count (red.release.gpu.add)
    ticket: bool  # the CTA's key block is taken from a ticket in this mode (a [[smem]] "key block" slot)
    down: bool = False  # the turns run from the last key block down to key block 0 (the count adds -1)


@dataclass(frozen=True)
class DqPath:
    """How the key blocks' shares of dQ are summed."""

    atomic: bool  # into an fp32 accumulator in global memory, in arrival order
    mechanism: str  # red.global.add.f32, red.global.add.v4.f32, atomicAdd, bulk reduce-add, or "registers"
    staged: bool  # through a dQ buffer in shared memory first
    per_cta: int  # floats added per CTA per query block (block_m × head_dim)
    per_thread: int  # floats added (bulk: stored into a tile) per thread per query block
    deterministic: str | None  # how the deterministic mode sums instead ("second pass", "ordered"), None: none
    vector: int = 1  # floats per instruction (red.global.add.v4.f32: 4)
    bulk: Bulk | None = None  # the share through shared memory, one bulk reduce-add per tile
    ordered: Ordered | None = None  # the deterministic mode's turns (deterministic == "ordered")

    @property
    def instructions(self) -> int:
        """Reduction instructions per thread per query block (bulk: per CTA)."""
        return self.bulk.ops if self.bulk else self.per_thread // self.vector

    @property
    def adds_label(self) -> str:
        """"64 per thread", "64 floats per thread in 16 instructions" for a vector reduction, or "one per
        warpgroup and step (16 KiB), 2 per CTA" for bulk reduce-adds."""
        if self.bulk:
            b = self.bulk
            return f"one per {group_name(b.writers)} and step ({b.tile_bytes // 1024} KiB), {b.ops} per CTA"
        if self.vector == 1:
            return f"{self.per_thread} per thread"
        return f"{self.per_thread} floats per thread in {self.instructions} instructions"


BULK_RE = re.compile(r"cp\.reduce\.async\.bulk(\.tensor)?")


def _warps_named(task: str) -> tuple[int, ...]:
    """The warps a task names at its start ("warps 1 and 2, ...": (1, 2)); () if none."""
    m = re.match(r"\s*warps?\s+(\d+(?:\s*(?:,|and)\s*\d+)*)", task)
    return tuple(int(x) for x in re.findall(r"\d+", m.group(1))) if m else ()


def _bulk(stage, text: str) -> Bulk | None:
    m = BULK_RE.search(text)
    bufs = smem_of(stage, "dQ")
    if not m or not bufs:
        return None
    buf = bufs[0]
    rows, cols = (buf.shape + (1,))[:2] if len(buf.shape) == 1 else buf.shape[-2:]
    elems = rows * cols
    ops = max(1, stage.block_m * stage.head_dim // elems)
    threads = threads_of_gemm(stage, "dq") or stage.threads
    writers = max(1, threads // ops)
    per_thread = elems // writers
    store = re.search(r"st\.shared(?:\.v(\d))?(?:\.[a-z0-9]+)*", " ".join(
        t for r in stage.roles for t in r.tasks if "dq" in t.lower() and "st.shared" in t))
    width = int(store.group(1)) if store and store.group(1) else 1
    issuing = [(r, t) for r in stage.roles for t in r.tasks if BULK_RE.search(t)]
    role, task = issuing[0] if issuing else (stage.roles[0], "")
    gemm_roles = {op.role for op in stage.schedule if op.kind == "dq"}
    warps = _warps_named(task) if role.name not in gemm_roles else ()
    ptx = m.group(0) + (" .add.f32" if ".add.f32" in text else "")
    return Bulk(ptx, buf.name, rows, cols, buf.bytes // buf.buffers, ops, max(1, buf.buffers // ops), writers,
                re.sub(r"\.f32$", "", store.group(0)) if store else "st.shared", max(1, per_thread // width),
                role.name, warps, m.group(1) is None)


def _ordered(stage, bulk: Bulk | None) -> Ordered:
    tasks = [t for r in stage.roles for t in r.tasks if "deterministic" in t.lower()]
    text = " ".join(tasks)

    def find(pattern):
        m = re.search(pattern, text)
        return m.group(0) if m else None

    step = re.search(r"red\.release\.[a-z]+\.add\s+(-?\d+)", text)
    return Ordered(bulk.ops if bulk else 1, find(r"ld\.acquire\.[a-z]+"), find(r"cp\.async\.bulk\.wait_group \d+"),
                   find(r"red\.release\.[a-z]+(?:\.add)?"),
                   any(b.name.lower() == "key block" for b in stage.smem), bool(step and int(step.group(1)) < 0))


def dq_path(stage) -> DqPath:
    """From the spec: the mechanism its engines, tasks and movement name (a bulk reduce-add, a vector
    or scalar reduction, atomicAdd, else registers), the dQ buffer ([[smem]] "dQ accum") and, for
    the deterministic mode, [diagram] dq_deterministic (left out: "second pass")."""
    text = text_of(stage)
    m, d = stage.block_m, stage.head_dim
    threads = threads_of_gemm(stage, "dq") or stage.threads
    red = re.search(r"red\.global\.add(?:\.v(\d))?\.f32", text)
    bulk = _bulk(stage, text)
    if bulk:
        mech = "bulk reduce-add"
    elif "cp.reduce.async.bulk" in text or "reduce-add" in text:
        mech = "TMA reduce-add"
    elif red:
        mech = red.group(0)
    elif "atomic" in text:
        mech = "atomicAdd (fp32)"
    else:
        mech = "registers"
    how = None
    if stage.deterministic:
        how = stage.diagram.dq_deterministic or "second pass"
    vector = int(red.group(1)) if red and red.group(1) and mech == red.group(0) else 1
    per_thread = bulk.tile_rows * bulk.tile_cols // bulk.writers if bulk else m * d // threads
    return DqPath(mech != "registers", mech, bool(smem_of(stage, "dQ")), m * d, per_thread, how, vector, bulk,
                  _ordered(stage, bulk) if how == "ordered" else None)


def dq_route(stage) -> list[Place]:
    """Where dQ goes after its GEMM's accumulator, when it goes through shared memory: the shared
    tile(s) its writers store into, then the accumulator in global memory that the bulk reduce-adds
    add into ([] otherwise: result() says where it goes)."""
    b = dq_path(stage).bulk
    if b is None:
        return []
    size = f"{b.tile_bytes // 1024} KiB" if b.tiles_per_op == 1 else f"{b.tiles_per_op} × {b.tile_bytes // 1024} KiB"
    tiles = "dQ tile" if b.tiles_per_op == 1 else "dQ tiles"
    return [Place(tiles, "dQ", "smem", f"{b.store}, {b.stores} / thread", size),
            Place("dQ", "dQ", "global", "bulk reduce-add", "fp32 sum" + (", block order" if b.block_order else ""))]


def stats_load(stage) -> str | None:
    """How the row statistics (lse₂, D) reach a shared buffer of theirs ([[smem]] "LSE, D"), from the
    task that loads them; None when the softmax reads them from global memory."""
    if not smem_of(stage, "LSE"):
        return None
    for t in (t for r in stage.roles for t in r.tasks):
        m = re.search(r"lse\S*\s+and\s+D\b[^()]*\((cp\.async\.bulk|cp\.async|ld\.global|tma)", t, re.I)
        if m:
            return m.group(1)
    return "ld.global"


def gemm_flops(stage) -> int:
    """FLOP of each of the five GEMMs for one query block against the CTA's keys."""
    return 2 * stage.block_m * stage.block_n * stage.head_dim


def loads(stage) -> list[tuple[str, str, str, str]]:
    """(tensors, level, mechanism, how often) of the tiles that come into the CTA: Q and dO every
    query block, K and V once, and the row statistics ("LSE, D") when a buffer of theirs holds them."""
    out = []
    for names, mech, when in ((("Q", "dO"), stage.movement.q_load, "every query block"),
                              (("K", "V"), stage.movement.kv_load, "once per CTA")):
        level = "smem" if all(smem_of(stage, x) for x in names) else "regs"
        fam = engines.family(mech or next((op.engine for op in stage.schedule if op.kind in
                                           ("load_q", "load_do", "load_k", "load_v", "load_kv")), "ld.global"))
        label = "ld.global, st.shared" if fam == "ld.global" and level == "smem" else engines.LABEL.get(fam, fam)
        out.append((", ".join(names), level, label, when))
    stats = stats_load(stage)
    if stats:
        out.append(("LSE, D", "smem", stats, "every query block"))
    return out
