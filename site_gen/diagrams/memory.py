"""Memory movement: where each tile lives (regions x tiles) and how it gets from one place to the next.

Rows are the memory regions (global, L2, shared memory, registers, tensor cores); columns are the
operands in the order the two GEMMs use them (Q K S | P V O). Every arrow's mechanism and byte
count comes from facts.py, i.e. from the spec.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import engines, facts
from .diagram import Diagram
from .svg import Canvas, fmt_bytes, text_width

W = 860
REGIONS = ("global", "l2", "smem", "regs", "tensor")
REGION_LABEL = {"global": ["Global memory", "(HBM)"], "l2": ["L2 cache"], "smem": ["Shared memory", "(per CTA)"],
                "regs": ["Registers", "(per thread)"], "tensor": ["Tensor cores"]}
COLS = ("Q", "K", "S", "P", "V", "O")
COL_COLOUR = {"Q": "q", "K": "k", "S": "s", "P": "p", "V": "v", "O": "o"}
LX, CX0, COL_W = 12, 120, 122
ROW_H, GAP = 54, 56
TOP = 62
SMEM_LIMIT = 227 * 1024


@dataclass
class Cell:
    lines: list


@dataclass
class Arrow:
    src: str
    dst: str
    lines: list
    label: bool = True


LAYOUT_SHORT = {"row-major": "row-major", "xor-swizzle": "XOR swizzle", "tma-swizzle-128b": "128B swizzle",
                "mbarrier": "mbarrier"}


def _mech(fam: str, stage, multicast: bool = True) -> str:
    if fam == "wgmma-desc":
        return "wgmma descriptor"
    if fam == "tma" and multicast and facts.cluster(stage) > 1:
        return f"TMA multicast ×{facts.cluster(stage)}"
    return engines.LABEL.get(fam, fam)


def plan(stage) -> dict:
    """Per column: cells by region and arrows. Pure data, so tests can check the numbers."""
    t = facts.Tiles.of(stage)
    m, n, d = stage.block_m, stage.block_n, stage.head_dim
    mma = facts.mma_family(stage)
    frag = facts.fragment_family(stage)
    warps = facts.consumer_warps(stage)
    wgs = max(1, warps // 4)
    cols = {c: {"cells": {}, "arrows": []} for c in COLS}

    def cell(col, region, *lines):
        cols[col]["cells"][region] = Cell(list(lines))

    def arrow(col, src, dst, *lines, label=True):
        cols[col]["arrows"].append(Arrow(src, dst, list(lines), label))

    # Q: loaded once per CTA; its fragments stay in registers unless the stage reloads them every
    # iteration ([diagram] q_in_registers = false, as the mma.sync stages do for lack of registers).
    q_frags = "once" if stage.raw.get("diagram", {}).get("q_in_registers", True) else f"{fmt_bytes(t.q)} / iter"
    cell("Q", "global", f"Q tile {m}×{d}", f"bf16 · {fmt_bytes(t.q)}")
    qbuf = facts.smem_of(stage, "Q")
    qfam = facts.load_family(stage, "Q")
    if qbuf:
        arrow("Q", "global", "smem", _mech(qfam, stage, multicast=False), f"{fmt_bytes(t.q)} once")
        cell("Q", "smem", *_buf_lines(qbuf))
        if mma == "wgmma":
            arrow("Q", "smem", "tensor", _mech("wgmma-desc", stage), f"{fmt_bytes(t.q)} / iter")
        else:
            arrow("Q", "smem", "regs", _mech(frag, stage), q_frags)
            cell("Q", "regs", "Q fragments", "A operand")
            arrow("Q", "regs", "tensor", "A operand", label=False)
    else:
        arrow("Q", "global", "regs", _mech(qfam, stage), q_frags if q_frags != "once" else f"{fmt_bytes(t.q)} once")
        cell("Q", "regs", "Q fragments", "A operand")
        arrow("Q", "regs", "tensor", "A operand", label=False)

    # K and V: one tile per KV iteration.
    for x, tile in (("K", t.k), ("V", t.v)):
        cell(x, "global", f"{x} tile {n}×{d}", f"bf16 · {fmt_bytes(tile)}")
        cell(x, "l2", "L2 hit")
        arrow(x, "global", "l2", label=False)
        bufs = facts.smem_of(stage, x)
        fam = facts.load_family(stage, x)
        l2 = facts.l2_bytes_per_iter(stage, x)
        per_iter = f"{fmt_bytes(l2)} / iter" if facts.loaders(stage, x) == 1 else \
            f"{facts.loaders(stage, x)} warps × {fmt_bytes(tile)}"
        if bufs:
            mech = _mech(fam, stage)
            if fam == "ld.global":
                mech = "ld.global → st.shared"
            arrow(x, "l2", "smem", mech, per_iter)
            cell(x, "smem", *_buf_lines(bufs))
            if mma == "wgmma":
                arrow(x, "smem", "tensor", _mech("wgmma-desc", stage), f"{wgs} WG × {fmt_bytes(tile)} / iter")
            else:
                arrow(x, "smem", "regs", _mech(frag, stage), f"{warps} warps × {fmt_bytes(tile)}")
                cell(x, "regs", f"{x} fragments", "B operand")
                arrow(x, "regs", "tensor", label=False)
        else:
            arrow(x, "l2", "regs", _mech(fam, stage), per_iter)
            cell(x, "regs", f"{x} fragments", "B operand")
            arrow(x, "regs", "tensor", label=False)

    # S: accumulators of the first GEMM; P: its softmax in bf16, the A operand of the second.
    arrow("S", "tensor", "regs", "accumulators", f"{fmt_bytes(t.s)} / iter")
    cell("S", "regs", f"S {m}×{n} fp32", fmt_bytes(t.s))
    cell("P", "regs", f"P {m}×{n} bf16", fmt_bytes(t.p))
    if facts.p_in_smem(stage):
        # How P reaches shared memory: plain stores unless the stage says otherwise ([diagram] p_store).
        pfam = stage.raw.get("diagram", {}).get("p_store", "st.shared")
        arrow("P", "regs", "smem", engines.LABEL[pfam], f"{fmt_bytes(t.p)} / iter")
        pbuf = facts.smem_of(stage, "P")
        cell("P", "smem", *(_buf_lines(pbuf) if pbuf else ["P staging"]))
        arrow("P", "smem", "tensor", _mech("wgmma-desc", stage), f"{fmt_bytes(t.p)} / iter")
    else:
        how = "A from registers (RS)" if mma == "wgmma" else "A operand"
        arrow("P", "regs", "tensor", how, f"{fmt_bytes(t.p)} / iter")

    # O: accumulated in registers across the loop, written once.
    arrow("O", "tensor", "regs", "accumulators", "rescaled / iter")
    cell("O", "regs", f"O {m}×{d} fp32", fmt_bytes(t.o_acc))
    cell("O", "global", f"O tile {m}×{d}", f"bf16 · {fmt_bytes(t.o)}")
    path = facts.o_path(stage)
    if len(path) == 2:
        obuf = facts.smem_of(stage, "O")
        arrow("O", "regs", "smem", engines.LABEL.get(path[0], path[0]), f"{fmt_bytes(t.o)} once")
        cell("O", "smem", *(_buf_lines(obuf) if obuf else ["O staging"]))
        arrow("O", "smem", "global", engines.LABEL.get(path[1], path[1]), f"{fmt_bytes(t.o)} once")
    else:
        arrow("O", "regs", "global", engines.LABEL.get(path[0], path[0]), f"{fmt_bytes(t.o)} once")
    return cols


def _buf_lines(bufs) -> list[str]:
    b = bufs[0]
    shape = "×".join(str(s) for s in b.shape)
    return [f"{b.name}: {b.buffers} × {shape}" if b.buffers > 1 else f"{b.name}: {shape}",
            LAYOUT_SHORT.get(b.layout, b.layout), fmt_bytes(sum(x.bytes for x in bufs))]


def _row_y(region: str) -> float:
    return TOP + REGIONS.index(region) * (ROW_H + GAP)


def memory_diagram(stage, stages) -> Diagram:
    did = f"s{stage.id}-memory"
    cols = plan(stage)
    facts.Tiles.of(stage)
    grid_h = len(REGIONS) * ROW_H + (len(REGIONS) - 1) * GAP
    nbuf = len(stage.smem)
    height = TOP + grid_h + 40 + 18 * (nbuf + 3) + 10
    l2_iter = sum(facts.l2_bytes_per_iter(stage, x) for x in ("K", "V"))
    flops = 2 * facts.gemm_flops(stage)
    title = f"Stage {stage.id} memory movement"
    desc = (f"Where the Q, K, V, S, P and O tiles of stage {stage.id} live and how they move: "
            f"global memory, L2, shared memory, registers, tensor cores. Per KV iteration the CTA reads "
            f"{fmt_bytes(l2_iter)} of K and V from L2 for {flops / 1e6:.1f} MFLOP; shared memory holds "
            f"{fmt_bytes(stage.smem_bytes)}.")
    c = Canvas(did, W, height, title, desc)
    c.text(LX, 22, f"{stage.id} · {stage.title}: where the tiles live and how they move", size=14, weight="600")

    for r in REGIONS:
        y = _row_y(r)
        c.rect(LX - 4, y - 4, W - 2 * LX + 8, ROW_H + 8, fill="panel", stroke="grid", rx=6)
        c.lines(LX + 2, y + 18, REGION_LABEL[r], size=11.5, fill="muted", weight="600")

    # Tensor-core boxes: QKᵀ under Q K S, PV under P V O.
    ty = _row_y("tensor")
    mma = facts.mma_family(stage)
    # wgmma's N is the GEMM's output width: block_n for S, and for O the head dim unless the stage
    # says it splits the PV product into narrower instructions ([diagram] pv_n).
    pv_n = stage.raw.get("diagram", {}).get("pv_n", stage.head_dim)
    labels = {"s": f"wgmma m64n{stage.block_n}k16", "o": f"wgmma m64n{pv_n}k16"} if mma == "wgmma" \
        else {"s": "mma.sync m16n8k16", "o": "mma.sync m16n8k16"}
    for i, (label, col) in enumerate((("S = Q Kᵀ", "s"), ("O += P V", "o"))):
        op_label = labels[col]
        x = CX0 + i * 3 * COL_W + 4
        c.rect(x, ty + 3, 3 * COL_W - 8, ROW_H - 6, fill="panel2", stroke=col, sw=1.5, rx=5)
        c.text(x + 3 * COL_W / 2 - 4, ty + 23, f"{label} · {op_label}", size=12, anchor="middle", weight="600")
        c.text(x + 3 * COL_W / 2 - 4, ty + 40, f"{facts.gemm_flops(stage) / 1e6:.2f} MFLOP / iter per CTA",
               size=10.5, anchor="middle", fill="muted")

    for ci, col in enumerate(COLS):
        cx = CX0 + ci * COL_W + COL_W / 2
        data = cols[col]
        colour = COL_COLOUR[col]
        for region, cell in data["cells"].items():
            y = _row_y(region)
            w = COL_W - 12
            small = region == "l2"
            c.rect(cx - w / 2, y + 3, w, ROW_H - 6, fill="bg" if small else colour, stroke=colour,
                   opacity=None if small else 0.22, rx=4, sw=1.2)
            for li, s in enumerate(cell.lines):
                n = len(cell.lines)
                yy = y + ROW_H / 2 + 4 + (li - (n - 1) / 2) * 13.5
                c.text(cx, yy, s, size=10.5 if li else 11, anchor="middle", weight=None if li else "600",
                       fill="fg" if li == 0 else "muted")
        for a in data["arrows"]:
            _draw_arrow(c, cx, a, data["cells"], colour)
        c.text(cx, TOP - 10, col, size=13, anchor="middle", weight="700", fill=colour)

    # S -> P inside the registers: the softmax.
    ry = _row_y("regs") + ROW_H / 2
    sx = CX0 + 2 * COL_W + COL_W / 2
    c.line(sx + COL_W / 2 - 6, ry, sx + COL_W / 2 + 6, ry, stroke="p", sw=1.5, arrow=True)

    # Footer: shared-memory budget and per-iteration traffic, straight from the spec.
    y = TOP + grid_h + 28
    smem_read = sum(facts.smem_read_per_iter(stage, x) for x in ("K", "V"))
    c.text(LX, y, f"Per KV iteration (one CTA): {fmt_bytes(l2_iter)} of K/V from L2"
                  + (f" · {fmt_bytes(smem_read)} of K/V read from shared memory" if smem_read else "")
                  + f" · {flops / 1e6:.2f} MFLOP · {flops / l2_iter:.0f} FLOP per L2 byte", size=11.5)
    y += 20
    if stage.smem:
        c.text(LX, y, f"Shared memory: {fmt_bytes(stage.smem_bytes)} of {fmt_bytes(SMEM_LIMIT)} per block",
               size=11.5, weight="600")
        for b in stage.smem:
            y += 17
            shape = "×".join(str(s) for s in b.shape)
            c.text(LX + 14, y, f"{b.name}: {b.buffers} × [{shape}] {b.dtype}, {b.layout} = {fmt_bytes(b.bytes)}",
                   size=11, fill="muted", mono=True)
    else:
        c.text(LX, y, "Shared memory: none — every warp reads its operands straight from global memory",
               size=11.5, weight="600")
    cap = (f"Rows are memory regions, columns the tiles of the two GEMMs. Tile sizes from block_m = "
           f"{stage.block_m}, block_n = {stage.block_n}, head_dim = {stage.head_dim} (bf16, fp32 "
           f"accumulators); mechanisms from the schedule's engines and the shared-memory buffers of "
           f"`stage.toml`. K/V are re-read by every query tile of a head, so they are drawn as L2 hits.")
    return Diagram(did, title, "memory", stage.number, c.tostring(), cap, W, height)


def _draw_arrow(c, cx, a: Arrow, cells, colour):
    i, j = REGIONS.index(a.src), REGIONS.index(a.dst)
    down = j > i
    y1 = _row_y(a.src) + (ROW_H - 3 if down else 3)
    y2 = _row_y(a.dst) + (3 if down else ROW_H - 3)
    if a.src == "tensor":
        y1 = _row_y("tensor") + 3
    lo, hi = min(i, j), max(i, j)
    skipped = any(REGIONS[k] in cells for k in range(lo + 1, hi))
    # An arrow that would cross a tile of its own column runs along the column's right edge.
    x = cx + (COL_W / 2 - 3 if skipped else 0)
    c.line(x, y1, x, y2 + (-2 if down else 2), stroke=colour, sw=1.6, arrow=True)
    if not a.label or not a.lines:
        return
    # Label in the gap next to the destination row.
    gy = (_row_y(a.dst) - GAP / 2) if down else (_row_y(a.dst) + ROW_H + GAP / 2)
    n = len(a.lines)
    w = max(text_width(s, 10) for s in a.lines) + 8
    h = n * 12.5 + 4
    lx = min(max(x, cx - COL_W / 2 + w / 2 + 1), cx + COL_W / 2 - w / 2 - 1)
    c.rect(lx - w / 2, gy - h / 2, w, h, fill="bg", stroke=colour, rx=3, sw=0.8)
    for k, s in enumerate(a.lines):
        c.text(lx, gy - h / 2 + 12 + k * 12.5, s, size=10, anchor="middle", fill="fg" if k == 0 else "muted")
