"""The measured timeline: what the warps of one SM did in a trace record's window, in real time.

One lane per warp shown (trace_lanes.py picks them), grouped by the CTA's place on the SM; solid
bars are work, hatched bars are waits (a stall is never drawn like work), a tick with a triangle
is an instant (a copy issued); under a consumer's lane, the wgmma it has in flight, from issue to
the wait that retired it. Every bar carries a tooltip (<title>) with its event, tile, K/V step,
start and duration. Roles are told apart by their labels and lane fills, not by colour alone.

A backward record (Act V) is drawn the same way in the backward's words and colours (``_Words``):
its query blocks for K/V steps, its events' names, the colours of the backward's schedule figure
(diagrams/timeline.py's BACKWARD_COLOUR) where a kind is in both, and its four GEMMs in flight.
"""

from __future__ import annotations

from hopattn.records.traces import head_dim_tag, record_name

from . import trace_lanes
from .diagram import Diagram
from .svg import Canvas, color, num, text_width
from .timeline import tick_step

W = 860
X0, X1 = 196, 846
TRACK_H = 22  # a warp's own events
SPAN_H = 6  # one of the two in-flight tracks (QKᵀ above, PV below)
LANE_GAP = 10
FONT = 13  # the smallest text: 12 px or more at the column's width (and at timeline_section.MIN_WIDTH)

COLOUR = {"load_q": "q", "load_k": "k", "load_v": "v", "load_kv": "k", "wait_q": "q", "wait_k": "k",
          "wait_v": "v", "wait_kv": "k", "wait_empty": "stroke", "wait_turn": "fg", "wait_tile": "accent",
          "qk": "s", "wait_qk": "s", "softmax": "p", "rescale": "accent", "pv": "o", "wait_pv": "o",
          "epilogue": "bar", "store": "store"}
NAME = {"load_q": "load Q", "load_k": "load K", "load_v": "load V", "load_kv": "load K and V",
        "wait_q": "wait for Q", "wait_k": "wait for K", "wait_v": "wait for V", "wait_kv": "wait for K/V",
        "wait_empty": "wait for a free buffer", "wait_turn": "wait for its turn",
        "wait_tile": "wait for the next tile id", "qk": "S = QKᵀ", "wait_qk": "wait for QKᵀ to retire",
        "softmax": "softmax", "rescale": "rescale O, pack P", "pv": "O += PV", "wait_pv": "wait for PV to retire",
        "epilogue": "epilogue", "store": "store O"}
SHORT = {"qk": "QK", "pv": "PV", "softmax": "softmax", "epilogue": "epilogue", "load_kv": "K/V", "load_q": "Q",
         "load_k": "K", "load_v": "V", "rescale": "rescale"}
# The backward's (its GEMMs in flight by their span names too: qk is Sᵀ's, dp dPᵀ's).
BACKWARD_COLOUR = {"load_q": "q", "load_do": "o", "load_kv": "k", "wait_kv": "k", "wait_empty": "stroke",
                   "wait_qdo": "q", "qk": "s", "wait_qk": "s", "softmax": "accent", "wait_dp": "p", "dp": "p",
                   "ds": "accent", "dvdk": "store", "wait_dvdk": "store", "wait_ds_free": "consumer2",
                   "store_ds": "consumer2", "wait_ds": "consumer2", "dq": "bar", "wait_dq": "bar",
                   "wait_dq_read": "v", "store_dq": "v", "add_dq": "v", "wait_dq_done": "v", "wait_dq_tile": "v",
                   "wait_turn": "fg", "wait_step": "stroke", "store_dkdv": "warp"}
