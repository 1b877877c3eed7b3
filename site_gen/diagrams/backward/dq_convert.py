"""How dQ leaves the fp32 accumulator (``[movement] dq_convert = "staged rows"``, backward stage 11 on).

The backward's last launch turns the fp32 dQ accumulator into the caller's bf16 dQ: a CTA of
CONSUMER_THREADS threads per block_m query rows of a head, each row head_dim · 2 bytes, 32-byte
sectors. Since stage 04 the accumulator is kept in the wgmma fragments' order (a thread holds two
rows and two columns of each 8), and the conversion stored each thread's pieces where they belong:
one warp instruction writes 4 bytes a thread, 16 bytes into each of 8 rows, half of every sector it
touches. "staged rows" puts the fragments into a shared tile first (rows DQ_ROW_PITCH bytes apart,
so a warp's 4-byte stores fall in 32 different banks) and writes whole rows, 16 bytes a thread.

The figure draws one warp store instruction of each form on the sectors of the rows it writes, the
shared tile between them, and counts the stores a thread makes. Its numbers are the spec's (tile,
head dim) and the kernel's constexprs (CONSUMER_THREADS, DQ_ROW_PITCH).
"""

from __future__ import annotations

from ..diagram import Diagram
from ..svg import Canvas, wrap

W = 860
LEFT = 12
SECTOR = 32  # bytes a DRAM/L2 sector holds
X0 = 70  # the rows' left edge (row labels left of it)
SECTOR_W = 80
ROW_H, ROW_GAP = 18, 3
FRAGMENT_BYTES = 4  # a thread's piece per store in the fragment form: two bf16
ROW_STORE_BYTES = 16  # a thread's piece per store in the row form: eight bf16


