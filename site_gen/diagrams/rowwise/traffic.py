"""Bytes per element, and where that puts the stage on the H200's roofline. What the stage moves is
known from its spec: each bf16 element of x is read once where the row is held in registers and
twice where it is streamed (the second read from L2 if the row is still there, else from HBM), and
its output is written once; the benchmark's GB/s counts one read and one write (4 B an element),
so a row read twice from HBM can reach at most 4/6 of the copy's GB/s. The roofline takes the
H200's numbers of site_gen/diagrams/h200.py (docs/hopper.md): the copy's bandwidth and the FP32
FMA peak. Nothing here is measured; where the stage lands under its roof is the benchmark's."""

from __future__ import annotations

import math

from .. import h200
from ..diagram import Diagram
from ..svg import Canvas, text_width, wrap
from . import model
from .model import ELEMENT, FLOPS_PER_ELEMENT, Layout, Op

W = 860
BAR_X, BAR_UNIT = 96, 44  # px per byte of an element
COPY_TBS = h200.HBM_TBS_MEASURED  # a device-to-device copy
FMA_TFLOPS = 2 * h200.fma_per_s() / 1e12  # every SM's FP32 FMAs, 2 FLOP each


def moved(lay: Layout) -> tuple[int, int]:
    """(fewest, most) bytes HBM moves per element: the second read of a streamed row may come from L2."""
    return 2 * ELEMENT, (lay.reads + 1) * ELEMENT


def bound(lay: Layout) -> tuple[float, float]:
    """(lowest, highest) fraction of the copy's GB/s the stage can reach at this length: counted bytes
    (4 an element) over the bytes HBM moves."""
    lo, hi = moved(lay)
    return 2 * ELEMENT / hi, 2 * ELEMENT / lo


def moved_of(lay: Layout, op: Op) -> tuple[int, int]:
    """moved() for any op: (fewest, most) bytes HBM moves per element, each array read lay.reads times
    (the later reads possibly from L2) and the output written once."""
    return op.streams * ELEMENT, (op.arrays * lay.reads + 1) * ELEMENT


def bound_of(lay: Layout, op: Op) -> tuple[float, float]:
    """bound() for any op: the counted bytes over the most and the fewest HBM moves."""
    lo, hi = moved_of(lay, op)
    counted = op.streams * ELEMENT
    return counted / hi, counted / lo


def signature(stage) -> str:
    return repr([(lay.label, lay.reads) for lay in model.layouts(stage)])


def traffic_diagram(stage, stages=()) -> Diagram:
    if model.op(stage).prefix != "r":
        return _traffic_other(stage, model.op(stage))
    did = f"r{stage.id}-traffic"
    lays = model.layouts(stage)
    title = f"RMSNorm stage {stage.id}: bytes per element and the roofline"
    desc = (f"Bytes of memory traffic per bf16 element at RMSNorm stage {stage.id}, for rows of "
            + ", ".join(f"{lay.label} (x read {lay.reads}×)" for lay in lays)
            + f"; and its place on the roofline: {FLOPS_PER_ELEMENT} FLOP per element against the copy's "
            f"{COPY_TBS:.2f} TB/s and the FP32 peak of {FMA_TFLOPS:.0f} TFLOP/s.")
    c = Canvas(did, W, 420, title, desc)
    c.heading(f"RMSNorm {stage.id} · bytes per element, and the roofline", " (bf16)")
    y = _bars(c, lays, 58)
    y = _roofline(c, stage, lays, y + 22)
    c.height = int(y + 8)
    reads = sorted({lay.reads for lay in lays})
    cap = (f"Per bf16 element: {ELEMENT} B of x read "
           + ("once (the row held in registers)" if reads == [1] else "twice (the row streamed, read again for the "
              "output)" if reads == [2] else "once where the row is held, twice where it is streamed")
           + f" and {ELEMENT} B written. The benchmark's GB/s counts {2 * ELEMENT} B an element, so a row read "
           "twice from HBM reaches at most 0.67× the copy. The weight (the same for every row) is read from L2 "
           "and not counted. The roofline's roofs are the H200's copy bandwidth and FP32 peak "
           "([the H200 in numbers](../hopper.md)); where the stage lands under them is not measured yet.")
    return Diagram(did, title, "traffic", stage.number, c.tostring(), cap, W, c.height, signature(stage))


