"""Memory movement: every operand's path through the memory levels, one row per operand.

Columns are the levels, each with its scope (HBM and L2: the device; shared memory: one CTA;
registers: one thread; tensor cores: one SM); rows are the operands (Q, K, V, S and P, O, and the
tile ids and log-sum-exp of the stages that have them). Every operand is drawn the same way: a box
where it lives, an arrow with the mechanism that moves it and how much per KV iteration; reads
from global memory pass the L2 box, Q's too. Sizes in the register column are per thread. Items
that differ from the previous stage are highlighted and named in the caption; the plan is pure
data (plan()), so tests check every number against the spec and the kernel's constants.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import engines, facts
from .diagram import Diagram
from .svg import Canvas, fmt_bytes, text_width

W = 860
LEVELS = ("hbm", "l2", "smem", "regs", "tensor")
LABEL_W = 68
BOX_W, GAP = 100, 70
ROW_H = 64
SMEM_LIMIT = 227 * 1024
COLOUR = {"Q": "q", "K": "k", "S": "s", "P": "p", "V": "v", "O": "o", "LSE": "o", "ID": "accent"}
ROW_NAME = {"ID": ("ids", "tile ids"), "Q": ("Q", "queries"), "K": ("K", "keys"), "S": ("S", "scores"),
            "P": ("P", "softmax"), "V": ("V", "values"), "O": ("O", "output"), "LSE": ("LSE", "per row")}


@dataclass(frozen=True)
class Box:
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Arrow:
    src: str  # level
    dst: str
    lines: tuple[str, ...]  # mechanism, then how much
    below: bool = False  # routed under the box it passes (P from shared memory to the tensor cores)


@dataclass
class Row:
    boxes: dict[str, Box] = field(default_factory=dict)
    arrows: list[Arrow] = field(default_factory=list)


def per_thread(stage) -> dict[str, int]:
    """Elements of S (and P) and of O that one consumer thread holds in registers."""
    threads = 32 * facts.consumer_warps(stage)
    return {"S": stage.block_m * stage.block_n // threads, "O": stage.block_m * stage.head_dim // threads}


def _mech(fam: str, stage) -> str:
    if fam == "wgmma-desc":
        return "wgmma desc."
    if fam == "tma" and facts.cluster(stage) > 1:
        return f"TMA ×{facts.cluster(stage)} multicast"
    return {"ld.global": "ld.global", "cp.async": "cp.async", "tma": "TMA", "ldmatrix": "ldmatrix",
            "ld.shared": "ld.shared"}.get(fam, engines.LABEL.get(fam, fam))


def _tma_box(stage) -> str:
    return "4-D box" if stage.strided else "2-D box"


def _buf(bufs, name: str) -> Box:
    b = bufs[0]
    shape = "×".join(str(s) for s in b.shape)
    layout = {"row-major": "row-major", "xor-swizzle": "XOR swizzle", "tma-swizzle-128b": "128B swizzle"}.get(
        b.layout, b.layout)
    count = f"{b.buffers} × " if b.buffers > 1 else ""
    return Box((f"{name} {shape}", f"{count}{fmt_bytes(b.bytes // b.buffers)}", layout))


def plan(stage) -> dict[str, Row]:
    """Rows of boxes and arrows; pure data, so tests can check the numbers."""
    t = facts.Tiles.of(stage)
    m, n, d = stage.block_m, stage.block_n, stage.head_dim
    mma = facts.mma_family(stage)
    frag = facts.fragment_family(stage)
    warps = facts.consumer_warps(stage)
    wgs = max(1, warps // 4)
    pt = per_thread(stage)
    rows: dict[str, Row] = {}
    layout = "BHSD or BSHD" if stage.strided else "BHSD"

    # Q: read once per output tile.
    q = rows["Q"] = Row()
    q.boxes["hbm"] = Box((f"Q {m}×{d}", fmt_bytes(t.q), layout))
    q.boxes["l2"] = Box(("miss", "read once", "per output tile"))
    if not facts.smem_of(stage, "Q") and not stage.diagram.q_in_registers:
        q.boxes["l2"] = Box(("miss, then hits:", "re-read", "every k-step"))
    q.arrows.append(Arrow("hbm", "l2", ()))
    qbuf = facts.smem_of(stage, "Q")
    qfam = facts.load_family(stage, "Q")
    reload = not stage.diagram.q_in_registers
    if qbuf:
        mech = _mech(qfam, stage) + (f" {_tma_box(stage)}" if qfam == "tma" else "")
        if qfam == "ld.global":
            mech = "ld, st.shared"
        q.arrows.append(Arrow("l2", "smem", (mech, "once")))
        q.boxes["smem"] = _buf(qbuf, "Q")
        if mma == "wgmma":
            q.arrows.append(Arrow("smem", "tensor", (_mech("wgmma-desc", stage), "A operand")))
        else:
            q.arrows.append(Arrow("smem", "regs", (_mech(frag, stage), "per k-step" if reload else "once")))
            q.boxes["regs"] = Box(("A fragments", "per k-step" if reload else "kept"))
            q.arrows.append(Arrow("regs", "tensor", ("A",)))
    else:
        q.arrows.append(Arrow("l2", "regs", ("ld.global", "per k-step" if reload else "once")))
        q.boxes["regs"] = Box(("A fragments", "per k-step" if reload else "kept"))
        q.arrows.append(Arrow("regs", "tensor", ("A",)))

    # K and V: one tile per KV iteration, re-read by every query tile of the head: L2 hits.
    for x, tile in (("K", t.k), ("V", t.v)):
        r = rows[x] = Row()
        third = "to the diagonal" if stage.causal else layout
        if stage.gqa:
            third = "Hkv ≤ Hq heads"
        r.boxes["hbm"] = Box((f"{x} {n}×{d}", fmt_bytes(tile), third))
        r.boxes["l2"] = Box(("hit", "re-read by every", "query tile" if not stage.gqa else "tile of the group"))
        r.arrows.append(Arrow("hbm", "l2", ()))
        bufs = facts.smem_of(stage, x)
        fam = facts.load_family(stage, x)
        per_iter = f"{fmt_bytes(facts.l2_bytes_per_iter(stage, x))} / iter"
        if facts.loaders(stage, x) > 1:
            per_iter = f"{facts.loaders(stage, x)} × {fmt_bytes(tile)}"
        if bufs:
            mech = _mech(fam, stage)
            if fam == "tma":
                mech += f" {_tma_box(stage)}"
            if fam == "ld.global":
                mech = "ld, st.shared"
            r.arrows.append(Arrow("l2", "smem", (mech, per_iter)))
            r.boxes["smem"] = _buf(bufs, x)
            if mma == "wgmma":
                how = "B, MN-major" if x == "V" else "B, K-major"
                r.arrows.append(Arrow("smem", "tensor", (_mech("wgmma-desc", stage), f"{wgs} WG read it · {how}")))
            else:
                mech = _mech(frag, stage) + (".trans" if x == "V" and frag == "ldmatrix" else "")
                r.arrows.append(Arrow("smem", "regs", (mech, f"{warps} warps read")))
                r.boxes["regs"] = Box(("B fragments", "per k-step"))
                r.arrows.append(Arrow("regs", "tensor", ("B",)))
        else:
            r.arrows.append(Arrow("l2", "regs", (_mech(fam, stage) + " by every warp", per_iter)))
            r.boxes["regs"] = Box(("B fragments", "per k-step"))
            r.arrows.append(Arrow("regs", "tensor", ("B",)))

    # S from the first GEMM into registers; the softmax turns it into P there; P feeds the second.
    sr = rows["S"] = Row()
    gemm = f"wgmma m64n{n}k16" if mma == "wgmma" else "mma m16n8k16"
    sr.boxes["tensor"] = Box(("S = QKᵀ", *gemm.split(" ")))
    sr.boxes["regs"] = Box((f"S {pt['S']} × fp32", f"{pt['S'] * 4} B / thread"))
    sr.arrows.append(Arrow("tensor", "regs", ("accumulate", "")))
    if stage.causal or stage.tails:
        sr.boxes["regs"] = Box(sr.boxes["regs"].lines + ("masked tiles",))
    pr = rows["P"] = Row()
    pr.boxes["regs"] = Box((f"P {pt['S']} × bf16", f"{pt['S'] * 2} B / thread"))
    if facts.p_in_smem(stage):
        pbuf = facts.smem_of(stage, "P")
        pfam = stage.diagram.p_store
        pr.arrows.append(Arrow("regs", "smem", (engines.LABEL.get(pfam, pfam), f"{fmt_bytes(t.p)} / iter")))
        pr.boxes["smem"] = _buf(pbuf, "P") if pbuf else Box(("P staging",))
        pr.arrows.append(Arrow("smem", "tensor", ("wgmma SS: A from shared memory",), below=True))
    else:
        how = ("wgmma RS", "A in registers") if mma == "wgmma" else ("A",)
        pr.arrows.append(Arrow("regs", "tensor", how))

    # O: accumulated (and rescaled) in registers over the loop, written once per output tile.
    o = rows["O"] = Row()
    pv_n = stage.diagram.pv_n or d
    o.boxes["tensor"] = Box(("O += PV", *(f"wgmma m64n{pv_n}k16" if mma == "wgmma" else "mma m16n8k16").split(" ")))
    o.boxes["regs"] = Box((f"O {pt['O']} fp32", f"{pt['O'] * 4} B / thread"))
    o.arrows.append(Arrow("tensor", "regs", ("accumulate", "rescaled")))
    path = facts.o_path(stage)
    o.boxes["l2"] = Box(("write-back",))
    o.boxes["hbm"] = Box((f"O {m}×{d}", fmt_bytes(t.o), layout))
    if len(path) == 2:
        obuf = facts.smem_of(stage, "O")
        o.arrows.append(Arrow("regs", "smem", (engines.LABEL.get(path[0], path[0]), "once")))
        o.boxes["smem"] = _buf(obuf, "O") if obuf else Box(("O staging",))
        store = "TMA " + (f"{_tma_box(stage)}" if path[1] in ("tma", "tma-store") else "store")
        o.arrows.append(Arrow("smem", "l2", (store, "store, once")))
    else:
        o.arrows.append(Arrow("regs", "l2", (engines.LABEL.get(path[0], path[0]), "once")))
    o.arrows.append(Arrow("l2", "hbm", ()))

    if stage.lse:
        lse = rows["LSE"] = Row()
        lse.boxes["regs"] = Box(("m + log ℓ", "fp32 per row"))
        lse.boxes["l2"] = Box(("write-back",))
        lse.boxes["hbm"] = Box((f"LSE {m} × fp32", f"{m * 4} B per tile"))
        lse.arrows.append(Arrow("regs", "l2", ("st.global", "once")))
        lse.arrows.append(Arrow("l2", "hbm", ()))
    ids = [b for b in stage.smem if b.layout != "mbarrier" and "tile id" in b.name.lower()]
    if ids:
        r = rows["ID"] = Row()
        r.boxes["l2"] = Box(("tile counter", "atomicAdd"))
        r.arrows.append(Arrow("l2", "smem", ("producer", "per tile")))
        r.boxes["smem"] = Box((f"ids {ids[0].buffers} × {ids[0].bytes // ids[0].buffers} B", "tile-id ring"))
        r.arrows.append(Arrow("smem", "regs", ("ld.shared", "per tile")))
        r.boxes["regs"] = Box(("tile id", "1 per thread"))
    return {k: rows[k] for k in ROW_NAME if k in rows}


def _notes(stage) -> list[str]:
    """What the boxes cannot say: the causal, any-length and grouped-query paths."""
    out = []
    if stage.causal:
        out.append("Causal: K and V tiles past a query tile's diagonal are never loaded; the diagonal tile of S "
                   "is masked in registers.")
    if stage.tails:
        out.append("Any length: TMA fills zeros past the end of K and V and masks the last tile; the O store "
                   "writes only rows < len_q.")
    if stage.strided:
        out.append("BSHD read in place: 4-D tensor maps (column, row, head, batch) take the caller's strides.")
    if stage.gqa:
        out.append("Grouped-query: the query heads of a group read the same K and V tiles, from L2, without a copy.")
    return out


def _items(rows: dict[str, Row]) -> dict[str, str]:
    """Every drawn item with what it says: keys to compare one stage's picture with another's."""
    out = {}
    for name, r in rows.items():
        for lvl, b in r.boxes.items():
            out[f"{name}:{lvl}"] = " ".join(b.lines)
        for a in r.arrows:
            out[f"{name}:{a.src}>{a.dst}"] = " ".join(a.lines)
    return out


def signature(stage) -> str:
    """What the memory picture shows, without the stage's name: equal for two stages whose memory
    movement is the same."""
    items = _items(plan(stage))
    smem = [(b.name, b.shape, b.dtype, b.buffers, b.layout) for b in stage.smem]
    return repr((sorted(items.items()), smem))


def changes(stage, stages) -> tuple[set[str], list[str]]:
    """(keys of the items that are new or differ from the previous stage, phrases saying what): new
    places first, then new mechanisms, then what is gone, then the sizes that changed."""
    prev = next((s for s in stages if s.number == stage.number - 1), None)
    if prev is None:
        return set(), []
    now_plan = plan(stage)
    now, before = _items(now_plan), _items(plan(prev))
    keys = {k for k, v in now.items() if before.get(k) != v}
    mech = {f"{name}:{a.src}>{a.dst}": a.lines[0] for name, r in now_plan.items() for a in r.arrows if a.lines}
    added, moved, resized = {}, {}, []
    for k in sorted(keys, key=_order):
        row, where = k.split(":")
        what = ROW_NAME[row][0]
        if ">" in where:
            a, b = where.split(">")
            if k in mech:
                moved.setdefault((LEVEL_NAME[a], LEVEL_NAME[b], mech[k]), []).append(what)
        elif k not in before:
            added.setdefault(LEVEL_NAME[where], []).append(f"{what} ({now[k]})")
        else:
            resized.append(f"{what} in {LEVEL_NAME[where]}: {now[k]}")
    words = [f"new in {level}: {', '.join(items)}" for level, items in added.items()]
    words += [f"{', '.join(whats)}: {a} → {b} by {m}" for (a, b, m), whats in moved.items()]
    words += [f"gone: {ROW_NAME[k.split(':')[0]][0]} in {LEVEL_NAME[k.split(':')[1]]}"
              for k in sorted(before, key=_order) if k not in now and ">" not in k]
    return keys, words + resized


def _order(key: str):
    row, where = key.split(":")
    return (list(ROW_NAME).index(row), where)


LEVEL_NAME = {"hbm": "HBM", "l2": "L2", "smem": "shared memory", "regs": "registers", "tensor": "tensor cores"}
LEVEL_HEAD = {"hbm": ("HBM", "device · 141 GB"), "l2": ("L2", "device · 50 MB+"),
              "smem": ("Shared memory", "per CTA"), "regs": ("Registers", "per thread"),
              "tensor": ("Tensor cores", "per SM")}


def _col_x(level: str) -> float:
    return LABEL_W + LEVELS.index(level) * (BOX_W + GAP)


def memory_diagram(stage, stages) -> Diagram:
    did = f"s{stage.id}-memory"
    rows = plan(stage)
    hot, words = changes(stage, stages)
    prev = next((s for s in stages if s.number == stage.number - 1), None)
    l2_iter = sum(facts.l2_bytes_per_iter(stage, x) for x in ("K", "V"))
    top = 88
    heights = {k: ROW_H + (20 if any(a.below for a in r.arrows) else 0) for k, r in rows.items()}
    notes = _notes(stage)
    height = top + sum(heights.values()) + 150 + 20 * len(notes) + (18 * 2 if words else 0)
    title = f"Stage {stage.id} memory movement"
    desc = (f"The path of every operand of stage {stage.id} through HBM, L2, shared memory (per CTA), "
            f"registers (per thread) and the tensor cores. Per KV iteration the CTA reads "
            f"{fmt_bytes(l2_iter)} of K and V from L2 for {2 * facts.gemm_flops(stage) / 1e6:.1f} MFLOP; shared memory holds "
            f"{fmt_bytes(stage.smem_bytes)}.")
    c = Canvas(did, W, height, title, desc)
    c.heading(f"{stage.id} · {stage.title}", ": where each operand lives and how it moves")

    # Column heads with their scopes.
    for lvl in LEVELS:
        x = _col_x(lvl)
        head, scope = LEVEL_HEAD[lvl]
        if lvl == "smem":
            scope = f"per CTA · {fmt_bytes(stage.smem_bytes)}" if stage.smem else "per CTA · unused"
        c.text(x + BOX_W / 2, 48, head, size=13, anchor="middle", weight="700")
        c.text(x + BOX_W / 2, 65, scope, size=12, anchor="middle", fill="muted")
        c.line(x + BOX_W / 2, 72, x + BOX_W / 2, top - 4, stroke="grid", sw=1)

    y = top
    row_y = {}
    for name in rows:
        row_y[name] = y
        colour = COLOUR[name]
        big, small = ROW_NAME[name]
        c.rect(8, y + 4, W - 16, heights[name] - 8, fill="panel", stroke=None, rx=6)
        c.text(16, y + 28, big, size=16 if len(big) < 3 else 13, weight="700", fill=colour)
        c.text(16, y + 45, small, size=12, fill="muted")
        y += heights[name]
    # The two GEMMs: one box each in the tensor-core column, over the rows of their operands.
    flops = facts.gemm_flops(stage)
    for out, first, colour in (("S", "Q", "s"), ("O", "P", "o")):
        box = rows[out].boxes["tensor"]
        y0, y1 = row_y[first] + 8, row_y[out] + heights[out] - 8
        x = _col_x("tensor")
        if f"{out}:tensor" in hot and prev is not None:
            c.rect(x - 5, y0 - 5, BOX_W + 10, y1 - y0 + 10, fill="hl", stroke=None, opacity=0.6, rx=6)
        c.rect(x, y0, BOX_W, y1 - y0, fill="panel2", stroke=colour, rx=5, sw=1.6)
        lines = list(box.lines) + [f"{flops / 1e6:.2f} MFLOP", "per iteration"]
        for k, s_ in enumerate(lines):
            c.text(x + BOX_W / 2, (y0 + y1) / 2 + 4 + (k - (len(lines) - 1) / 2) * 16, s_,
                   size=_fit(s_, BOX_W - 6, bold=k == 0), anchor="middle", weight="600" if k == 0 else None,
                   fill="fg" if k == 0 else "muted")
    for name, r in rows.items():
        _row(c, name, r, row_y[name], COLOUR[name], hot if prev is not None else set())

    # The shared-memory budget of one CTA: every buffer, to scale against the 227 KiB limit.
    y += 22
    c.text(12, y, f"Shared memory of one CTA: {fmt_bytes(stage.smem_bytes)} of {fmt_bytes(SMEM_LIMIT)}"
           if stage.smem else "Shared memory: none; every warp reads its operands from global memory",
           size=12, weight="600")
    if stage.smem:
        _budget(c, stage, y + 10)
    y += 62 if stage.smem else 24
    smem_read = sum(facts.smem_read_per_iter(stage, x) for x in ("K", "V"))
    c.text(12, y, f"Per KV iteration, one CTA: {fmt_bytes(l2_iter)} of K and V from L2"
                  + (f" · {fmt_bytes(smem_read)} read from shared memory" if smem_read else "")
                  + f" · {2 * flops / 1e6:.2f} MFLOP · {2 * flops / l2_iter:.0f} FLOP per L2 byte", size=12)
    y += 20
    prev_notes = _notes(prev) if prev is not None else notes
    fresh = []
    for note in notes:
        if note not in prev_notes:
            c.rect(8, y - 14, text_width(note, 12) + 10, 20, fill="hl", stroke=None, opacity=0.6, rx=4)
            head = note.split(":")[0]
            fresh.append(head if head[1:2].isupper() else head[0].lower() + head[1:])
        c.text(12, y, note, size=12)
        y += 20
    if fresh:
        words.insert(0, f"{', '.join(fresh)} (the notes under the figure)")
    if words:
        c.rect(12, y - 11, 12, 12, fill="hl", stroke=None, opacity=0.6, rx=2)
        c.text(30, y, f"highlighted: changed since stage {prev.id}", size=12, fill="muted")
        y += 18
    c.height = height = int(y + 8)
    if prev is None:
        cap = ("Each row is one operand's path; sizes in the register column are per thread. No shared memory: "
               "every warp loads its own K and V fragments, so each tile crosses from L2 once per warp.")
    elif not words:
        cap = f"The memory movement of stage {prev.id}, unchanged."
    else:
        shown = words[:4] + ([f"and {len(words) - 4} more, highlighted"] if len(words) > 4 else [])
        cap = f"Since stage {prev.id} (highlighted): " + "; ".join(shown) + "."
    return Diagram(did, title, "memory", stage.number, c.tostring(), cap, W, height, signature(stage))


def _row(c, name, r: Row, y, colour, hot):
    by = y + 8
    bh = ROW_H - 16
    for a in r.arrows:
        _arrow(c, a, by, bh, colour, f"{name}:{a.src}>{a.dst}" in hot)
    for lvl, b in r.boxes.items():
        if lvl == "tensor":
            continue  # drawn over the rows of its operands
        x = _col_x(lvl)
        if f"{name}:{lvl}" in hot:
            c.rect(x - 5, by - 5, BOX_W + 10, bh + 10, fill="hl", stroke=None, opacity=0.6, rx=6)
        light = lvl == "l2"
        c.rect(x, by, BOX_W, bh, fill="bg" if light else colour, stroke=colour, opacity=None if light else 0.2,
               rx=4, sw=1.3)
        lines = [s for s in b.lines if s]
        for k, s in enumerate(lines):
            size = _fit(s, BOX_W - 6, bold=k == 0)
            yy = by + bh / 2 + 4 + (k - (len(lines) - 1) / 2) * 15
            c.text(x + BOX_W / 2, yy, s, size=size, anchor="middle", weight="600" if k == 0 else None,
                   fill="fg" if k == 0 else "muted")


def _fit(s: str, width: float, bold: bool = False) -> float:
    """12 px, or down to 11 px if that is what it takes to fit."""
    size = 12.0
    while text_width(s, size, bold=bold) > width and size > 11:
        size -= 0.5
    return size


def _arrow(c, a: Arrow, by, bh, colour, hot):
    i, j = LEVELS.index(a.src), LEVELS.index(a.dst)
    right = j > i
    ym = by + bh / 2
    if a.below:  # under the box it passes, label below the row's boxes
        xs, xe = _col_x(a.src) + BOX_W / 2, _col_x(a.dst)
        yb = by + bh + 6
        if hot:
            c.rect(xs - 4, by + bh - 2, xe - xs + 4, 24, fill="hl", stroke=None, opacity=0.6, rx=3)
        c.path([(xs, by + bh), (xs, yb), (xe - 2, yb)], stroke=colour, sw=1.6, arrow=True)
        c.text((xs + xe) / 2, yb + 15, " · ".join(s for s in a.lines if s), size=12, anchor="middle")
        return
    x1 = _col_x(a.src) + (BOX_W if right else 0)
    x2 = _col_x(a.dst) + (0 if right else BOX_W)
    if hot:
        c.rect(min(x1, x2) + 1, ym - 20, abs(x2 - x1) - 2, 40, fill="hl", stroke=None, opacity=0.6, rx=4)
    c.line(x1 + (2 if right else -2), ym, x2 + (-2 if right else 2), ym, stroke=colour, sw=1.6, arrow=True)
    lines = [s for s in a.lines if s]
    mid, span = (x1 + x2) / 2, abs(x2 - x1) - 6
    for k, s in enumerate(lines):
        c.text(mid, ym - 6 if k == 0 else ym + 15, s, size=_fit(s, span), anchor="middle",
               fill="fg" if k == 0 else "muted")


def _budget(c, stage, y):
    """A bar of the 227 KiB a CTA may have, cut into the stage's buffers."""
    x0, x1 = 12, W - 12
    scale = (x1 - x0) / SMEM_LIMIT
    c.rect(x0, y, x1 - x0, 20, fill="panel2", stroke="grid", rx=3)
    x = x0
    labels = []
    for b in stage.smem:
        w = b.bytes * scale
        t = facts.buffer_tensor(b)
        fill = {"Q": "q", "K": "k", "V": "v", "KV": "k", "P": "p", "O": "o"}.get(t or "", "warp")
        c.rect(x, y, max(w, 1), 20, fill=fill, stroke="bg", opacity=0.55, rx=0, sw=1)
        labels.append((x, w, b))
        x += w
    for x, w, b in labels:
        label = f"{b.name} {fmt_bytes(b.bytes)}"
        if text_width(label, 12) <= w - 6:
            c.text(x + w / 2, y + 15, label, size=12, anchor="middle")
        elif text_width(fmt_bytes(b.bytes), 12) <= w - 4:
            c.text(x + w / 2, y + 15, fmt_bytes(b.bytes), size=12, anchor="middle")
    small = [b for _, w, b in labels if text_width(fmt_bytes(b.bytes), 12) > w - 4]
    if small:
        total = sum(b.bytes for b in small)
        names = ", ".join(sorted({b.name.replace(" mbarriers", "").replace(" mbarrier", "") for b in small}))
        text = f"and {fmt_bytes(total)} of barriers and ids ({names})"
        if text_width(text, 12) > W - 24:
            text = f"and {fmt_bytes(total)} of barriers and ids"
        c.text(12, y + 38, text, size=12, fill="muted")
