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


def words(stage, lay: Layout) -> dict:
    """Every phrase the tree's columns write, in the words of the stage's op and of what its
    configuration reduces (the RMSNorm forward's: the sum of squares)."""
    op = model.op(stage)
    what = model.payload(stage, lay.config)
    u = op.unit
    w, n = lay.config.warps_per_row, lay.config.cluster
    st_async = getattr(lay.config, "exchange", None) == "st.async"
    out = {"heads": dict(HEADS), "what": what, "unit": u, "warp": [f"32 lane {u}s → 32 copies", f"of the warp's {u}"],
           "cta_store": [f"lane 0 of each of {w} warps", f"stores its {u}"],
           "cta_slots": f"{w} floats, {4 * w} B of shared memory",
           "cta_add": [f"every thread adds the {w}", "in the same order"],
           "cluster_put": [f"CTA q's {u} into slot [q]", f"of all {n} (st.shared::cluster)"],
           "cluster_bar": "barrier.cluster", "cluster_add": [f"each thread adds the {n}", "in rank order"],
           "sums": f"{w} warp {u}s", "csums": f"{n} CTA {u}s"}
    e = f"{lay.thread_elements:,}"
    if op.arrays > 1:
        k, a = lay.thread_accesses, lay.access_bytes
        many = f"{k} × {a} B" if k <= 8 else f"{k:,} loads of {a} B"
        out["loads"] = f"{many} of {op.reads[0]}, of {op.reads[1]}"
        out["held"] = ("streamed through registers" if not lay.held else "read from shared memory"
                       if stage.spec.row.held == "smem" else "held in registers")
    if op.prefix == "r":
        out["thread"] = [f"Σ x² of {e}", "elements, one fmaf each", "into one fp32 sum"]
        out["thread_end"] = "1 sum a thread"
        return out
    if what == "(max, sum) pair":
        out["heads"]["thread"] = ("1 · in each thread", "registers: fp32 max, exp2")
        out["heads"]["warp"] = ("2 · across the warp", "shfl.xor: 5 steps × 2 floats")
        out["thread"] = ["max and Σ exp(x − max)", f"of {e} elements, the sum", "rescaled as the max grows"]
        out["thread_end"] = "1 (max, sum) pair a thread"
        out["warp"] = ["32 lane pairs merged →", "32 copies of the warp's pair"]
        out["cta_slots"] = f"{w} pairs, {8 * w} B of shared memory"
        out["cta_add"] = [f"every thread merges the {w}", "in the same order"]
        out["cluster_add"] = [f"each thread merges the {n}", "in rank order"]
    elif what == model.STATS:  # the cross-entropy's record: (m, s) merged as the softmax's, Σ x and x[t] added
        out["heads"]["thread"] = ("1 · in each thread", "registers: fp32 max, exp2")
        out["heads"]["warp"] = ("2 · across the warp", "shfl.xor: 5 steps × 4 floats")
        out["thread"] = ["max, Σ exp(x − max), Σ x", f"of {e} elements, the sum", "rescaled as the max grows"]
        out["thread_end"] = "1 record (m, s, Σ x, x[t]) a thread"
        out["warp"] = ["32 lane records merged →", "32 copies of the warp's record"]
        out["cta_slots"] = f"{w} records, {16 * w} B of shared memory"
        out["cta_add"] = [f"every thread merges the {w}", "in the same order"]
        out["cluster_add"] = [f"each thread merges the {n}", "in rank order"]
    elif what == "max, then sum":
        out["heads"]["thread"] = ("1 · in each thread", "registers: fp32 max, exp2")
        out["heads"]["warp"] = ("2 · across the warp", "shfl.xor: 5 steps, twice")
        out["heads"]["cta"] = ("3 · across the CTA", "shared memory, twice")
        out["thread"] = [f"the max of {e} elements;", "on the next walk,", "Σ exp(x − max)"]
        out["thread_end"] = "1 max, then 1 sum"
        out["warp"] = ["32 lane maxima → 32 copies;", "then the same for the sums"]
        out["cta_store"] = [f"lane 0 of each of {w} warps", "stores its max, later its sum"]
        out["cta_slots"] = f"{w} floats, {4 * w} B, used twice"
        out["cta_add"] = [f"the max of the {w}, then", "the sum of the {w} sums".replace("{w}", str(w))]
        out["sums"], out["csums"] = f"{w} warp maxima, then sums", f"{n} CTA maxima, then sums"
        if op.prefix == "ce":  # the sums are a record (s, Σ x, x[t]) merged after the max
            out["thread"] = [f"the max of {e} elements;", "on the next walk,", "Σ exp(x − max) and Σ x"]
            out["thread_end"] = "1 max, then 1 record"
            out["cta_store"] = [f"lane 0 of each of {w} warps", "stores its max, later its record"]
            out["cta_slots"] = f"{w} floats, then {w} records"
            out["cta_add"] = [f"the max of the {w}, then", f"the {w} records merged"]
            out["sums"], out["csums"] = f"{w} warp maxima, then records", f"{n} CTA maxima, then records"
    else:  # a dot
        dot = "Σ x · w · dy" if op.reads[0] == "x" else "Σ y · dy"
        out["thread"] = [f"{dot} of {e}", "elements, one fmaf each", "into one fp32 dot"]
        out["thread_end"] = "1 dot a thread"
    if st_async:
        out["heads"]["cluster"] = ("4 · across the cluster", "DSMEM: st.async, mbarrier")
        out["cluster_put"] = [f"CTA q's {u}: st.async into", f"slot [q] of all {n}"]
        out["cluster_bar"] = "mbarrier: 4 × {n} B landed".replace("{n}", str(n))
    return out


