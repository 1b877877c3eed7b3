"""Who holds which bytes of a row: for each row length the figures draw (4k to 256k bf16), the launch
configuration the stage's launcher picks ([[config]]) and the bytes of one row a thread, a warp, a
CTA and a cluster hold, the level that holds the whole row marked; below each, where the row waits
between its sum and its output (registers, or nowhere: it is read again). From the spec alone."""

from __future__ import annotations

from ..diagram import Diagram
from ..svg import Canvas, text_width, wrap
from . import model
from .model import Layout, Op, fmt

W = 860
LEVEL_COLOUR = {"thread": "q", "warp": "o", "cta": "v", "cluster": "s"}
LEVEL_TITLE = {"thread": "a thread", "warp": "a warp", "cta": "a CTA", "cluster": "a cluster"}
BOX_X, BOX_W, BOX_GAP, BOX_H = 168, 160, 10, 60
BAND = 136


def _fit(s: str, width: float, size: float, bold: bool = False) -> float:
    while text_width(s, size, bold=bold) > width and size > 11:
        size -= 0.5
    return size


def boxes(lay: Layout, op: Op = model.OPS["rmsnorm"], smem: bool = False) -> list[tuple[str, str, str, bool]]:
    """(level, bytes line, detail line, present) for thread, warp, CTA, cluster."""
    if op.arrays > 1:
        return _boxes_of_two(lay, op, smem)
    c = lay.config
    tpr = c.threads_per_row
    if lay.held:
        thread = (f"{fmt(lay.thread_bytes)} of the row", f"{lay.thread_accesses} × 16 B, {lay.registers} registers")
    elif tpr == 1:
        thread = (f"its whole row: {fmt(lay.row_bytes)}", f"{lay.access_bytes} B a load, one at a time")
    else:
        thread = (f"{fmt(lay.thread_bytes)} of the row",
                  f"{lay.thread_accesses:,} loads of {lay.access_bytes} B, {c.unroll} in flight")
    if tpr == 1:
        warp = ("32 rows, one a lane", "a load: 32 rows apart", True)
    elif tpr == 32:
        warp = (f"the whole row: {fmt(lay.row_bytes)}", f"{32 * lay.access_bytes} B a load instruction", True)
    else:
        warp = (f"{fmt(lay.warp_bytes)} of the row", f"{32 * lay.access_bytes} B a load instruction", True)
    if c.rows_per_cta > 1:
        cta = (f"{c.rows_per_cta} rows: {fmt(lay.cta_bytes)}", f"{c.cta_threads} threads", True)
    elif c.cluster > 1:
        cta = (f"a slice: {fmt(lay.cta_bytes)}", f"1/{c.cluster} of the row, {tpr} threads", True)
    else:
        cta = (f"the whole row: {fmt(lay.row_bytes)}", f"{tpr} threads, {c.warps_per_row} warps", True)
    if c.cluster > 1:
        cluster = (f"the whole row: {fmt(lay.row_bytes)}", f"{c.cluster} CTAs on {c.cluster} SMs", True)
    else:
        cluster = ("no cluster", "a row is one CTA's or less", False)
    return [("thread", *thread, True), ("warp", *warp), ("cta", *cta), ("cluster", *cluster)]


def _boxes_of_two(lay: Layout, op: Op, smem: bool = False) -> list[tuple[str, str, str, bool]]:
    """boxes() where a row is read from two arrays (x and dy; y and dy): the bytes of each, as many;
    ``smem``: the held rows are staged in shared memory, not registers."""
    c = lay.config
    tpr = c.threads_per_row
    a, b = op.reads
    if lay.held:
        k = lay.thread_accesses
        thread = (f"{fmt(lay.thread_bytes)} of {a}, of {b}",
                  f"{k} + {k} × 16 B in shared memory" if smem else f"{k} + {k} × 16 B, {2 * lay.registers} registers")
    elif tpr == 1:
        thread = (f"its whole rows: 2 × {fmt(lay.row_bytes)}", f"{lay.access_bytes} B a load, one at a time")
    else:
        n = lay.thread_accesses
        thread = (f"{fmt(lay.thread_bytes)} of {a}, of {b}",
                  f"2 × {n:,} load{'s' if n != 1 else ''} of {lay.access_bytes} B")
    if tpr == 1:
        warp = ("32 rows, one a lane", "a load: 32 rows apart", True)
    elif tpr == 32:
        warp = (f"whole rows: 2 × {fmt(lay.row_bytes)}", f"{32 * lay.access_bytes} B a load instruction", True)
    else:
        warp = (f"{fmt(lay.warp_bytes)} of {a}, of {b}", f"{32 * lay.access_bytes} B a load instruction", True)
    if c.rows_per_cta > 1:
        cta = (f"{c.rows_per_cta} rows: 2 × {fmt(lay.cta_bytes)}", f"{c.cta_threads} threads", True)
    elif c.cluster > 1:
        cta = (f"slices: 2 × {fmt(lay.cta_bytes)}", f"1/{c.cluster} of the rows, {tpr} threads", True)
    else:
        cta = (f"whole rows: 2 × {fmt(lay.row_bytes)}", f"{tpr} threads, {c.warps_per_row} warps", True)
    if c.cluster > 1:
        cluster = (f"whole rows: 2 × {fmt(lay.row_bytes)}", f"{c.cluster} CTAs on {c.cluster} SMs", True)
    else:
        cluster = ("no cluster", "a row is one CTA's or less", False)
    return [("thread", *thread, True), ("warp", *warp), ("cta", *cta), ("cluster", *cluster)]