def _bars(c, lays: list[Layout], y: float) -> float:
    c.text(12, y, "Bytes that cross the memory bus per element of the row", size=13, weight="700")
    y += 16
    legend = [("q", "read x (HBM)"), ("accent", "read x again (L2 if the row is still there, else HBM)"),
              ("v", "write out (HBM)")]
    c.legend(12, y + 10, legend, size=12)
    y += 30
    scale_end = BAR_X + 6 * BAR_UNIT
    for b in range(7):
        xx = BAR_X + b * BAR_UNIT
        c.line(xx, y - 4, xx, y + len(lays) * 30, stroke="grid", sw=0.8)
        c.text(xx, y + len(lays) * 30 + 14, f"{b} B", size=12, anchor="middle", fill="muted")
    for lay in lays:
        c.text(12, y + 15, lay.label, size=13, weight="700")
        x = BAR_X
        parts = [("q", ELEMENT, None)] + ([("accent", ELEMENT, "3 2")] if lay.reads == 2 else []) + [("v", ELEMENT, None)]
        for colour, n, dash in parts:
            c.rect(x, y + 2, n * BAR_UNIT - 2, 18, fill=colour, stroke=colour, opacity=0.35 if dash else 0.75, rx=2,
                   dash=dash)
            x += n * BAR_UNIT
        lo, hi = bound(lay)
        what = ("read once: HBM moves what GB/s counts, ≤ 1.00× the copy" if lay.reads == 1 else
                f"read twice: {moved(lay)[0]}–{moved(lay)[1]} B moved for {2 * ELEMENT} counted, "
                f"≤ {lo:.2f}–{hi:.2f}× the copy")
        c.text(scale_end + 18, y + 15, what, size=12, fill="fg")
        y += 30
    return y + 20


