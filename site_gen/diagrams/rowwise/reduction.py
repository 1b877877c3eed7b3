"""The reduction tree of a row's sum of squares, level by level: in each thread (fp32 FMAs in
registers), across a warp (the shfl.xor butterfly), across a CTA (one float per warp in shared
memory, a barrier) and across a cluster (one float per CTA written into every CTA's shared memory
through distributed shared memory, a cluster barrier). Drawn for the row length whose tree is the
deepest at this stage (model.deepest), with the levels it does not use dashed; below, the tree at
every length the figures draw. From the spec alone ([[config]])."""

from __future__ import annotations

from ..diagram import Diagram
from ..svg import Canvas, text_width, wrap
from . import model
from .holders import LEVEL_COLOUR
from .model import Layout

W = 860
COL_W, COL_GAP, X0 = 193, 18, 12
TOP = 62
BODY = 116  # where the columns' drawings start
BODY_H = 214
STEPS = (16, 8, 4, 2, 1)  # the butterfly's shfl.xor offsets
HEADS = {"thread": ("1 · in each thread", "registers: fp32 fmaf"),
         "warp": ("2 · across the warp", "shfl.xor: 5 steps"),
         "cta": ("3 · across the CTA", "shared memory, a barrier"),
         "cluster": ("4 · across the cluster", "distributed shared memory")}


def _x(i: int) -> float:
    return X0 + i * (COL_W + COL_GAP)


def level_text(lay: Layout) -> str:
    """'thread → warp → CTA (32 warp sums) → cluster (4 CTA sums)'."""
    c = lay.config
    parts = ["thread"]
    if "warp" in lay.levels:
        parts.append("warp")
    if "cta" in lay.levels:
        parts.append(f"CTA ({c.warps_per_row} warp sums)")
    if "cluster" in lay.levels:
        parts.append(f"cluster ({c.cluster} CTA sums)")
    return " → ".join(parts)


def signature(stage) -> str:
    return repr([(lay.label, lay.levels, lay.config.threads_per_row, lay.config.cluster, lay.thread_elements)
                 for lay in model.layouts(stage)] + [model.deepest(stage).label])


def reduction_diagram(stage, stages=()) -> Diagram:
    did = f"r{stage.id}-reduction"
    lay = model.deepest(stage)
    title = f"RMSNorm stage {stage.id}: the reduction tree of a row's sum of squares"
    desc = (f"The sum of squares of a {lay.label}-column bf16 row at RMSNorm stage {stage.id} "
            f"({model.config_label(lay.config)}): {level_text(lay)}. At each length: "
            + "; ".join(f"{x.label}: {level_text(x)}" for x in model.layouts(stage)) + ".")
    c = Canvas(did, W, 520, title, desc)
    c.heading(f"RMSNorm {stage.id} · the sum of squares of a {lay.label} row, level by level")
    c.text(12, 44, model.config_label(lay.config), size=12, fill="muted")
    for i, level in enumerate(("thread", "warp", "cta", "cluster")):
        _column(c, i, level, lay)
        if i:
            y = BODY + BODY_H / 2
            c.line(_x(i) - COL_GAP + 2, y, _x(i) - 3, y, stroke="stroke", sw=1.4, arrow=True)
    y = BODY + BODY_H + 30
    rstd = ("Then every thread that writes the row takes rstd = 1 / √(Σ / cols + eps) from the same sum, added in "
            "the same order in every thread and on every run.")
    for line in wrap(rstd, W - 24, 12.5):
        c.text(12, y, line, size=12.5)
        y += 18
    y += 8
    c.text(12, y, "At each length the figures draw:", size=12.5, weight="700")
    y += 20
    for other in model.layouts(stage):
        c.text(24, y, f"{other.label}", size=12.5, weight="700")
        c.text(76, y, f"{level_text(other)} · {model.config_label(other.config)}", size=12, fill="muted")
        y += 18
    c.height = int(y + 6)
    cap = (f"Drawn for a {lay.label} row, the deepest tree of this stage; dashed: a level it does not use. "
           + " ".join(f"{x.label}: {level_text(x)}." for x in model.layouts(stage)))
    return Diagram(did, title, "reduction", stage.number, c.tostring(), cap, W, c.height, signature(stage))


def _column(c, i: int, level: str, lay: Layout) -> None:
    x = _x(i)
    used = level in lay.levels
    colour = LEVEL_COLOUR[level] if used else "stroke"
    head, sub = HEADS[level]
    c.rect(x, TOP, COL_W, 44, fill=LEVEL_COLOUR[level] if used else "bg", stroke=colour,
           opacity=0.2 if used else None, dash=None if used else "4 3", sw=1.2)
    c.text(x + 8, TOP + 18, head, size=13, weight="700", fill="fg" if used else "muted")
    c.text(x + 8, TOP + 35, sub, size=12, fill="muted")
    c.rect(x, BODY, COL_W, BODY_H, fill="bg", stroke=colour, dash=None if used else "4 3", sw=1)
    if not used:
        why = {"warp": "each lane sums a row of its own: no exchange",
               "cta": "one warp holds the row: its lanes have the sum" if lay.config.threads_per_row == 32
               else "no warp shares the row",
               "cluster": f"one CTA {'holds' if lay.held else 'takes'} the row: no cluster"}[level]
        for k, line in enumerate(wrap(why, COL_W - 20, 12)):
            c.text(x + COL_W / 2, BODY + BODY_H / 2 + k * 16 - 8, line, size=12, anchor="middle", fill="muted")
        return
    {"thread": _thread, "warp": _warp, "cta": _cta, "cluster": _cluster}[level](c, x, lay)