BACKWARD_NAME = {"load_q": "load Q", "load_do": "load dO", "load_kv": "load K and V", "wait_kv": "wait for K and V",
                 "wait_empty": "wait for a free Q/dO stage", "wait_qdo": "wait for Q and dO",
                 "qk": "Sᵀ = K Qᵀ and dPᵀ = V dOᵀ", "wait_qk": "wait for Sᵀ to retire", "softmax": "Pᵀ = exp(Sᵀ − lse)",
                 "wait_dp": "wait for dPᵀ to retire", "dp": "dPᵀ = V dOᵀ", "ds": "dSᵀ = Pᵀ ∘ (dPᵀ − D), to bf16",
                 "dvdk": "dV += Pᵀ dO, dK += dSᵀ Q", "wait_dvdk": "wait for dV, dK to retire",
                 "wait_ds_free": "wait for dSᵀ's tile", "store_ds": "store dSᵀ to shared memory",
                 "wait_ds": "wait for both halves of dSᵀ", "dq": "dQ = dS K",
                 "wait_dq": "wait for dQ (and dV, dK) to retire", "wait_dq_read": "wait for dQ's tile to be read",
                 "store_dq": "dQ's share into its tile", "add_dq": "add dQ (atomics, or the bulk reduce-add)",
                 "wait_dq_done": "wait for the reduce-add to complete", "wait_dq_tile": "wait for a consumer's dQ share",
                 "wait_turn": "wait for its turn", "wait_step": "wait at the step's end", "store_dkdv": "store dK, dV"}
BACKWARD_SHORT = {"qk": "Sᵀ dPᵀ", "softmax": "P", "ds": "dS", "dvdk": "dV dK", "dq": "dQ", "add_dq": "+dQ",
                  "store_dkdv": "dK dV", "load_kv": "K/V", "load_q": "Q", "load_do": "dO"}


def fmt_ns(ns: float) -> str:
    return f"{ns:.0f} ns" if abs(ns) < 1000 else f"{ns / 1000:.2f} µs"


class _Words:
    """A lineage's names and colours for the drawing: the forward's, or the backward's."""

    def __init__(self, backward: bool):
        self.backward = backward
        self.colour = BACKWARD_COLOUR if backward else COLOUR
        self.name = BACKWARD_NAME if backward else NAME
        self.short = BACKWARD_SHORT if backward else SHORT
        self.issued = ("qk", "dvdk", "dq") if backward else ("qk", "pv")
        self.group = _BACKWARD_GROUP if backward else _GROUP
        self.order = _BACKWARD_GROUP_ORDER if backward else _GROUP_ORDER
        from hopattn.records.traces import BACKWARD_EVENTS, EVENTS

        self.events = BACKWARD_EVENTS if backward else EVENTS
        self.steps = "query blocks" if backward else "K/V steps"
        self.stage = "Backward stage" if backward else "Stage"


def words_of(record: dict) -> _Words:
    return _Words(trace_lanes.kinds_of(record) is trace_lanes.BACKWARD)


def _where(tile, kv, backward: bool = False) -> str:
    if backward:  # one key block a CTA: its steps are its query blocks, in the CTA's order
        return f"query block {kv} of the CTA's" if kv is not None else "no one query block"
    parts = []
    if tile is not None:
        parts.append(f"output tile {tile + 1}")
    if kv is not None:
        parts.append(f"K/V step {kv}")
    return " · ".join(parts) if parts else "no one tile"


def _issue(event: str, wgmma: bool, words: _Words | None = None) -> str:
    words = words or _Words(False)
    return words.name[event] + (" (issue)" if wgmma and event in words.issued else "")


def lane_label(lane) -> tuple[str, str]:
    warps = lane.role_warps
    of = f" of {warps[0]}–{warps[-1]}" if len(warps) > 1 else ""
    return trace_lanes.role_label(lane.role), f"warp {lane.warp}{of}"