def _x(i: int) -> float:
    return X0 + i * (COL_W + COL_GAP)


def level_text(lay: Layout, stage=None) -> str:
    """'thread → warp → CTA (32 warp sums) → cluster (4 CTA sums)' (with ``stage``: in its op's words)."""
    c = lay.config
    wd = words(stage, lay) if stage is not None else None
    parts = ["thread"]
    if "warp" in lay.levels:
        parts.append("warp")
    if "cta" in lay.levels:
        parts.append(f"CTA ({wd['sums'] if wd else f'{c.warps_per_row} warp sums'})")
    if "cluster" in lay.levels:
        parts.append(f"cluster ({wd['csums'] if wd else f'{c.cluster} CTA sums'})")
    return " → ".join(parts)


def signature(stage) -> str:
    return repr([(lay.label, lay.levels, lay.config.threads_per_row, lay.config.cluster, lay.thread_elements)
                 for lay in model.layouts(stage)] + [model.deepest(stage).label])


def reduction_diagram(stage, stages=()) -> Diagram:
    if model.op(stage).prefix != "r":
        return _reduction_other(stage)
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


MERGE = ("(m, s) ⊕ (m′, s′) = (M, s · e^(m − M) + s′ · e^(m′ − M)), M = max(m, m′): the merge at every level, "
         "bit for bit commutative, so every lane and every run gets the same pair.")


MERGE_STATS = ("(m, s, Σx, xt) ⊕ (m′, s′, Σx′, xt′) = (M, s · e^(m − M) + s′ · e^(m′ − M), Σx + Σx′, xt + xt′), "
               "M = max(m, m′): the merge at every level (xt: the target's logit, which one thread loads), bit for "
               "bit commutative, so every lane and every run gets the same record.")