def _roofline(c, stage, lays: list[Layout], y: float) -> float:
    c.text(12, y, "Where that puts it on the H200's roofline", size=13, weight="700")
    y += 12
    x0, x1 = 96, 520
    top, bottom = y + 12, y + 200
    lx0, lx1 = -1.0, 3.0  # log10 of FLOP per byte: 0.1 .. 1000
    ly0, ly1 = -1.0, 2.0  # log10 of TFLOP/s: 0.1 .. 100

    def px(v):
        return x0 + (math.log10(v) - lx0) / (lx1 - lx0) * (x1 - x0)

    def py(v):
        return bottom - (math.log10(v) - ly0) / (ly1 - ly0) * (bottom - top)

    for e in range(int(lx0), int(lx1) + 1):
        c.line(px(10 ** e), top, px(10 ** e), bottom, stroke="grid", sw=0.8)
        c.text(px(10 ** e), bottom + 20, f"{10 ** e:g}", size=12, anchor="middle", fill="muted")
    for e in range(int(ly0), int(ly1) + 1):
        c.line(x0, py(10 ** e), x1, py(10 ** e), stroke="grid", sw=0.8)
        c.text(x0 - 6, py(10 ** e) + 4, f"{10 ** e:g}", size=12, anchor="end", fill="muted")
    c.text((x0 + x1) / 2, bottom + 38, "FLOP per byte of HBM traffic (log)", size=12, anchor="middle", fill="muted")
    c.text(24, (top + bottom) / 2, "TFLOP/s (log)", size=12, anchor="middle", fill="muted", rotate=-90)
    ridge = FMA_TFLOPS / COPY_TBS
    lo = max(10 ** lx0, 10 ** ly0 / COPY_TBS)
    c.path([(px(lo), py(COPY_TBS * lo)), (px(ridge), py(FMA_TFLOPS)), (px(10 ** lx1), py(FMA_TFLOPS))],
           stroke="fg", sw=2)
    c.text(px(2.5), py(COPY_TBS * 2.5) - 10, f"copy: {COPY_TBS:.2f} TB/s", size=12, fill="fg", weight="600",
           rotate=-math.degrees(math.atan((bottom - top) / (ly1 - ly0) / ((x1 - x0) / (lx1 - lx0)))))
    c.text(px(ridge) + 8, py(FMA_TFLOPS) - 8, f"FP32 FMA: {FMA_TFLOPS:.0f} TFLOP/s", size=12, fill="fg",
           weight="600")
    c.line(px(ridge), py(FMA_TFLOPS), px(ridge), bottom, stroke="stroke", sw=1, dash="3 3")
    points = sorted({moved(lay)[1] for lay in lays} | {moved(lay)[0] for lay in lays})
    for b in points:
        ai = FLOPS_PER_ELEMENT / b
        c.circle(px(ai), py(COPY_TBS * ai), 5, fill="bg", stroke="bar", sw=2)
        if b > 2 * ELEMENT:  # the left point: its label above and left, the other's below and right
            c.text(px(ai) - 8, py(COPY_TBS * ai) - 8, f"{b} B", size=12, anchor="end", fill="bar", weight="600")
        else:
            c.text(px(ai) + 8, py(COPY_TBS * ai) + 16, f"{b} B", size=12, fill="bar", weight="600")
    # the key, right of the plot
    kx = x1 + 24
    ky = top + 6
    lines = [(f"RMSNorm: {FLOPS_PER_ELEMENT} FLOP an element (x², its sum, · rstd, · weight)", "fg", "600")]
    reads = {lay.reads for lay in lays}
    least = {frozenset({1}): "read once", frozenset({2}): "the second read from L2"}.get(
        frozenset(reads), "read once, or again from L2")
    for b in points:
        ai = FLOPS_PER_ELEMENT / b
        which = "read twice from HBM" if b > 2 * ELEMENT else least
        lines.append((f"{b} B, {which}: {ai:.2f} FLOP/B", "bar", "600"))
        lines.append((f"  at most {COPY_TBS * ai:.2f} TFLOP/s, on the copy's roof", "muted", None))
    best = max(FLOPS_PER_ELEMENT / b for b in points)
    lines += [(f"The ridge, {ridge:.1f} FLOP/B, is {ridge / best:.0f}× further right:", "fg", None),
              ("memory-bound at every length.", "fg", None),
              ("The circles are bounds, not measurements.", "muted", None)]
    for text, fill, weight in lines:
        size = 12
        while text_width(text, size, bold=weight == "600") > W - 12 - kx and size > 11:
            size -= 0.5
        c.text(kx, ky, text, size=size, fill=fill, weight=weight)
        ky += 18
    return bottom + 44


TIMES = {1: "once", 2: "twice", 3: "three times"}
ARRAY_COLOURS = ("q", "s")  # the first array read, the second (dy)


def _traffic_other(stage, op: Op) -> Diagram:
    """The traffic figure of the RMSNorm backward, the softmax and the softmax backward: op.streams streams
    of 2 B an element counted ({inputs} read once, {writes} written once), and what a row read more than
    once adds."""
    did = f"{op.prefix}{stage.id}-traffic"
    lays = model.layouts(stage)
    counted = op.streams * ELEMENT
    title = f"{op.label} stage {stage.id}: bytes per element and the roofline"
    streams = (f"{op.streams} streams of {ELEMENT} B an element: {op.inputs} read, {op.writes} written "
               f"({counted} B, what GB/s counts)")
    desc = (f"Bytes of memory traffic per bf16 element at {op.label} stage {stage.id}: {streams}; for rows of "
            + ", ".join(f"{lay.label} ({op.inputs} read {lay.reads}×)" for lay in lays)
            + f"; and its place on the roofline: {op.flops} FLOP per element against the copy's "
            f"{COPY_TBS:.2f} TB/s and the FP32 peak of {FMA_TFLOPS:.0f} TFLOP/s.")
    c = Canvas(did, W, 460, title, desc)
    c.heading(f"{op.label} {stage.id} · bytes per element, and the roofline", " (bf16, rows of 4k to 256k)")
    c.text(12, 44, streams[0].upper() + streams[1:] + ".", size=12.5, weight="600")
    y = _bars_other(c, op, lays, 72)
    y = _roofline_other(c, op, lays, y + 22)
    c.height = int(y + 8)
    reads = sorted({lay.reads for lay in lays})
    said = " or ".join(TIMES.get(r, f"{r} times") for r in reads)
    cap = (f"Per bf16 element: {ELEMENT} B of each of {op.inputs} read {said} and {ELEMENT} B of {op.writes} written"
           if op.arrays > 1 else
           f"Per bf16 element: {ELEMENT} B of {op.inputs} read {said} and {ELEMENT} B of {op.writes} written")
    cap += (f" ({'once where the row is held, more where it is streamed' if len(reads) > 1 else 'at every length'}). "
            f"The benchmark's GB/s counts {counted} B an element, {op.streams} streams of {ELEMENT} B; a row read "
            "again from HBM moves more than it is credited for. ")
    if op.uncounted:
        cap += op.uncounted + " "
    cap += ("The roofline's roofs are the H200's copy bandwidth and FP32 peak ([the H200 in numbers](../hopper.md)); "
            "where the stage lands under them is its benchmark's.")
    return Diagram(did, title, "traffic", stage.number, c.tostring(), cap, W, c.height, "")