def _walks(op: Op, n: int) -> str:
    """'for the dot, then for dx' (the walks a streamed row makes)."""
    walks = op.walks.get(n) or tuple(f"walk {k + 1}" for k in range(n))
    return ", then ".join(f"for {w}" for w in walks)


def where_of(lay: Layout, op: Op, stage=None) -> str:
    """Where the row waits between its uses, in the words of the op (the RMSNorm forward's: where())."""
    if op.prefix == "r":
        return where(lay)
    rows = f"the rows of {op.inputs}" if op.arrays > 1 else "the row"
    n = lay.reads
    times = {1: "once", 2: "twice", 3: "three times"}.get(n, f"{n} times")
    if lay.held:
        if stage is not None and stage.spec.row.held == "smem":
            return (f"{rows.capitalize()} copied into shared memory a row ahead (cp.async, two buffers), read from "
                    f"there for the {op.unit} and for {op.writes}: each element leaves HBM once.")
        each = " of each" if op.arrays > 1 else ""
        return (f"{rows.capitalize()} held in registers from the load to {op.writes} ({fmt(lay.in_flight)}{each} a "
                "thread, all loads in flight at once): each element is read once.")
    again = dict(op.again).get(lay.config.kernel, "the later walks from L1 or L2 if the row is still there, else HBM")
    return (f"{rows.capitalize()} streamed {_walks(op, n)} ({again}): each element is read {times}.")


def where(lay: Layout) -> str:
    if lay.held:
        return (f"Held in registers from its load to its output ({fmt(lay.in_flight)} a thread, all loads in flight "
                "at once): each element is read once.")
    if lay.config.threads_per_row == 1:
        return ("Streamed one element at a time, then read again for the output (from L1 or L2 if still there, "
                "else HBM): each element is read twice.")
    return (f"Streamed, {fmt(lay.in_flight)} in flight a thread, then read again for the output (from L2 if it "
            "is still there, else HBM): each element is read twice.")


def signature(stage) -> str:
    return repr([(lay.label, lay.config) for lay in model.layouts(stage)] + [stage.spec.row.vector_bytes])


def holders_diagram(stage, stages=()) -> Diagram:
    op = model.op(stage)
    if op.prefix != "r":
        return _holders_other(stage, op)
    did = f"r{stage.id}-holders"
    lays = model.layouts(stage)
    title = f"RMSNorm stage {stage.id}: who holds which bytes of a row"
    desc = (f"For rows of {', '.join(lay.label for lay in lays)} bf16 columns: the configuration RMSNorm stage "
            f"{stage.id}'s launcher picks, and the bytes of one row that a thread, a warp, a CTA and a cluster "
            "hold; " + "; ".join(f"{lay.label}: {model.config_label(lay.config)}, read {lay.reads}×" for lay in lays)
            + ".")
    c = Canvas(did, W, 80 + BAND * len(lays), title, desc)
    c.heading(f"RMSNorm {stage.id} · who holds which bytes of a row", " (bf16, as the launcher deals it out)")
    c.text(12, 44, "Tinted: the level that holds (or, streamed, owns) whole rows; dashed: a level the row does not "
                   "reach.", size=12, fill="muted")
    y = 62
    for lay in lays:
        _band(c, lay, y)
        y += BAND
        c.line(12, y - 8, W - 12, y - 8, stroke="grid", sw=1)
    c.height = int(y)
    cap = ("Bytes of one bf16 row (2 B a column) at each level, from the stage's `[[config]]`: the launcher takes "
           "the first configuration that holds the row. " + " ".join(
               f"{lay.label}: {model.config_label(lay.config)}." for lay in lays))
    return Diagram(did, title, "holders", stage.number, c.tostring(), cap, W, c.height, signature(stage))