def _reduction_other(stage) -> Diagram:
    """The reduction figure of the RMSNorm backward (a dot, and dw across rows), the softmax (the (max, sum)
    pair, or the max then the sum), the softmax backward (a dot) and the cross-entropy (its statistics'
    record, or the max then the sums)."""
    op = model.op(stage)
    did = f"{op.prefix}{stage.id}-reduction"
    lay = model.deepest(stage)
    wd = words(stage, lay)
    what = wd["what"]
    of = f"the {what}" if what != "max, then sum" else "the max, then the sums," if op.prefix == "ce" else \
        "the max, then the sum,"
    title = f"{op.label} stage {stage.id}: the reduction tree of {of} of a row"
    desc = (f"{of[0].upper() + of[1:]} of a {lay.label}-column bf16 row at {op.label} stage {stage.id} "
            f"({model.config_label(lay.config)}): {level_text(lay, stage)}. At each length: "
            + "; ".join(f"{x.label}: {level_text(x, stage)}" for x in model.layouts(stage)) + ".")
    c = Canvas(did, W, 560, title, desc)
    c.heading(f"{op.label} {stage.id} · {of} of a {lay.label} row (bf16), level by level")
    c.text(12, 44, model.config_label(lay.config), size=12, fill="muted")
    for i, level in enumerate(("thread", "warp", "cta", "cluster")):
        _column(c, i, level, lay, wd)
        if i:
            y = BODY + BODY_H / 2
            c.line(_x(i) - COL_GAP + 2, y, _x(i) - 3, y, stroke="stroke", sw=1.4, arrow=True)
    y = BODY + BODY_H + 30
    notes = []
    if what == "(max, sum) pair":
        notes.append(MERGE)
    elif what == model.STATS:
        notes.append(MERGE_STATS)
    elif what == "max, then sum" and op.prefix == "ce":
        notes.append("Two trees, one after the other: the max first (so that no exponential overflows), then, on the "
                     "next walk over the row, the record of the sums (Σ exp(x − max), Σ x, the target's logit); then "
                     "dlogits on a third walk.")
    elif what == "max, then sum":
        notes.append("Two trees, one after the other: the max first (so that no exponential overflows), then, on the "
                     "next walk over the row, the sum of exp(x − max); then the output on a third walk.")
    notes.append(op.output)
    wg = getattr(stage.spec, "weight_grad", None)
    if wg is not None:
        combine = {"none": "nothing left to meet", "fixed-order-partials": "fp32 partial rows that a last kernel adds "
                   "in a fixed order", "atomics": "atomics"}[wg.combine]
        notes.append(f"Across rows: dw[c] = Σ_r dy[r, c] · x̂[r, c], a sum down each column, is taken by "
                     f"{' / '.join(o.replace('cta', 'CTA') for o in wg.owners)}: {combine} ({wg.kernels} kernels"
                     + (", a persistent grid" if wg.persistent else "") + ").")
    for note in notes:
        for line in wrap(note, W - 24, 12.5):
            c.text(12, y, line, size=12.5)
            y += 18
        y += 4
    y += 4
    c.text(12, y, "At each length the figures draw (bf16):", size=12.5, weight="700")
    y += 20
    for other in model.layouts(stage):
        c.text(24, y, f"{other.label}", size=12.5, weight="700")
        line = f"{level_text(other, stage)} · {model.config_label(other.config)}"
        size = 12
        while text_width(line, size) > W - 12 - 76 and size > 11:
            size -= 0.5
        c.text(76, y, line, size=size, fill="muted")
        y += 18
    c.height = int(y + 6)
    cap = (f"Drawn for a {lay.label} row of bf16, the deepest tree of this stage; dashed: a level it does not use. "
           + " ".join(f"{x.label}: {level_text(x, stage)}." for x in model.layouts(stage)))
    return Diagram(did, title, "reduction", stage.number, c.tostring(), cap, W, c.height, "")


def _column(c, i: int, level: str, lay: Layout, wd: dict | None = None) -> None:
    x = _x(i)
    used = level in lay.levels
    colour = LEVEL_COLOUR[level] if used else "stroke"
    head, sub = (wd["heads"] if wd else HEADS)[level]
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
        if wd:
            why = why.replace("the sum", f"the {wd['unit']}") if wd["what"] != "max, then sum" else why
        for k, line in enumerate(wrap(why, COL_W - 20, 12)):
            c.text(x + COL_W / 2, BODY + BODY_H / 2 + k * 16 - 8, line, size=12, anchor="middle", fill="muted")
        return
    fn = {"thread": _thread, "warp": _warp, "cta": _cta, "cluster": _cluster}[level]
    if wd:
        fn(c, x, lay, wd)
    else:
        fn(c, x, lay)


def _lines(c, x, y, rows, size=12, fill="fg"):
    for k, s in enumerate(rows):
        while text_width(s, size) > COL_W - 16 and size > 11:
            size -= 0.5
        c.text(x + COL_W / 2, y + k * 16, s, size=size, anchor="middle", fill=fill if k else "fg",
               weight="600" if k == 0 else None)


def _thread(c, x, lay: Layout, wd: dict | None = None) -> None:
    colour = LEVEL_COLOUR["thread"]
    n = lay.thread_accesses
    shown = min(n, 8)
    cw = min(20, (COL_W - 24 - (shown - 1) * 3) / shown)
    x0 = x + (COL_W - shown * cw - (shown - 1) * 3) / 2
    for k in range(shown):
        c.rect(x0 + k * (cw + 3), BODY + 18, cw, 22, fill=colour, stroke=colour, opacity=0.35, rx=2)
    what = f"{n} × {lay.access_bytes} B" if n <= 8 else f"{n:,} loads of {lay.access_bytes} B, {shown} drawn"
    held = ["held in registers" if lay.held else "streamed through registers"]
    if wd and wd.get("loads"):
        what, held = wd["loads"], [wd["held"]]
    _lines(c, x, BODY + 58, [what, *held], fill="muted")
    _lines(c, x, BODY + 110, wd["thread"] if wd else [f"Σ x² of {lay.thread_elements:,}", "elements, one fmaf each",
                                                        "into one fp32 sum"], fill="muted")
    c.text(x + COL_W / 2, BODY + BODY_H - 16, wd["thread_end"] if wd else "1 sum a thread", size=12, anchor="middle",
           weight="600", fill=colour)