def _bars_other(c, op: Op, lays: list[Layout], y: float) -> float:
    c.text(12, y, "Bytes that cross the memory bus per element of the row", size=13, weight="700")
    y += 16
    legend = [(colour, f"read {name} (HBM)") for colour, name in zip(ARRAY_COLOURS, op.reads)]
    if any(lay.reads > 1 for lay in lays):
        legend.append(("accent", "read again (L2 if still there, else HBM)"))
    legend.append(("v", f"write {op.writes} (HBM)"))
    c.legend(12, y + 10, legend, size=12)
    y += 30
    most = max([6] + [moved_of(lay, op)[1] for lay in lays])
    span = 6 * BAR_UNIT
    unit = span / most
    step = 1 if most <= 8 else 2
    for b in range(0, most + 1, step):
        xx = BAR_X + b * unit
        c.line(xx, y - 4, xx, y + len(lays) * 30, stroke="grid", sw=0.8)
        c.text(xx, y + len(lays) * 30 + 14, f"{b} B", size=12, anchor="middle", fill="muted")
    for lay in lays:
        c.text(12, y + 15, lay.label, size=13, weight="700")
        x = BAR_X
        parts = [(ARRAY_COLOURS[i], None) for i in range(op.arrays)]
        parts += [("accent", "3 2")] * (op.arrays * (lay.reads - 1)) + [("v", None)]
        for colour, dash in parts:
            c.rect(x, y + 2, ELEMENT * unit - 2, 18, fill=colour, stroke=colour, opacity=0.35 if dash else 0.75,
                   rx=2, dash=dash)
            x += ELEMENT * unit
        lo, hi = bound_of(lay, op)
        lo_b, hi_b = moved_of(lay, op)
        what = (f"read once: HBM moves the {lo_b} B GB/s counts, ≤ 1.00× the copy" if lay.reads == 1 else
                f"read {TIMES.get(lay.reads, f'{lay.reads}×')}: {lo_b}–{hi_b} B moved for {lo_b} counted, "
                f"≤ {lo:.2f}–{hi:.2f}× the copy")
        size = 12
        while text_width(what, size) > W - 12 - (BAR_X + span + 18) and size > 11:
            size -= 0.5
        c.text(BAR_X + span + 18, y + 15, what, size=size, fill="fg")
        y += 30
    return y + 20