def _holders_other(stage, op: Op) -> Diagram:
    """The holders figure of the RMSNorm backward, the softmax and the softmax backward."""
    did = f"{op.prefix}{stage.id}-holders"
    lays = model.layouts(stage)
    each = f"a row of {op.inputs}" if op.arrays > 1 else "a row"
    title = f"{op.label} stage {stage.id}: who holds which bytes of {each}"
    desc = (f"For rows of {', '.join(lay.label for lay in lays)} bf16 columns: the configuration {op.label} stage "
            f"{stage.id}'s launcher picks, and the bytes of {each} that a thread, a warp, a CTA and a cluster "
            "hold; " + "; ".join(f"{lay.label}: {model.config_label(lay.config)}, {op.inputs} read {lay.reads}×"
                                 for lay in lays) + ".")
    c = Canvas(did, W, 80 + BAND * len(lays), title, desc)
    c.heading(f"{op.label} {stage.id} · who holds which bytes of {each}", " (bf16, as the launcher deals it out)")
    note = ("Tinted: the level that holds (or, streamed, owns) whole rows; dashed: a level the row does not reach."
            + (f" 2 ×: a row of {op.reads[0]} and one of {op.reads[1]}." if op.arrays > 1 else ""))
    c.text(12, 44, note, size=_fit(note, W - 24, 12), fill="muted")
    y = 62
    for lay in lays:
        _band(c, lay, y, op, stage)
        y += BAND
        c.line(12, y - 8, W - 12, y - 8, stroke="grid", sw=1)
    c.height = int(y)
    cap = (f"Bytes of {'one bf16 row of each of ' + op.inputs if op.arrays > 1 else 'one bf16 row'} (2 B a column) "
           f"at each level, for rows of {model.lengths_text(stage)} columns, from the stage's `[[config]]`: the launcher "
           "takes the first configuration that holds the row. " + " ".join(
               f"{lay.label}: {model.config_label(lay.config)}." for lay in lays))
    if any(model.persistent(stage, lay.config) for lay in lays):
        cap += (" Where the row is held the grid is persistent: as many CTAs as fit on the GPU at once, each taking "
                "row after row (so that its threads keep their columns' sums of dw).")
    return Diagram(did, title, "holders", stage.number, c.tostring(), cap, W, c.height, "")


def _band(c, lay: Layout, y: float, op: Op | None = None, stage=None) -> None:
    owner = lay.config.owner
    c.text(12, y + 24, lay.label, size=20, weight="700")
    c.text(12, y + 44, f"{'2 × ' if op is not None and op.arrays > 1 else ''}{fmt(lay.row_bytes)} a row", size=12,
           fill="muted")
    c.text(12, y + 60, f"{lay.rows:,} rows,", size=12, fill="muted")
    if stage is not None and model.persistent(stage, lay.config):
        c.text(12, y + 76, "a persistent grid", size=12, fill="muted")
    else:
        c.text(12, y + 76, f"{lay.ctas:,} CTAs", size=12, fill="muted")
    label = model.config_label(lay.config)
    c.text(BOX_X, y + 12, label, size=_fit(label, W - 12 - BOX_X, 13, True), weight="700")
    top = y + 22
    smem = stage is not None and stage.spec.row.held == "smem"
    for i, (level, line1, line2, present) in enumerate(boxes(lay) if op is None else boxes(lay, op, smem)):
        bx = BOX_X + i * (BOX_W + BOX_GAP)
        colour = LEVEL_COLOUR[level]
        if level == owner:
            c.rect(bx, top, BOX_W, BOX_H, fill=colour, stroke=colour, opacity=0.2, sw=2)
        else:
            c.rect(bx, top, BOX_W, BOX_H, fill="bg", stroke=colour if present else "stroke", sw=1.2,
                   dash=None if present else "4 3")
        rows = lay.config.rows_per_cta if level == "cta" else 1
        verb = "holds" if lay.held else "owns"  # a streamed row passes through; it is not held
        head = LEVEL_TITLE[level] + ((f" — {verb} the row" if rows == 1 else f" — {verb} {rows} rows")
                                     if level == owner else "")
        c.text(bx + 8, top + 16, head, size=_fit(head, BOX_W - 14, 12, True), weight="700",
               fill="fg" if level == owner else colour if present else "muted")
        c.text(bx + 8, top + 34, line1, size=_fit(line1, BOX_W - 14, 12.5, True), weight="600",
               fill="fg" if present else "muted")
        c.text(bx + 8, top + 51, line2, size=_fit(line2, BOX_W - 14, 12), fill="muted")
    for k, line in enumerate(wrap(where(lay) if op is None else where_of(lay, op, stage), W - 12 - BOX_X, 12)[:2]):
        c.text(BOX_X, top + BOX_H + 18 + k * 16, line, size=12)