def _warp(c, x, lay: Layout, wd: dict | None = None) -> None:
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
    _lines(c, x, top + lanes * dy + 18, wd["warp"] if wd else ["32 lane sums → 32 copies", "of the warp's sum"],
           fill="muted")


def _slots(c, x, y, n, colour, label):
    cw = min(12, (COL_W - 24) / n)
    x0 = x + (COL_W - n * cw) / 2
    for k in range(n):
        c.rect(x0 + k * cw, y, cw, 16, fill=colour, stroke="bg", opacity=0.5, rx=0, sw=0.6)
    c.text(x + COL_W / 2, y + 32, label, size=12, anchor="middle", fill="muted")


def _cta(c, x, lay: Layout, wd: dict | None = None) -> None:
    colour = LEVEL_COLOUR["cta"]
    w = lay.config.warps_per_row
    _lines(c, x, BODY + 22, wd["cta_store"] if wd else [f"lane 0 of each of {w} warps", "stores its sum"],
           fill="muted")
    _slots(c, x, BODY + 54, w, colour, wd["cta_slots"] if wd else f"{w} floats, {4 * w} B of shared memory")
    c.rect(x + 16, BODY + 112, COL_W - 32, 18, fill=colour, stroke=colour, opacity=0.9, rx=3)
    c.text(x + COL_W / 2, BODY + 125, "bar.sync (__syncthreads)", size=12, anchor="middle", fill="bg", weight="600")
    _lines(c, x, BODY + 152, wd["cta_add"] if wd else [f"every thread adds the {w}", "in the same order"],
           fill="muted")


def _cluster(c, x, lay: Layout, wd: dict | None = None) -> None:
    if lay.config.cluster > 8:
        return _cluster_wide(c, x, lay, wd)
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
    _lines(c, x, y, wd["cluster_put"] if wd else ["CTA q's sum into slot [q]", f"of all {n} (st.shared::cluster)"],
           fill="muted")
    c.rect(x + 16, y + 28, COL_W - 32, 18, fill=colour, stroke=colour, opacity=0.9, rx=3)
    c.text(x + COL_W / 2, y + 41, wd["cluster_bar"] if wd else "barrier.cluster", size=12, anchor="middle", fill="bg",
           weight="600")
    _lines(c, x, y + 64, wd["cluster_add"] if wd else [f"each thread adds the {n}", "in rank order"], fill="muted")


def _cluster_wide(c, x, lay: Layout, wd: dict | None) -> None:
    """A cluster of more than 8 CTAs (16: non-portable): ranks 0-2 and the last drawn, the rest elided;
    each CTA's n slots a strip."""
    colour = LEVEL_COLOUR["cluster"]
    n = lay.config.cluster
    shown = [0, 1, 2, None, n - 1]
    bh, top = 14, BODY + 12
    sw = min(6, (COL_W - 90) / n)
    sx = x + COL_W - 10 - n * sw
    for k, q in enumerate(shown):
        by = top + k * (bh + 4)
        if q is None:
            c.text(x + 37, by + bh / 2 + 4, "⋮", size=12, anchor="middle", fill="muted")
            continue
        c.rect(x + 10, by, 54, bh, fill=colour, stroke=colour, opacity=0.25, rx=2)
        c.text(x + 37, by + bh / 2 + 4, f"CTA {q}", size=11, anchor="middle")
        for j in range(n):
            c.rect(sx + j * sw, by + 2, sw, bh - 4, fill=colour, stroke="bg", opacity=0.5, rx=0, sw=0.4)
    for k, q in enumerate(shown):
        if q is None:
            continue
        ty = top + k * (bh + 4) + bh / 2
        c.line(x + 66, top + bh / 2, sx - 2, ty, stroke=colour, sw=0.9, arrow=k == len(shown) - 1)
    y = top + len(shown) * (bh + 4) + 12
    put = wd["cluster_put"] if wd else ["CTA q's sum into slot [q]", f"of all {n} (st.shared::cluster)"]
    _lines(c, x, y, put, fill="muted")
    c.rect(x + 16, y + 28, COL_W - 32, 18, fill=colour, stroke=colour, opacity=0.9, rx=3)
    c.text(x + COL_W / 2, y + 41, wd["cluster_bar"] if wd else "barrier.cluster", size=12, anchor="middle", fill="bg",
           weight="600")
    _lines(c, x, y + 64, wd["cluster_add"] if wd else [f"each thread adds the {n}", "in rank order"], fill="muted")