def _roofline_other(c, op: Op, lays: list[Layout], y: float) -> float:
    c.text(12, y, "Where that puts it on the H200's roofline", size=13, weight="700")
    y += 12
    x0, x1 = 96, 520
    top, bottom = y + 12, y + 200
    lx0, lx1 = -1.0, 3.0
    ly0, ly1 = -1.0, 2.0

    def px(v):
        return x0 + (math.log10(v) - lx0) / (lx1 - lx0) * (x1 - x0)

    def py(v):
        return bottom - (math.log10(v) - ly0) / (ly1 - ly0) * (bottom - top)

    for e in range(int(lx0), int(lx1) + 1):
        c.line(px(10 ** e), top, px(10 ** e), bottom, stroke="grid", sw=0.8)
        c.text(px(10 ** e), bottom + 20, f"{10 ** e:g}", size=12, anchor="middle", fill="muted")
    for e in range(int(ly0), int(ly1) + 1):
        c.line(x0, py(10 ** e), x1, py(10 ** e), stroke="grid", sw=0.8)
        c.text(x0 - 6, py(10 ** e) + 4, f"{10 ** e:g}", size=12, anchor="end", fill="muted")
    c.text((x0 + x1) / 2, bottom + 38, "FLOP per byte of HBM traffic (log)", size=12, anchor="middle", fill="muted")
    c.text(24, (top + bottom) / 2, "TFLOP/s (log)", size=12, anchor="middle", fill="muted", rotate=-90)
    ridge = FMA_TFLOPS / COPY_TBS
    lo = max(10 ** lx0, 10 ** ly0 / COPY_TBS)
    c.path([(px(lo), py(COPY_TBS * lo)), (px(ridge), py(FMA_TFLOPS)), (px(10 ** lx1), py(FMA_TFLOPS))],
           stroke="fg", sw=2)
    c.text(px(2.5), py(COPY_TBS * 2.5) - 10, f"copy: {COPY_TBS:.2f} TB/s", size=12, fill="fg", weight="600",
           rotate=-math.degrees(math.atan((bottom - top) / (ly1 - ly0) / ((x1 - x0) / (lx1 - lx0)))))
    c.text(px(ridge) + 8, py(FMA_TFLOPS) - 8, f"FP32 FMA: {FMA_TFLOPS:.0f} TFLOP/s", size=12, fill="fg",
           weight="600")
    c.line(px(ridge), py(FMA_TFLOPS), px(ridge), bottom, stroke="stroke", sw=1, dash="3 3")
    counted = op.streams * ELEMENT
    points = sorted({moved_of(lay, op)[1] for lay in lays} | {counted})
    for k, b in enumerate(points):
        ai = op.flops / b
        c.circle(px(ai), py(COPY_TBS * ai), 5, fill="bg", stroke="bar", sw=2)
        if b == counted:
            c.text(px(ai) + 8, py(COPY_TBS * ai) + 16, f"{b} B", size=12, fill="bar", weight="600")
        else:
            c.text(px(ai) - 8, py(COPY_TBS * ai) - 8 - 14 * (len(points) - 1 - k), f"{b} B", size=12, anchor="end",
                   fill="bar", weight="600")
    kx = x1 + 24
    ky = top + 6
    lines = [(f"{op.label}: {op.flops} FLOP an element", "fg", "600")]
    lines += [(s, "muted", None) for s in wrap(f"({op.flops_text})", W - 12 - kx, 12)]
    reads = {lay.reads for lay in lays}
    for b in points:
        ai = op.flops / b
        if b == counted:
            which = "read once" if reads == {1} else "the later reads from L2" if 1 not in reads else \
                "read once, or again from L2"
        else:
            n = (b // ELEMENT - 1) // op.arrays
            which = f"read {TIMES.get(n, f'{n}×')} from HBM"
        lines.append((f"{b} B, {which}: {ai:.2f} FLOP/B", "bar", "600"))
        lines.append((f"  at most {COPY_TBS * ai:.2f} TFLOP/s, on the copy's roof", "muted", None))
    best = max(op.flops / b for b in points)
    lines += [(f"The ridge, {ridge:.1f} FLOP/B, is {ridge / best:.0f}× further right:", "fg", None),
              ("memory-bound at every length.", "fg", None),
              ("The circles are bounds, not measurements.", "muted", None)]
    for text, fill, weight in lines:
        size = 12
        while text_width(text, size, bold=weight == "600") > W - 12 - kx and size > 11:
            size -= 0.5
        c.text(kx, ky, text, size=size, fill=fill, weight=weight)
        ky += 18
    return max(bottom + 44, ky + 4)
