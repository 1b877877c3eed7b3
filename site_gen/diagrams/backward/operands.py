"""The backward's memory picture: where each operand of the five GEMMs lives.

Columns are the places (global memory, shared memory of one CTA, registers of one thread) and the
tensor cores; a band per GEMM puts its A and B operands and its result in the column where each
lives, with the mechanism that reads it, and the instruction and FLOPs in the tensor-core column.
Above the GEMMs, what comes into the CTA (Q and dO every query block, K and V once); between dP and
dV, the softmax's step that makes P and dS and where it puts them. Every box comes from the spec
through facts.py (plan() is the data; tests check it against the stage.toml).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..diagram import Diagram
from ..svg import Canvas, fmt_bytes, text_width
from . import facts

W = 860
LABEL_W = 150
BOX_W, GAP = 126, 64
SUB_H, BOX_H = 42, 34
SMEM_LIMIT = 227 * 1024
COLUMNS = ("global", "smem", "regs", "tensor")
HEAD = {"global": ("Global memory", "HBM and L2 · device"), "smem": ("Shared memory", "per CTA"),
        "regs": ("Registers", "per thread"), "tensor": ("Tensor cores", "per SM")}


@dataclass(frozen=True)
class Chip:
    role: str  # "A", "B", "C"; dQ through shared memory also "tile" and "sum" (facts.dq_route)
    place: facts.Place
    sub: float  # sub-row: 0, 1, 2, or 0.5 (between A and B)


def col_x(level: str) -> float:
    return LABEL_W + COLUMNS.index(level) * (BOX_W + GAP)


def plan(stage) -> list[tuple[facts.Gemm, list[Chip]]]:
    """Per GEMM (the ones the schedule runs, in the algorithm's order), its chips and their sub-rows:
    A above B; the result between them when its column holds neither, else below them; where dQ
    goes through shared memory (facts.dq_route), its tile and the sum below them."""
    kinds = {op.kind for op in stage.schedule}
    out = []
    for g in facts.gemms(stage):
        if g.kind not in kinds:
            continue
        a, b, c = facts.operand(stage, g, "a"), facts.operand(stage, g, "b"), facts.result(stage, g)
        sub_c = 0.5 if c.level not in (a.level, b.level) else 2
        chips = [Chip("A", a, 0), Chip("B", b, 1), Chip("C", c, sub_c)]
        if g.kind == "dq":
            chips += [Chip(role, place, 2) for role, place in zip(("tile", "sum"), facts.dq_route(stage))]
        out.append((g, chips))
    return out


def _rows(chips: list[Chip]) -> int:
    return 3 if any(ch.sub == 2 for ch in chips) else 2


def signature(stage) -> str:
    return repr(([(g.kind, [(c.role, c.place) for c in chips]) for g, chips in plan(stage)],
                 facts.loads(stage), facts.dq_path(stage),
                 [(b.name, b.shape, b.dtype, b.buffers, b.layout) for b in stage.smem]))


def _fit(s: str, width: float, bold: bool = False) -> float:
    size = 12.0
    while text_width(s, size, bold=bold) > width and size > 11:
        size -= 0.5
    return size


def _box(c, x, y, lines, colour, w=BOX_W, h=BOX_H, light=False):
    c.rect(x, y, w, h, fill="bg" if light else colour, stroke=colour, opacity=None if light else 0.2, rx=4, sw=1.3)
    lines = [s for s in lines if s]
    for k, s in enumerate(lines):
        yy = y + h / 2 + 4 + (k - (len(lines) - 1) / 2) * 14.5
        c.text(x + w / 2, yy, s, size=_fit(s, w - 6, bold=k == 0), anchor="middle",
               weight="600" if k == 0 else None, fill="fg" if k == 0 else "muted")


def operands_diagram(stage, stages) -> Diagram:
    did = f"b{stage.id}-operands"
    rows = plan(stage)
    path = facts.dq_path(stage)
    prev = next((s for s in stages if s.number == stage.number - 1), None)
    flops = facts.gemm_flops(stage)
    where = {(ch.place.base, ch.place.level) for _g, chips in rows for ch in chips if ch.role != "C"}
    in_smem = sorted({t for t, lv in where if lv == "smem"}, key=facts.NAMES.index)
    in_regs = sorted({t for t, lv in where if lv == "regs"}, key=facts.NAMES.index)
    if facts.stats_load(stage):  # the row statistics, loaded with the step's tiles into a buffer of their own
        in_smem.append("lse₂, D")
    title = f"Backward stage {stage.id}: where the operands of the five GEMMs live"
    desc = (f"For each of the five GEMMs of backward stage {stage.id} ({', '.join(g.formula for g in facts.gemms(stage))}) "
            f"the place of its A and B operands and of its result: global memory, "
            f"shared memory ({fmt_bytes(stage.smem_bytes)} per CTA) or registers, and the mechanism that reads "
            f"each. In shared memory: {', '.join(in_smem) or 'none'}; in registers: {', '.join(in_regs) or 'none'}. "
            f"dQ is summed by {_dq_words(path)}.")
    top = 84
    load_h = 18 + 46 * len(facts.loads(stage))
    soft_h = 64 + (18 if _fenced(stage) else 0)
    heights = [_rows(chips) * SUB_H + 14 for _g, chips in rows]
    height = top + load_h + sum(heights) + soft_h + 170
    c = Canvas(did, W, height, title, desc)
    c.heading(f"{stage.id} · backward", ": where the operands of the five GEMMs live, and how they move")
    for lvl in COLUMNS:
        x = col_x(lvl)
        head, scope = HEAD[lvl]
        if lvl == "smem":
            scope = f"per CTA · {fmt_bytes(stage.smem_bytes)}" if stage.smem else "per CTA · unused"
        c.text(x + BOX_W / 2, 48, head, size=13, anchor="middle", weight="700")
        c.text(x + BOX_W / 2, 65, scope, size=12, anchor="middle", fill="muted")
        c.line(x + BOX_W / 2, 72, x + BOX_W / 2, top - 4, stroke="grid", sw=1)

    # What comes into the CTA.
    y = top
    c.rect(8, y + 2, W - 16, load_h - 4, fill="panel", stroke=None, rx=6)
    c.text(16, y + 24, "Tiles in", size=14, weight="700")
    c.text(16, y + 41, "from global memory", size=12, fill="muted")
    for i, (names, level, mech, when) in enumerate(facts.loads(stage)):
        by = y + 10 + 46 * i
        colour = facts.COLOUR[names.split(",")[0]]
        size = (f"{stage.block_m} fp32 each" if names == "LSE, D" else
                f"{stage.block_m if 'Q' in names else stage.block_n}×{stage.head_dim} bf16 each")
        _box(c, col_x("global"), by, ("lse₂, D" if names == "LSE, D" else names, size), colour, light=True)
        bufs = [b for n in names.split(", ") for b in facts.smem_of(stage, n)]
        dest = _box_text_dest(bufs, level)
        _box(c, col_x(level), by, dest, colour)
        x1, x2 = col_x("global") + BOX_W, col_x(level)
        ym = by + BOX_H / 2
        c.line(x1 + 2, ym, x2 - 2, ym, stroke=colour, sw=1.6, arrow=True)
        c.text(x2 + BOX_W + 10, ym - 3, mech, size=12)
        c.text(x2 + BOX_W + 10, ym + 13, when, size=12, fill="muted")
    y += load_h

    for (g, chips), h in zip(rows, heights):
        if g.kind == "dv":  # the softmax's step sits between the scores and the gradients it feeds
            y = _softmax_band(c, stage, y, soft_h)
        colour = facts.COLOUR[g.out]
        c.rect(8, y + 4, W - 16, h - 8, fill="panel", stroke=None, rx=6)
        c.text(16, y + 28, g.formula, size=14, weight="700", fill=colour)
        life = {"S": "per query block", "dP": "per query block", "dV": "summed over the loop",
                "dK": "summed over the loop", "dQ": "summed over keys"}[g.out]
        c.text(16, y + 45, life, size=12, fill="muted")
        for ch in chips:
            p = ch.place
            by = y + 8 + ch.sub * SUB_H
            if ch.role == "tile":
                lines = (f"{p.tensor}, {p.shape}", p.how)
            elif ch.role == "sum":
                lines = (f"{p.tensor} sum" + (", block order" if "block order" in p.shape else ""),
                         f"{p.how}, fp32")
            elif ch.role != "C":
                lines = (f"{ch.role}: {p.tensor}", p.how)
            elif p.level == "regs":
                lines = (f"C: {p.tensor}", p.shape)
            else:
                lines = (f"C: {p.tensor}, {p.shape}", p.how)
            _box(c, col_x(p.level), by, lines, facts.COLOUR[p.base])
        _route_arrows(c, chips, y, facts.COLOUR[g.out])
        # the GEMM itself, over the whole band
        x, y0, y1 = col_x("tensor"), y + 8, y + h - 14
        c.rect(x, y0, BOX_W, y1 - y0, fill="panel2", stroke=colour, rx=5, sw=1.6)
        instr = "wgmma" if facts.mma(stage) == "wgmma" else "mma m16n8k16"
        lines = [instr, f"{flops / 1e6:.2f} MFLOP", "per query block"]
        for k, s in enumerate(lines):
            c.text(x + BOX_W / 2, (y0 + y1) / 2 + 4 + (k - 1) * 15, s, size=_fit(s, BOX_W - 6, bold=k == 0),
                   anchor="middle", weight="600" if k == 0 else None, fill="fg" if k == 0 else "muted")
        y += h

    # The CTA's shared memory, to scale against the 227 KiB a CTA may have.
    y += 24
    c.text(12, y, f"Shared memory of one CTA: {fmt_bytes(stage.smem_bytes)} of {fmt_bytes(SMEM_LIMIT)}"
           if stage.smem else "Shared memory: none", size=12, weight="600")
    if stage.smem:
        _budget(c, stage, y + 10)
        y += 50
    y += 12
    notes = [f"Per query block, one CTA: five GEMMs of {flops / 1e6:.2f} MFLOP each "
             f"({5 * flops / 1e6:.2f} MFLOP), against {2 * flops / 1e6:.2f} for the forward's two."]
    if path.bulk:
        notes.append(bulk_note(stage, path))
    elif path.atomic:
        notes.append(f"dQ: each CTA adds its {stage.block_m}×{stage.head_dim} share into the fp32 accumulator by "
                     f"{path.mechanism} ({path.adds_label}, {path.per_cta:,} floats per CTA per query block).")
    if stage.gqa:
        notes.append("Grouped-query: the CTA walks every query head of its K/V head, so dK and dV sum the group "
                     "in registers.")
    for note in notes:
        for line in _wrap(note, W - 24):
            y += 18
            c.text(12, y, line, size=12)
    c.height = height = int(y + 14)
    if prev is None:
        cap = (f"The five GEMMs of backward stage {stage.id}, each in one band: its A and B operands and its result "
               "sit in the column of the place they live in; shared memory holds "
               f"{', '.join(in_smem) or 'nothing'}, and the result of every GEMM but dQ's stays in registers. "
               "Drawn from the stage's `[[smem]]`, `[movement]` and `[[roles]]`.")
    else:
        same = signature(prev) == signature(stage)
        cap = (f"The operands live where they did at backward stage {prev.id}." if same else
               f"Against backward stage {prev.id}: {_form_change(stage, prev, rows)}in shared memory now "
               f"{', '.join(in_smem) or 'nothing'}; in registers {', '.join(in_regs) or 'nothing'}; "
               f"dQ by {_dq_words(path)}.")
    return Diagram(did, title, "memory", stage.number, c.tostring(), cap, W, height, signature(stage))


def _dq_words(path) -> str:
    """How dQ is summed, for a caption: the mechanism, or the path through a shared tile."""
    b = path.bulk
    if b is None:
        return path.mechanism
    tile = (f"a {b.tile_bytes // 1024} KiB shared tile" if b.tiles_per_op == 1 else
            f"one of {b.tiles_per_op} shared tiles of {b.tile_bytes // 1024} KiB")
    return (f"one bulk reduce-add ({b.ptx}) per {facts.group_name(b.writers)} and step from {tile} into the fp32 "
            "accumulator" + (", kept in block order" if b.block_order else ""))


def bulk_note(stage, path) -> str:
    """The operands figure's note on dQ through shared memory."""
    b = path.bulk
    group = facts.group_name(b.writers)
    kib = b.tile_bytes // 1024
    tiles = (f"a shared tile of {kib} KiB" if b.tiles_per_op == 1 else
             f"one of its {b.tiles_per_op} shared tiles of {kib} KiB, in turn,")
    writers = next((op.role for op in stage.schedule if op.kind == "dq"), "")
    issuer = (f"one thread of the {group}" if not b.own_warps else
              f"a dQ warp of the {b.issuer_role} (one per {writers} {group})".replace("  ", " "))
    order = (f" The accumulator is kept in the tiles' order (a {kib} KiB block per query block and "
             f"{group}), which the conversion kernel undoes." if b.block_order else "")
    return (f"dQ: each {group} stores its {b.tile_rows}×{b.tile_cols} share ({path.per_thread} fp32 a thread) into {tiles} "
            f"as its registers hold it ({b.store}, {b.stores} per thread), and {issuer} adds "
            f"the whole tile into the fp32 accumulator with one bulk reduce-add ({b.ptx}, carried out by the TMA "
            f"unit): {b.ops} per CTA per query block, {path.per_cta:,} floats.{order}")


def _route_arrows(c, chips, y, colour):
    """dQ's way out, when it goes through shared memory: the accumulator to its tile, the tile to the sum."""
    at = {ch.role: ch for ch in chips}
    if "tile" not in at or "sum" not in at:
        return
    acc, tile, total = at["C"], at["tile"], at["sum"]
    yt = y + 8 + tile.sub * SUB_H + BOX_H / 2
    c.line(col_x(acc.place.level) + 10, y + 8 + acc.sub * SUB_H + BOX_H + 1, col_x(tile.place.level) + BOX_W + 2, yt,
           stroke=colour, sw=1.5, arrow=True)
    c.line(col_x(tile.place.level) - 2, yt, col_x(total.place.level) + BOX_W + 2, yt, stroke=colour, sw=1.5,
           arrow=True)


def _box_text_dest(bufs, level) -> tuple[str, ...]:
    if not bufs:
        return ("fragments", "in registers")
    names = " + ".join(b.name for b in bufs)
    return (names, " + ".join(fmt_bytes(b.bytes) for b in bufs))


def _form_change(stage, prev, rows) -> str:
    """What the caption says first when the GEMMs changed form since ``prev`` (e.g. Sᵀ = K Qᵀ for
    S = Q Kᵀ) or take an operand from registers that went through shared memory: "" when neither."""
    before = {g.kind: g.formula for g in facts.gemms(prev)}
    changed = [g for g in facts.gemms(stage) if g.kind in before and g.formula != before[g.kind]]
    old_regs = {(g.kind, ch.role) for g, chips in plan(prev) for ch in chips
                if ch.role != "C" and ch.place.level == "regs"}
    regs = [(g, ch) for g, chips in rows for ch in chips
            if ch.role != "C" and ch.place.level == "regs" and (g.kind, ch.role) not in old_regs]
    smem_mn = [(g, ch) for g, chips in rows for ch in chips if ch.place.base in ("P", "dS")
               and ch.place.level == "smem" and "MN-major" in ch.place.how]
    out = []
    if changed:
        dims = sorted({facts.DIM_WORD[g.m] for g in changed})
        out.append(f"{' and '.join(g.formula for g in changed)} (M = {', '.join(dims)})")
    if regs:
        out.append(f"the A of {_and([g.out_shown for g, _ch in regs])} from registers "
                   f"({_and([ch.place.tensor for _g, ch in regs])})")
    if changed and smem_mn:
        out.append(_and([f"{g.out_shown}'s A read MN-major from the {facts.held_name(stage, ch.place.base)} tile in "
                         "shared memory" for g, ch in smem_mn]))
    return "".join(f"{x}; " for x in out)


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _fenced(stage) -> bool:
    """Whether P or dS, stored by ordinary instructions, are read from shared memory by wgmma: the
    stores then need fence.proxy.async before the barrier (the async proxy reads them)."""
    return facts.mma(stage) == "wgmma" and any(
        ch.place.base in ("P", "dS") and ch.place.level == "smem" for _g, chips in plan(stage) for ch in chips)


def _softmax_band(c, stage, y, h) -> float:
    """P and dS: made from S and dP in registers, then (when they have buffers) stored to shared memory,
    because their transposes are the A operands of dV and dK — or, with the scores transposed, because
    dQ wants dS the other way round from how it is held."""
    p, ds = facts.held_name(stage, "P"), facts.held_name(stage, "dS")
    sc, dp = facts.held_name(stage, "S"), facts.held_name(stage, "dP")
    c.rect(8, y + 4, W - 16, h - 8, fill="panel", stroke=None, rx=6)
    c.text(16, y + 26, f"{p}, {ds}", size=14, weight="700", fill="p")
    c.text(16, y + 43, f"from {sc} and {dp}", size=12, fill="muted")
    softmax = next((op.engine for op in stage.schedule if op.kind == "softmax"), "ex2.approx")
    by = y + (64 - BOX_H) / 2
    _box(c, col_x("regs"), by, (f"{p}, {ds} bf16", f"{softmax}, FMA"), "p")
    bufs = facts.smem_of(stage, "P") + facts.smem_of(stage, "dS")
    if bufs:
        names = [facts.held_name(stage, b.name) if b.name in ("P", "dS") else b.name for b in bufs]
        _box(c, col_x("smem"), by, (" + ".join(names), " + ".join(fmt_bytes(b.bytes) for b in bufs)), "p")
        x1, x2, ym = col_x("regs"), col_x("smem") + BOX_W, by + BOX_H / 2
        c.line(x1 - 2, ym, x2 + 2, ym, stroke="p", sw=1.6, arrow=True)
        c.text((x1 + x2) / 2, ym - 6, stage.diagram.p_store, size=12, anchor="middle")
        if _fenced(stage):
            c.text((x1 + x2) / 2, by + BOX_H + 16, "then fence.proxy.async and bar.sync", size=12, anchor="middle",
                   fill="muted")
        else:
            c.text((x1 + x2) / 2, ym + 15, "bar.sync", size=12, anchor="middle", fill="muted")
    # lse and D of each query row: the preprocess's, read from global memory (or, loaded with the
    # step's tiles into a buffer of their own, from shared memory: the tiles-in band draws them)
    if not facts.stats_load(stage):
        _box(c, col_x("global"), by, ("lse, D per row", "fp32, preprocess"), "accent", light=True)
    c.text(col_x("tensor") + BOX_W / 2, by + BOX_H / 2 + 4, f"{p} = 2^({sc}·c − lse)", size=12, anchor="middle",
           fill="muted")
    c.text(col_x("tensor") + BOX_W / 2, by + BOX_H / 2 + 20, f"{ds} = {p} ∘ ({dp} − D)", size=12, anchor="middle",
           fill="muted")
    c.text(col_x("tensor") + BOX_W / 2, by + BOX_H / 2 - 12, "in registers:", size=12, anchor="middle", fill="muted")
    return y + h


def _budget(c, stage, y):
    x0, x1 = 12, W - 12
    scale = (x1 - x0) / SMEM_LIMIT
    c.rect(x0, y, x1 - x0, 20, fill="panel2", stroke="grid", rx=3)
    x = x0
    for b in stage.smem:
        w = b.bytes * scale
        colour = facts.COLOUR.get(facts.buffer_tensor(b) or "", "warp")
        c.rect(x, y, max(w, 1), 20, fill=colour, stroke="bg", opacity=0.55, rx=0, sw=1)
        label = f"{b.name} {fmt_bytes(b.bytes)}"
        if text_width(label, 12) <= w - 6:
            c.text(x + w / 2, y + 15, label, size=12, anchor="middle")
        elif text_width(b.name, 12) <= w - 4:
            c.text(x + w / 2, y + 15, b.name, size=12, anchor="middle")
        x += w


def _wrap(s: str, width: float) -> list[str]:
    from ..svg import wrap

    return wrap(s, width, 12)