def _geometry(stage) -> dict:
    k = stage.constants()  # a staged-rows kernel defines both; a KeyError names the one it lacks
    row = stage.head_dim * 2
    threads = k["CONSUMER_THREADS"]
    return {"row": row, "sectors": row // SECTOR, "rows": stage.block_m, "threads": threads,
            "pitch": k["DQ_ROW_PITCH"], "bank_step": k["DQ_ROW_PITCH"] // 4 % 32,  # 4-byte banks a row moves on
            # a warp's fragment store: 8 row groups x 4 threads of 4 bytes; a row store: 32 x 16 bytes
            "frag_rows": 8, "frag_bytes": 4 * FRAGMENT_BYTES,
            "frag_stores": stage.block_m * row // (threads * FRAGMENT_BYTES),
            "row_rows": 32 * ROW_STORE_BYTES // row,
            "row_stores": stage.block_m * row // (threads * ROW_STORE_BYTES)}


def signature(stage) -> str:
    return repr((stage.movement.dq_convert, _geometry(stage)))


def _sectors(c, y, rows: int, g: dict, written, label_of) -> float:
    """``rows`` rows of sectors; ``written(r, s)`` gives the bytes of sector s of row r the instruction
    writes, as (first, last) or None. Returns the y below."""
    for r in range(rows):
        ry = y + r * (ROW_H + ROW_GAP)
        c.text(X0 - 8, ry + 13, label_of(r), size=12, anchor="end", fill="muted")
        for s in range(g["sectors"]):
            sx = X0 + s * SECTOR_W
            c.rect(sx, ry, SECTOR_W - 3, ROW_H, fill="bg", stroke="grid", rx=2, sw=1)
            part = written(r, s)
            if part:
                a, b = part
                c.rect(sx + a / SECTOR * (SECTOR_W - 3), ry, (b - a) / SECTOR * (SECTOR_W - 3), ROW_H,
                       fill="store", stroke="store", opacity=0.35, rx=2, sw=1.3)
    return y + rows * (ROW_H + ROW_GAP)


def _scale(c, y, g: dict) -> float:
    """The byte scale under a row of sectors."""
    for s in range(g["sectors"] + 1):
        c.text(X0 + s * SECTOR_W - (1.5 if s else 0), y + 12, str(s * SECTOR), size=11,
               anchor="middle" if 0 < s < g["sectors"] else ("start" if s == 0 else "end"), fill="muted")
    c.text(X0 + g["sectors"] * SECTOR_W + 8, y + 12, "bytes of a row", size=11, fill="muted")
    return y + 18


def _para(c, y, text, size=12, fill="fg", x=LEFT, width=W - 2 * LEFT) -> float:
    for line in wrap(text, width, size):
        c.text(x, y, line, size=size, fill=fill)
        y += 17
    return y


def dq_convert_diagram(stage, stages) -> Diagram:
    did = f"b{stage.id}-dq-convert"
    g = _geometry(stage)
    before = next((s for s in reversed(stages) if s.number < stage.number
                   and s.movement.dq_convert == "fragments"), None)
    old = f"stage {before.id}" if before else "the fragment form"
    title = f"Backward stage {stage.id}: dQ leaves the fp32 accumulator in whole rows"
    desc = (f"One warp store instruction of the dQ conversion on the 32-byte sectors it writes. In {old} each thread "
            f"stores its 4-byte fragment pieces where they belong: {g['frag_bytes']} bytes into each of "
            f"{g['frag_rows']} rows, half of every sector, {g['frag_stores']} stores a thread. In stage {stage.id} the "
            f"fragments go to a shared tile first and leave as 16-byte stores: {g['row_rows']} whole rows of "
            f"{g['row']} bytes, every sector whole, {g['row_stores']} stores a thread.")
    c = Canvas(did, W, 900, title, desc)
    c.heading(f"{stage.id} · backward", ": how dQ leaves the fp32 accumulator (the conversion launch)")
    y = _para(c, 42, f"A CTA of {g['threads']} threads converts {g['rows']} query rows × {stage.head_dim} columns of a "
                     f"head to bf16: a row is {g['row']} bytes, {g['sectors']} sectors of {SECTOR}. Filled: the bytes "
                     "one warp store instruction writes.", fill="muted")
    items = [("store", "written by the instruction"), ("grid", "a 32-byte sector")]
    c.legend(LEFT, y + 2, items, size=12)
    y += 26
    # the fragment form: instruction j = 0 of warp 0, warpgroup 0: columns 0-7 of rows 0-7
    c.text(LEFT, y + 12, (f"Stage {before.id} · " if before else "") + "fragments: st.global.b32, "
           f"{FRAGMENT_BYTES} B a thread", size=13, weight="700")
    y += 22
    y = _sectors(c, y, g["frag_rows"], g, lambda r, s: (0, g["frag_bytes"]) if s == 0 else None,
                 lambda r: f"row {r}")
    y = _scale(c, y, g)
    y = _para(c, y + 8, f"{g['frag_rows']} rows × {g['frag_bytes']} B: {g['frag_rows']} sectors touched, each half "
                        f"written (the other half by the next instruction, columns 8 on); {g['frag_stores']} such "
                        "stores a thread.")
    y += 10
    c.line(LEFT, y - 6, W - LEFT, y - 6, stroke="grid", sw=1)
    # the staged form: fragments -> shared tile -> rows
    c.text(LEFT, y + 12, f"Stage {stage.id} · staged rows: st.shared.b32 into a padded tile, then st.global.v4, "
                         f"{ROW_STORE_BYTES} B a thread", size=13, weight="700")
    y += 26
    boxes = (("registers", f"the wgmma fragments, {g['frag_stores']} × 4 B a thread", "consumer"),
             ("shared tile", f"{g['rows']} rows × {g['pitch']} B ({g['row']} + {g['pitch'] - g['row']} of padding)", "s"),
             ("global dQ", f"whole rows, {ROW_STORE_BYTES} threads to a {g['row']}-byte row", "store"))
    bw, gap = 250, 30
    for i, (name, what, colour) in enumerate(boxes):
        bx = LEFT + i * (bw + gap)
        c.rect(bx, y, bw, 42, fill=colour, stroke=colour, opacity=0.2, rx=4, sw=1.3)
        c.text(bx + bw / 2, y + 17, name, size=12, anchor="middle", weight="600")
        c.text(bx + bw / 2, y + 33, what, size=11, anchor="middle", fill="muted")
        if i:
            c.line(bx - gap + 3, y + 21, bx - 3, y + 21, stroke="stroke", sw=1.3, arrow=True)
    y += 52
    banks = (f"The padding of {g['pitch'] - g['row']} B moves each row {g['bank_step']} banks on, so a warp's "
             f"{g['frag_rows']} rows × 4 threads of 4-byte stores fall in "
             f"{len({(r * g['bank_step'] + t) % 32 for r in range(g['frag_rows']) for t in range(4)})} different "
             "banks; one CTA barrier between the two halves.")
    y = _para(c, y + 4, banks, fill="muted")
    y += 6
    y = _sectors(c, y, g["row_rows"], g, lambda r, s: (0, SECTOR), lambda r: f"row {r}")
    y = _scale(c, y, g)
    y = _para(c, y + 8, f"{g['row_rows']} rows × {g['row']} B: {g['row_rows'] * g['sectors']} sectors, each whole; "
                        f"{g['row_stores']} such stores a thread (the shared tile's reads the same).")
    c.height = height = int(y + 4)
    cap = (f"One warp store instruction of the dQ conversion, on the 32-byte sectors of the rows it writes "
           f"(bf16 dQ, {g['row']}-byte rows). Upper: {old}, the accumulator's wgmma fragments stored where they "
           f"belong, {g['frag_bytes']} bytes into each of {g['frag_rows']} rows, {g['frag_stores']} stores a thread. "
           f"Lower: stage {stage.id}, the fragments through a shared tile of {g['pitch']}-byte rows, then "
           f"{g['row_rows']} whole rows a warp instruction, {g['row_stores']} stores a thread. The same bytes "
           "leave in half as many sector writes, each whole. The notes have what the GPU measured.")
    return Diagram(did, title, "dq-convert", stage.number, c.tostring(), cap, W, height, signature(stage))