def trace_diagram(stage, record: dict, *, every_warp: bool = False, causal: bool = False,
                  prev: tuple | None = None, view: str = "loop") -> Diagram:
    """``prev``: (the previous stage's name in the text, e.g. "16" or "16, non-causal"; its record's
    per-event stats; optionally its tile boundary's stretches, trace_lanes.boundary_stretches, in
    this record's clock), for a strip that sets this stage against it. ``view``: "loop" magnifies the
    K/V loop's steady state and the strip shows the events that moved most; "boundary" magnifies the
    first tile boundary and the strip shows what the boundary is made of (timeline_focus.py)."""
    lay = trace_lanes.layout(record, every_warp)
    words = words_of(record)
    zoom = trace_lanes.boundary_zoom(lay, record.get("per_step_ns")) if view == "boundary" else None
    boundary = zoom is not None
    zoom = zoom or trace_lanes.zoom(lay, record.get("per_step_ns"))
    head_dim = record["shape"]["head_dim"]
    suffix = head_dim_tag(head_dim) + ("-causal" if causal else "") + ("-warps" if every_warp else "")
    did = f"{'b' if words.backward else 's'}{stage.id}-trace{suffix}"
    wgmma = any(ln.spans for ln in lay.lanes)
    mask = ("" if head_dim == stage.head_dim else f"head dim {head_dim}, ") + ("causal" if causal else "non-causal")
    shape = record["shape"]
    title = f"{words.stage} {stage.id} measured timeline ({mask}{', every warp' if every_warp else ''})"
    n_bars = sum(len(ln.bars) for ln in lay.lanes)
    desc = (f"Per-warp trace of {words.stage.lower()} {stage.id} on one H200 SM, {mask}, batch {shape['batch']}, heads "
            f"{shape['heads']}, length {shape['len_q']}: {len(lay.lanes)} lanes, {n_bars} recorded events in a "
            f"window of {fmt_ns(lay.length)}"
            f"{'' if not zoom else ', with its tile boundary magnified' if boundary else ', with a magnified stretch of its steady state'}. "
            "Solid bars are work, hatched bars are waits.")
    c = Canvas(did, W, 100, title, desc)  # the height is known once everything is placed
    hatch = _Hatches(c)
    c.text(12, 22, f"{stage.id} · {stage.title}: measured on one SM ({mask}, traced build)", size=14, weight="600")
    c.text(12, 40, _window_line(record, lay, words), size=FONT, fill="muted")
    y = _panel(c, hatch, lay, "all", 0.0, lay.length, 50, wgmma, zoom=zoom)
    if zoom:
        what = "around the first tile boundary" if boundary else "of the steady state"
        c.text(12, y + 26, f"Magnified: {fmt_ns(zoom[1] - zoom[0])} {what} "
                           f"({zoom[0] / 1000:.2f}–{zoom[1] / 1000:.2f} µs of the window)", size=13, weight="600")
        y = _panel(c, hatch, lay, "zoom", zoom[0], zoom[1], y + 34, wgmma)
    rows = _legend_rows(_legend_items(lay, wgmma, words))
    _legend(c, hatch, rows, y + 24)
    y += 24 + 22 * len(rows)
    if prev is not None and boundary and not every_warp:
        y = _against_boundary(c, trace_lanes.boundary_stretches(lay), prev, y + 14, words)
    elif prev is not None:
        y = _against(c, hatch, record["stats"], prev, y + 14, wgmma, words)
    c.height = int(y)
    cap = _caption(stage, record, lay, every_warp, wgmma, words)
    return Diagram(did, title, "trace", stage.number, c.tostring(), cap, W, c.height)