def _lines(c, x, y, rows, size=12, fill="fg"):
    for k, s in enumerate(rows):
        while text_width(s, size) > COL_W - 16 and size > 11:
            size -= 0.5
        c.text(x + COL_W / 2, y + k * 16, s, size=size, anchor="middle", fill=fill if k else "fg",
               weight="600" if k == 0 else None)


def _thread(c, x, lay: Layout) -> None:
    colour = LEVEL_COLOUR["thread"]
    n = lay.thread_accesses
    shown = min(n, 8)
    cw = min(20, (COL_W - 24 - (shown - 1) * 3) / shown)
    x0 = x + (COL_W - shown * cw - (shown - 1) * 3) / 2
    for k in range(shown):
        c.rect(x0 + k * (cw + 3), BODY + 18, cw, 22, fill=colour, stroke=colour, opacity=0.35, rx=2)
    what = f"{n} × {lay.access_bytes} B" if n <= 8 else f"{n:,} loads of {lay.access_bytes} B, {shown} drawn"
    _lines(c, x, BODY + 58, [what, "held in registers" if lay.held else "streamed through registers"], fill="muted")
    _lines(c, x, BODY + 110, [f"Σ x² of {lay.thread_elements:,}", "elements, one fmaf each", "into one fp32 sum"],
           fill="muted")
    c.text(x + COL_W / 2, BODY + BODY_H - 16, "1 sum a thread", size=12, anchor="middle", weight="600", fill=colour)


def _warp(c, x, lay: Layout) -> None:
    colour = LEVEL_COLOUR["warp"]
    lanes, dy = 32, 4.2
    top = BODY + 24
    dx = 28
    x0 = x + (COL_W - dx * len(STEPS)) / 2
    for s, off in enumerate(STEPS):
        c.text(x0 + s * dx + dx / 2, top - 8, str(off), size=11, anchor="middle", fill="muted")
        for lane in range(lanes):
            y1, y2 = top + lane * dy, top + (lane ^ off) * dy
            c.line(x0 + s * dx, y1, x0 + (s + 1) * dx, y2, stroke=colour, sw=0.6)
    for s in range(len(STEPS) + 1):
        for lane in range(lanes):
            c.circle(x0 + s * dx, top + lane * dy, 1.3, fill=colour, stroke=None)
    _lines(c, x, top + lanes * dy + 18, ["32 lane sums → 32 copies", "of the warp's sum"], fill="muted")


def _slots(c, x, y, n, colour, label):
    cw = min(12, (COL_W - 24) / n)
    x0 = x + (COL_W - n * cw) / 2
    for k in range(n):
        c.rect(x0 + k * cw, y, cw, 16, fill=colour, stroke="bg", opacity=0.5, rx=0, sw=0.6)
    c.text(x + COL_W / 2, y + 32, label, size=12, anchor="middle", fill="muted")


def _cta(c, x, lay: Layout) -> None:
    colour = LEVEL_COLOUR["cta"]
    w = lay.config.warps_per_row
    _lines(c, x, BODY + 22, [f"lane 0 of each of {w} warps", "stores its sum"], fill="muted")
    _slots(c, x, BODY + 54, w, colour, f"{w} floats, {4 * w} B of shared memory")
    c.rect(x + 16, BODY + 112, COL_W - 32, 18, fill=colour, stroke=colour, opacity=0.9, rx=3)
    c.text(x + COL_W / 2, BODY + 125, "bar.sync (__syncthreads)", size=12, anchor="middle", fill="bg", weight="600")
    _lines(c, x, BODY + 152, [f"every thread adds the {w}", "in the same order"], fill="muted")


def _cluster(c, x, lay: Layout) -> None:
    colour = LEVEL_COLOUR["cluster"]
    n = lay.config.cluster
    bh = min(18, (92 - (n - 1) * 4) / n)
    top = BODY + 14
    for q in range(n):
        by = top + q * (bh + 4)
        c.rect(x + 10, by, 54, bh, fill=colour, stroke=colour, opacity=0.25, rx=2)
        c.text(x + 37, by + bh / 2 + 4, f"CTA {q}", size=11, anchor="middle")
        sx = x + COL_W - 12 - n * 12
        for k in range(n):
            c.rect(sx + k * 12, by + 2, 12, bh - 4, fill=colour, stroke="bg", opacity=0.5, rx=0, sw=0.6)
    # CTA q's sum goes to slot [q] of every CTA: the arrows of CTA 0
    for r in range(n):
        ty = top + r * (bh + 4) + bh / 2
        c.line(x + 66, top + bh / 2, x + COL_W - 12 - n * 12 - 2, ty, stroke=colour, sw=0.9, arrow=r == n - 1)
    y = top + n * (bh + 4) + 12
    _lines(c, x, y, ["CTA q's sum into slot [q]", f"of all {n} (st.shared::cluster)"], fill="muted")
    c.rect(x + 16, y + 28, COL_W - 32, 18, fill=colour, stroke=colour, opacity=0.9, rx=3)
    c.text(x + COL_W / 2, y + 41, "barrier.cluster", size=12, anchor="middle", fill="bg", weight="600")
    _lines(c, x, y + 64, [f"each thread adds the {n}", "in rank order"], fill="muted")