def _panel(c: Canvas, hatch, lay, name: str, t0: float, t1: float, y: float, wgmma: bool, zoom=None) -> float:
    """The lanes over [t0, t1] ns of the window, with their boundaries and a time axis; returns the
    y below it. ``zoom``: the stretch the magnified panel shows, bracketed on this one's axis."""
    scale = (X1 - X0) / (t1 - t0)
    multi = len(lay.rows) > 1
    panel = c.group(name)
    row_top, lane_y = {}, []
    for r, slots in enumerate(lay.rows):
        row_top[r] = y
        if name == "all" or multi:
            blocks = " → ".join(f"block {lay.blocks.get(s, '?')}" for s in slots)
            where = f"CTA place {r + 1} of {len(lay.rows)} on the SM" if multi else "The SM's CTA"
            c.text(12, y + 14, f"{where}: {blocks}" if name == "all" else where, size=FONT, weight="600",
                   parent=panel)
            y += 26
        if any(b.row == r and t0 <= b.t <= t1 for b in lay.boundaries):
            y += 18
        for ln in (x for x in lay.lanes if x.row == r):
            lane_y.append((ln, y))
            y += _lane(c, hatch, panel, lay, ln, y, t0, scale, t1, wgmma, name) + LANE_GAP
        both = trace_lanes.both_in_flight(lay, r)
        if both is not None:
            y += _both_strip(c, panel, both[0], y, t0, scale, t1, _both_colour(lay)) + LANE_GAP
        y += 4
    for bd in lay.boundaries:  # a dashed line through the row's lanes, labelled above them
        if not t0 <= bd.t <= t1:
            continue
        x = X0 + (bd.t - t0) * scale
        ys = [ly for ln, ly in lane_y if ln.row == bd.row]
        top = min(ys) - 18
        c.line(x, top + 4, x, max(ys) + TRACK_H + 2 * SPAN_H + 4, stroke="fg", sw=1.5, dash="5 3", parent=panel)
        label = (f"block {lay.blocks.get(bd.slot, '?')} starts" if bd.new_cta
                 else f"output tile {(bd.tile or 0) + 1} starts")
        right = x + text_width(label, FONT) + 6 > X1
        c.text(x - 4 if right else x + 4, top + 12, label, size=FONT, anchor="end" if right else "start",
               weight="600", parent=panel)
    # Time axis, in µs from the window's start.
    c.line(X0, y, X1, y, stroke="stroke", parent=panel)
    step = tick_step((t1 - t0) * 1e-9) * 1e9
    k = int(t0 // step) + (1 if t0 % step > 1e-6 else 0)
    while k * step <= t1 + 1e-6:
        x = X0 + (k * step - t0) * scale
        c.line(x, y, x, y + 4, stroke="stroke", parent=panel)
        c.text(x, y + 18, f"{round(k * step / 1000, 3):g}", size=FONT, anchor="middle", fill="muted", parent=panel)
        k += 1
    c.text(X0 - 8, y + 18, "µs", size=FONT, anchor="end", fill="muted", parent=panel)
    if zoom:
        xa, xb = X0 + (zoom[0] - t0) * scale, X0 + (zoom[1] - t0) * scale
        c.rect(xa, y - 3, xb - xa, 6, fill="accent", stroke=None, rx=2, parent=panel)
        half = text_width("magnified below", FONT) / 2
        c.text(min(max((xa + xb) / 2, X0 + half), X1 - half), y + 34, "magnified below", size=FONT,
               anchor="middle", fill="muted", parent=panel)
    return y + 40


def _both_colour(lay) -> str:
    """The strip's colour: the forward's epilogue red, which no GEMM of its has; the backward's dQ is red."""
    return "fg" if lay.kinds is trace_lanes.BACKWARD else "bar"


def _both_strip(c: Canvas, panel, both, y: float, t0: float, scale: float, t1: float, fill: str = "bar") -> float:
    """Where both consumers have a wgmma in flight at once; returns its height."""
    h = 14
    c.rect(X0, y, X1 - X0, h, fill="bg", stroke="grid", rx=1, parent=panel)
    c.text(X0 - 8, y + 11, "both in flight", size=FONT, anchor="end", fill="muted", weight="600", parent=panel)
    shown = [iv for iv in (_clip(a, b, t0, t1) for a, b in both) if iv is not None]
    for a, b in shown:
        el = c.rect(X0 + (a - t0) * scale, y + 1, max((b - a) * scale, 1.0), h - 2, fill=fill, stroke=None, rx=1,
                    parent=panel)
        el.set_desc(title=f"both consumers have a wgmma in flight · {a / 1000:.3f}–{b / 1000:.3f} µs ({fmt_ns(b - a)})")
    if not shown:
        c.text(X0 + 6, y + 11, "none: the two consumers' wgmmas are not in flight at the same time here",
               size=FONT, fill="muted", parent=panel)
    return h


def _lane(c: Canvas, hatch, panel, lay, ln, ly: float, t0: float, scale: float, t1: float, wgmma: bool,
          name: str) -> float:
    """One warp's lane; returns its height."""
    role, warp = lane_label(ln)
    computes = ln.role in lay.gemm_roles
    spans = computes and wgmma
    c.rect(X0, ly, X1 - X0, TRACK_H, fill="panel" if computes else "panel2", stroke="grid", rx=2, parent=panel)
    c.text(12, ly + 15.5, role, size=13.5, weight="600", parent=panel)
    c.text(X0 - 8, ly + 15.5, warp, size=FONT, anchor="end", fill="muted", parent=panel)
    if spans:
        sy = ly + TRACK_H + 4
        c.rect(X0, sy, X1 - X0, 2 * SPAN_H, fill="bg", stroke="grid", sw=0.5, rx=1, parent=panel)
        c.text(X0 - 8, sy + 2 * SPAN_H, "wgmma in flight", size=FONT, anchor="end", fill="muted", parent=panel)
    g = c.d.g(id=c.id(f"{name}-lane-{ln.row}-{ln.warp}"), **{"class": "hd-trace-lane"})
    panel.add(g)
    words = _Words(lay.kinds is trace_lanes.BACKWARD)
    for b in ln.bars:
        _bar(c, hatch, g, b, ly, t0, scale, t1, f"{role} · warp {ln.warp} · block {lay.blocks.get(b.slot, '?')}", wgmma,
             words)
    if spans:
        for s in ln.spans:
            _span(c, g, s, ly + TRACK_H + 4, t0, scale, t1, f"{role} · warp {ln.warp}", words, lay.kinds.track(s.gemm))
    return TRACK_H + (4 + 2 * SPAN_H if spans else 0)


def _window_line(record: dict, lay, words: _Words | None = None) -> str:
    words = words or _Words(False)
    steps = (f"~{lay.length / record['per_step_ns']:.0f} {words.steps}" if record.get("per_step_ns")
             else f"its {words.steps}")
    tile = "key block" if words.backward else "output tile"
    if lay.boundaries:
        kind = "a new CTA takes over" if any(b.new_cta for b in lay.boundaries) else f"the CTA starts its next {tile}"
        return f"A window of {fmt_ns(lay.length)} ({steps}) around the moment {kind}"
    return f"A window of {fmt_ns(lay.length)} ({steps}): the start of the CTA's first {tile}, no tile boundary in it"


class _Hatches:
    """One hatch pattern per colour a wait is drawn in, in the diagram's <defs>, ids prefixed."""

    def __init__(self, c: Canvas):
        self.c, self.made = c, set()

    def __call__(self, key: str) -> str:
        pid = self.c.id(f"hatch-{key}")
        if pid not in self.made:
            self.made.add(pid)
            d = self.c.d
            p = d.pattern(id=pid, size=(6, 6), patternUnits="userSpaceOnUse", patternTransform="rotate(45)")
            p.add(d.rect((0, 0), (6, 6), fill=color(key), **{"fill-opacity": 0.2}))
            p.add(d.line((1.5, 0), (1.5, 6), stroke=color(key), **{"stroke-width": 2.5}))
            d.defs.add(p)
        return f"url(#{pid})"


def _clip(start: float, end: float, t0: float, t1: float) -> tuple[float, float] | None:
    a, b = max(start, t0), min(end, t1)
    return (a, b) if b >= a else None


def _bar(c: Canvas, hatch, g, b, ly: float, t0: float, scale: float, t1: float, who: str, wgmma: bool,
         words: _Words | None = None) -> None:
    """One event: a group with its tooltip (class hd-ev), so an event is one element whatever its shape."""
    shown = _clip(b.start, b.end, t0, t1)
    if shown is None:
        return
    words = words or _Words(False)
    key = words.colour[b.event]
    x = X0 + (shown[0] - t0) * scale
    w = max((shown[1] - shown[0]) * scale, 1.0)
    tip = (f"{who} — {_issue(b.event, wgmma, words)}{' issued' if b.kind == 'mark' else ''} · "
           f"{_where(b.tile, b.kv, words.backward)} · "
           f"at {b.start / 1000:.3f} µs" + ("" if b.kind == "mark" else f" · lasts {fmt_ns(b.end - b.start)}"))
    ev = c.d.g(**{"class": f"hd-ev hd-{b.kind}"})
    ev.set_desc(title=tip)
    g.add(ev)
    if b.kind == "mark":
        c.path([(x - 4, ly - 1), (x + 4, ly - 1), (x, ly + 6)], stroke=None, fill=key, closed=True, parent=ev)
        c.line(x, ly, x, ly + TRACK_H, stroke=key, sw=2, parent=ev)
        return
    if b.kind == "wait":
        ev.add(c.d.rect((num(x), num(ly + 4)), (num(w), num(TRACK_H - 8)), fill=hatch(key), stroke=color(key),
                        **{"stroke-width": 1}))
        return
    c.rect(x, ly + 1, w, TRACK_H - 2, fill=key, stroke="bg", sw=0.5, rx=1, parent=ev)
    label = words.short.get(b.event)
    if label and text_width(label, FONT) + 6 <= w:
        c.text(x + w / 2, ly + 15.5, label, size=FONT, anchor="middle", fill="bg", weight="600", parent=ev)


def _span(c: Canvas, g, s, sy: float, t0: float, scale: float, t1: float, who: str, words: _Words | None = None,
          track: int | None = None) -> None:
    shown = _clip(s.start, s.end, t0, t1)
    if shown is None:
        return
    words = words or _Words(False)
    key = words.colour[s.gemm]
    y = sy + (SPAN_H * track if track is not None else 0 if s.gemm == "qk" else SPAN_H)
    x, w = X0 + (shown[0] - t0) * scale, max((shown[1] - shown[0]) * scale, 1.0)
    el = c.rect(x, y + 0.5, w, SPAN_H - 1, fill=key, stroke=None, rx=1, opacity=0.75, parent=g)
    name = BACKWARD_NAME["dp"] if words.backward and s.gemm == "dp" else (
        "Sᵀ = K Qᵀ" if words.backward and s.gemm == "qk" else words.name[s.gemm])
    el.set_desc(title=f"{who} — {name} in flight · {_where(s.tile, s.kv, words.backward)} · issued at {s.start / 1000:.3f} µs, "
                      f"retired by {s.end / 1000:.3f} µs ({fmt_ns(s.end - s.start)})")


def _against_boundary(c: Canvas, mine: list[tuple[str, float]], prev: tuple, y: float,
                      words: _Words | None = None) -> float:
    """What the first tile boundary is made of (trace_lanes.boundary_stretches), against the same
    stretches of the previous stage's record: a solid bar for this stage over an outlined one for
    the previous, on one scale per stretch; returns the y below."""
    pid = prev[0]
    theirs = dict(prev[2]) if len(prev) > 2 and prev[2] else {}
    words = words or _Words(False)
    c.text(12, y, f"Against stage {pid}: the tile boundary, stretch by stretch (the first boundary of each window)",
           size=13, weight="600")
    y += 10
    rows = []
    for label, ns in mine:
        other = theirs.get(label)
        text = (f"{fmt_ns(ns)} against {fmt_ns(other)} ({ns / other:.2f}×)" if other else
                f"{fmt_ns(ns)}; stage {pid}: none")
        rows.append((label, ns, other, text))
    label_w = max((text_width(label, FONT) for label, *_ in rows), default=0)
    text_w = max((text_width(text, FONT) for *_, text in rows), default=0)
    bx = max(X0, 12 + label_w + 12)
    width = max(80.0, min(300.0, W - 12 - text_w - 10 - bx))
    for label, ns, other, text in rows:
        top = max(ns, other or 0) or 1.0
        key = (("warp" if "store of dK" in label else "k" if "wait for K" in label else "s") if words.backward else
               "bar" if "epilogue" in label else "q" if "wait for Q" in label else "s")
        c.text(12, y + 17, label, size=FONT)
        c.rect(bx, y + 4, max(width * ns / top, 1.0), 10, fill=key, stroke=None, rx=1)
        if other is not None:
            c.rect(bx, y + 16, max(width * other / top, 1.0), 10, fill="bg", stroke=key, sw=1.2, rx=1, dash="3 2")
        c.text(bx + width + 10, y + 17, text, size=FONT)
        y += 32
    if not mine:
        c.text(12, y + 14, "No tile boundary in this window.", size=FONT, fill="muted")
        y += 22
    c.text(12, y + 14, f"solid: this stage · dashed outline: stage {pid}, its cycles at this record's SM clock; "
                       "each consumer's lead warp", size=FONT, fill="muted")
    return y + 26


def _against(c: Canvas, hatch, stats: dict, prev: tuple, y: float, wgmma: bool, words: _Words | None = None) -> float:
    """The events whose median duration moved most against the previous stage: a solid bar for
    this stage over an outlined one for the previous, on one scale per event; returns the y below."""
    words = words or _Words(False)
    pid, prev_stats = prev[0], prev[1]
    moved, new = trace_lanes.moved_events(stats, prev_stats)
    c.text(12, y, f"Against stage {pid}: the median durations that moved most (every event recorded on the SM)",
           size=13, weight="600")
    y += 10
    width = 380
    for event, mine, theirs in moved:
        key = words.colour[event]
        top = max(mine, theirs)
        c.text(12, y + 17, _issue(event, wgmma, words), size=FONT)
        c.rect(X0, y + 4, width * mine / top, 10, fill=key, stroke=None, rx=1)
        c.rect(X0, y + 16, width * theirs / top, 10, fill="bg", stroke=key, sw=1.2, rx=1, dash="3 2")
        c.text(X0 + width + 10, y + 17, f"{fmt_ns(mine)} · stage {pid}: {fmt_ns(theirs)} ({mine / theirs:.2f}×)",
               size=FONT)
        y += 32
    if new:
        c.text(12, y + 14, f"New in this stage: {', '.join(_issue(e, wgmma, words) for e in new)}", size=FONT)
        y += 22
    if not moved and not new:
        c.text(12, y + 14, "No event's median duration moved by more than a fifth.", size=FONT, fill="muted")
        y += 22
    c.text(12, y + 14, f"solid: this stage · dashed outline: stage {pid}, its cycles at this record's SM clock",
           size=FONT, fill="muted")
    return y + 26


# The legend says each encoding once (a key: work, wait, copy issued, in flight), then one entry per
# colour, which names what that colour is about; the tooltips name each bar's event exactly.
_GROUP = {"q": "Q", "k": "K", "v": "V", "s": "S = QKᵀ", "p": "softmax", "accent": "rescale O, pack P",
          "o": "O += PV", "bar": "epilogue, store O", "store": "store O (the TMA store)", "stroke": "a free buffer",
          "fg": "its turn"}
_GROUP_ORDER = ("q", "k", "v", "s", "p", "accent", "o", "bar", "store", "stroke", "fg")
_BACKWARD_GROUP = {"q": "Q (and the wait for Q and dO)", "o": "dO", "k": "K and V",
                   "s": "Sᵀ = K Qᵀ (and dPᵀ = V dOᵀ, issued with it)", "p": "dPᵀ = V dOᵀ", "accent": "Pᵀ, dSᵀ",
                   "store": "dV += Pᵀ dO, dK += dSᵀ Q", "consumer2": "dSᵀ through shared memory", "bar": "dQ = dS K",
                   "v": "dQ's accumulation", "warp": "store dK, dV", "stroke": "a free buffer, the step's end",
                   "fg": "its turn"}
_BACKWARD_GROUP_ORDER = ("q", "o", "k", "s", "p", "accent", "store", "consumer2", "bar", "v", "warp", "stroke", "fg")


def _legend_items(lay, wgmma: bool, words: _Words | None = None) -> list[tuple[tuple[tuple[str, str], ...], str]]:
    """(swatches, label) rows of the legend: the key of the kinds drawn, then each colour drawn, with
    what its bars are about (the events of the window, in trace.cuh's order, grouped by colour)."""
    words = words or _Words(False)
    seen: dict[str, str] = {}
    for ln in lay.lanes:
        for b in ln.bars:
            seen.setdefault(b.event, b.kind)
    kinds = set(seen.values()) | ({"span"} if wgmma else set())
    key = [((("muted", k),), label) for k, label in
           (("work", "work"), ("wait", "a wait (hatched)"), ("mark", "a copy issued"),
            ("span", "a wgmma in flight, under its consumer")) if k in kinds]
    groups: dict[str, list[str]] = {}
    for e in words.events:
        if e in seen:
            groups.setdefault(words.colour[e], []).append(e)
    if words.backward and wgmma:  # dPᵀ's colour is its span's, where no event of its own has it
        groups.setdefault("p", ["wait_dp"])
    items = []
    for colour in words.order:
        events = groups.get(colour)
        if not events:
            continue
        label = words.group[colour]
        if words.backward:
            solid = any(seen.get(e) != "wait" for e in events)
            items.append((((colour, "work" if solid else "wait"),), label))
            continue
        if colour == "k" and any(e in ("load_kv", "wait_kv") for e in events):
            label = "K and V" if all(e in ("load_kv", "wait_kv") for e in events) else "K, K and V"
        if colour == "accent" and "wait_tile" in events:
            label = "the next tile id" if events == ["wait_tile"] else "rescale O, pack P; the next tile id"
        if colour == "bar":
            label = ", ".join(NAME[e] for e in events)
        solid = any(seen[e] != "wait" for e in events)
        items.append((((colour, "work" if solid else "wait"),), label))
    if any(trace_lanes.both_in_flight(lay, r) is not None for r in range(len(lay.rows))):
        items.append((((_both_colour(lay), "span"),), "both consumers' wgmmas in flight"))
    return [("key", it) for it in key] + [("colour", it) for it in items]


def _legend_rows(items) -> list[list]:
    """The key on a row of its own, then the colours, each row as wide as the figure allows."""
    rows, row, x, part = [], [], 12.0, None
    for which, it in items:
        w = 14 + 5 + text_width(it[1], FONT) + 16
        if row and (x + w > W - 8 or which != part):
            rows.append(row)
            row, x = [], 12.0
        part = which
        row.append(it)
        x += w
    return rows + ([row] if row else [])


def _legend(c: Canvas, hatch, rows, y: float) -> None:
    for i, row in enumerate(rows):
        x, yy = 12.0, y + i * 22
        for swatches, label in row:
            for key, kind in swatches:
                if kind == "wait":
                    c.body.add(c.d.rect((num(x), num(yy - 11)), (14, 12), fill=hatch(key), stroke=color(key),
                                        **{"stroke-width": 1}))
                elif kind == "mark":
                    c.path([(x + 3, yy - 12), (x + 11, yy - 12), (x + 7, yy - 5)], stroke=None, fill=key,
                           closed=True)
                    c.line(x + 7, yy - 12, x + 7, yy + 1, stroke=key, sw=2)
                elif kind == "span":
                    c.rect(x, yy - 7, 14, 5, fill=key, stroke=None, rx=1, opacity=0.75)
                else:
                    c.rect(x, yy - 11, 14, 12, fill=key, stroke=None, rx=2)
            c.text(x + 19, yy, label, size=FONT, fill="muted")
            x += 14 + 5 + text_width(label, FONT) + 16


METHOD = "../../method/#traces"  # from a stage page: how a trace is recorded, read, and what it costs


def _caption(stage, record: dict, lay, every_warp: bool, wgmma: bool, words: _Words | None = None) -> str:
    """What is particular to this record (the warps shown, its file, its overhead); what every trace
    shares (how it is recorded, what a bar and a wgmma span mean) is said once, on the method page."""
    shown = ("Every traced warp" if every_warp else
             "The first warp of each role (and any warp that records what its first does not)")
    over = record["overhead"]
    notes = []
    if "pct_range" in over:
        notes.append(f"rounds {over['pct_range'][0]:+.1f} to {over['pct_range'][1]:+.1f} %")
    if "idle_pct" in over:
        notes.append(f"{over['idle_pct']:+.1f} % recording nothing")
    if "step_pct" in over:
        notes.append(f"{words.steps if words is not None else 'K/V steps'} {over['step_pct']:+.1f} % with every event "
                     "recorded")
    idle = f" ({'; '.join(notes)})" if notes else ""
    folder = "nvidia-h200/backward" if words is not None and words.backward else "nvidia-h200"
    head_dim = record["shape"]["head_dim"]
    drawn = f"Head dim {head_dim}. " if len(getattr(stage, "head_dims", ())) > 1 else ""  # a stage of several (24)
    name = record_name(stage.id, record["causal"], head_dim)
    return (f"{drawn}{shown}, from `bench/results/traces/{folder}/{name}`. "
            f"The traced build ran {over['pct']:+.1f} % against the plain one{idle}: the lengths are relative, not "
            f"exact. Hover a bar for its event, tile, step and times; [how a trace is recorded and read]({METHOD}).")
