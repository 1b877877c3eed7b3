"""Tensor-core pipeline timeline: a Gantt chart of a few KV iterations from the schedule model.

timeline_diagram draws the model's own window (the gallery's picture); model_window_diagram draws
the model's prediction for the window of a measured trace (the same K/V steps, around the same
kind of tile boundary) on a given time scale, so it can sit under the measured timeline and the
two compare by length.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import facts, rates, schedule
from .diagram import Diagram
from .svg import LABEL_OPACITY, Canvas, fmt_us, text_width

W = 860
X0, X1 = 196, 846  # the measured timeline's too (trace_timeline.py): stacked, the axes line up
LANE_H, LANE_GAP = 34, 8
KIND_COLOUR = {"load_k": "k", "load_v": "v", "load_kv": "k", "load_q": "q", "qk": "s", "softmax": "p",
               "pv": "o", "store_o": "o"}


LEGEND = (("load_q", "q", "load Q"), ("load_k", "k", "load K"), ("load_kv", "k", "load K+V"),
          ("load_v", "v", "load V"), ("qk", "s", "S = QKᵀ"), ("softmax", "p", "softmax"),
          ("pv", "o", "O += PV"), ("store_o", "o", "store O"))
# The backward's kinds (Act V): its own colours and legend, so no forward picture changes.
BACKWARD_COLOUR = {"load_q": "q", "load_do": "o", "load_k": "k", "load_v": "v", "load_kv": "k", "qk": "s",
                   "dp": "p", "softmax": "accent", "dv": "store", "dk": "consumer2", "dq": "bar",
                   "store_dkdv": "warp", "reduce_dq": "bar"}
BACKWARD_LEGEND = (("load_q", "load Q"), ("load_do", "load dO"), ("load_kv", "load K+V"), ("load_k", "load K"),
                   ("load_v", "load V"), ("qk", "S = QKᵀ"), ("dp", "dP = dO Vᵀ"), ("softmax", "P, dS"),
                   ("dv", "dV += Pᵀ dO"), ("dk", "dK += dSᵀ Q"), ("dq", "dQ += dS K"), ("store_dkdv", "store dK, dV"),
                   ("reduce_dq", "+dQ: the tile's bulk reduce-add"))  # (the roles figure's: no schedule kind)


def backward_legend(stage) -> tuple[tuple[str, str], ...]:
    """BACKWARD_LEGEND in the stage's form of the GEMMs: with transposed scores ([diagram]
    transposed_scores) Sᵀ = K Qᵀ, dPᵀ = V dOᵀ and Pᵀ, dSᵀ."""
    from .backward import facts as bwd  # (the backward's package imports this module)

    if not bwd.transposed(stage):
        return BACKWARD_LEGEND
    forms = {g.kind: g.formula for g in bwd.gemms(stage)}
    forms["softmax"] = f"{bwd.held_name(stage, 'P')}, {bwd.held_name(stage, 'dS')}"
    return tuple((k, forms[k] if k in ("qk", "dp", "softmax") else label) for k, label in BACKWARD_LEGEND)


def loop_words(stage) -> dict[str, str]:
    """What one iteration of the stage's loop is called: a K/V tile's (forward) or a query block's
    (backward, whose CTA owns a block of keys and walks the query blocks)."""
    if stage.backward:
        return {"iterations": "query blocks", "iteration": "query block", "step": "query block",
                "tile": "key block"}
    return {"iterations": "KV iterations", "iteration": "KV iteration", "step": "K/V step", "tile": "output tile"}


def iterations_for(stage) -> tuple[int, int]:
    """(iterations per tile, tiles) to draw: a persistent kernel shows the next tile starting."""
    return (3, 2) if facts.persistent(stage) else (4, 1)


@dataclass(frozen=True)
class Window:
    """What part of the model's run to draw: slots overlapping [start, end] (seconds), and where the
    second output tile starts (None: no boundary in the window)."""

    slots: tuple
    start: float
    end: float
    boundary: float | None
    steps: int


def own_window(stage) -> Window:
    iters, tiles = iterations_for(stage)
    slots = schedule.simulate(stage, iters, tiles)
    return Window(tuple(slots), 0.0, max(s.end for s in slots), _tile_start(slots, 1) if tiles > 1 else None,
                  iters * tiles)


def measured_window(stage, before: int, after: int | None) -> Window:
    """The model's run over the K/V steps a trace window holds: ``before`` steps of one output tile
    and ``after`` of the next (a boundary window; ``after`` 0: up to the next tile's start), or, with
    ``after`` None, the prologue and the first ``before`` steps of the first tile."""
    if after is None:
        slots = schedule.simulate(stage, max(before, 1), 1)
        return Window(tuple(slots), 0.0, max(s.end for s in slots), None, max(before, 1))
    n = max(before, after, 1)
    slots = schedule.simulate(stage, n, 2)
    first = n - before  # the first iteration the window shows, from its first QKᵀ (the trace counts steps so)
    start = min(s.start for s in slots if s.it == first and s.op.kind == "qk")
    # after == 0: the trace's window ends before the next tile's first step; the model's, at its start
    end = max(s.end for s in slots if s.it <= n + after - 1) if after else _tile_start(slots, 1)
    kept = [s for s in slots if s.end > start and s.start < end]
    return Window(tuple(kept), start, end, _tile_start(slots, 1), before + after)


def _tile_start(slots, tile: int) -> float:
    """The model's start of an output tile: the first op of it in the role that runs QKᵀ (a
    producer prefetches the next tile's Q early), as the measured timeline marks it."""
    qk_roles = {s.op.role for s in slots if s.op.kind == "qk"}
    return min(s.start for s in slots if s.tile == tile and s.op.role in qk_roles)


def timeline_diagram(stage, stages) -> Diagram:
    """The model's own window (3 iterations of two tiles when persistent, else 4 of one)."""
    win = own_window(stage)
    title = f"Stage {stage.id} pipeline timeline"
    heading = f"{stage.id} · {stage.title}: {win.steps} {loop_words(stage)['iterations']} on one SM"
    did = f"b{stage.id}-timeline" if stage.backward else f"s{stage.id}-timeline"
    if stage.backward:
        title = f"Backward stage {stage.id} schedule"
    return _draw(stage, win, did, title, heading, win.end - win.start)


def model_window_diagram(stage, win: Window, span_s: float, did: str) -> Diagram:
    """The model's prediction for a measured window, drawn over ``span_s`` seconds of axis (the
    measured window's length, or the model's when that is longer)."""
    title = f"{'Backward stage' if stage.backward else 'Stage'} {stage.id} predicted timeline (schedule model)"
    steps = loop_words(stage)["iterations"] if stage.backward else "K/V steps"
    heading = f"{stage.id} · {stage.title}: the model's prediction for the same {win.steps} {steps}, same time scale"
    drawn = _draw(stage, win, did, title, heading, max(span_s, win.end - win.start))
    if len(getattr(stage, "head_dims", ())) <= 1:
        return drawn
    # a stage of several head dims (stage 24): ``stage`` at the head dim of the trace (timeline_section.model_stage)
    tile = f"Head dim {stage.head_dim}: the model of its tile, {stage.block_m} query rows × {stage.block_n} keys. "
    return replace(drawn, caption=tile + drawn.caption)


def _draw(stage, win: Window, did: str, title: str, heading: str, span: float) -> Diagram:
    slots = list(win.slots)
    iters = iterations_for(stage)[0]
    tiles = len({s.tile for s in slots})
    per_tile = max(s.it for s in slots if s.tile == 0) + 1 if any(s.tile == 0 for s in slots) else iters
    pred = schedule.predict(stage)
    scale = (X1 - X0) / span
    unit_name = schedule.UNIT_LABEL
    words = loop_words(stage)
    once_kinds = schedule.once_kinds(stage)
    desc = (f"Gantt chart of {win.steps} {words['iterations']}"
            f"{' around an output-tile boundary' if win.boundary is not None else ''} of "
            f"{'backward ' if stage.backward else ''}stage {stage.id} on one "
            f"H200 SM, one lane per unit, as placed by the schedule model. Predicted {fmt_us(pred.period)} per "
            f"{'query block' if stage.backward else 'iteration'}; bound by {unit_name[pred.bound]}.")
    top = 44
    lanes_h = len(schedule.UNITS) * (LANE_H + LANE_GAP)
    height = top + lanes_h + 30 + 28 + 24 * 3 + 40
    c = Canvas(did, W, height, title, desc)
    if text_width(heading, 14, bold=True) > W - 24:  # a long stage title: the heading keeps what it says
        heading = heading.replace(f"{stage.title}: ", "", 1)
    c.heading(heading)  # and shrinks to 12 px if it must

    lane_y = {u: top + i * (LANE_H + LANE_GAP) for i, u in enumerate(schedule.UNITS)}
    for u, y in lane_y.items():
        c.rect(X0, y, X1 - X0, LANE_H, fill="panel", stroke="grid", rx=3)
        c.text(12, y + LANE_H / 2 + 5, unit_name[u], size=13)

    def xof(t: float) -> float:
        return X0 + (t - win.start) * scale

    if win.boundary is not None:
        x = xof(win.boundary)
        c.line(x, top - 6, x, top + lanes_h - LANE_GAP + 4, stroke="fg", sw=1.5, dash="5 3")
        label = f"{loop_words(stage)['tile']} 2 starts"
        right = x + text_width(label, 12.5) + 6 > X1
        c.text(x - 4 if right else x + 4, top - 8, label, size=13, weight="600", anchor="end" if right else "start")

    g = c.group("bars")
    for s in slots:
        y = lane_y[s.op.unit]
        a, b = max(s.start, win.start), min(s.end, win.end)
        x, w = xof(a), max(b - a, 0) * scale
        fill = (BACKWARD_COLOUR if stage.backward else KIND_COLOUR).get(s.op.kind, "stroke")
        bar = c.rect(x, y + 3, w, LANE_H - 6, fill=fill, stroke="bg", sw=1, rx=2,
                     opacity=None if s.it % 2 == 0 else LABEL_OPACITY, parent=g)
        it = s.it % per_tile
        once = s.op.kind in once_kinds
        step_label = "" if once else f" · {words['step']} {it}"
        bar.set_desc(title=f"{s.op.name} ({s.op.role}, {s.op.engine}) · {words['tile']} {s.tile + 1}{step_label} · "
                           f"{(s.start - win.start) * 1e6:.3f} µs, lasts {(s.end - s.start) * 1e9:.0f} ns")
        name = s.op.name if not once or tiles == 1 else f"{s.op.name} t{s.tile + 1}"
        if text_width(f"{name} {it}", 13) > w - 4:
            name = name.replace("softmax", "sm").replace("load_", "")
        one = name if once else f"{name} {it}"
        cx, cy = x + w / 2, y + LANE_H / 2
        if text_width(one, 13) <= w - 8:
            c.text(cx, cy + 4.5, one, size=13, anchor="middle", fill="bg", weight="600", parent=g)
        elif text_width(f"{it}", 13) <= w - 5:
            short = s.op.kind[-1].upper() if once else f"{it}"  # "Q" / "O" for the prologue/epilogue
            c.text(cx, cy + 4.5, short, size=13, anchor="middle", fill="bg", weight="600", parent=g)

    # Time axis.
    ay = top + lanes_h + 2
    c.line(X0, ay, X1, ay, stroke="stroke")
    step = tick_step(span)
    for k in range(int(span / step + 1e-9) + 1):
        x = X0 + k * step * scale
        c.line(x, ay, x, ay + 4, stroke="stroke")
        c.text(x, ay + 18, f"{round(k * step * 1e6, 3):g}", size=13, anchor="middle", fill="muted")
    c.text(X0 - 8, ay + 18, "µs", size=13, anchor="end", fill="muted")
    c.text(X1, ay + 34, "time on one SM, as the model places the ops", size=13, anchor="end", fill="muted")

    # Prediction beside the chart: per-unit work per iteration and the bound.
    y = ay + 56
    c.text(12, y, f"Predicted {fmt_us(pred.period)} per {words['iteration']} (steady state) · bound: "
                  f"{unit_name[pred.bound]}", size=13, weight="600")
    y += 8
    for i, u in enumerate(u for u in schedule.UNITS if u != "epilogue"):
        yy = y + 8 + i * 24
        busy = pred.busy[u]
        util = pred.utilisation(u)
        c.text(12, yy + 12, unit_name[u], size=13, fill="muted")
        c.rect(X0, yy, (X1 - X0 - 300), 14, fill="panel", stroke="grid", rx=2)
        c.rect(X0, yy, (X1 - X0 - 300) * min(util, 1.0), 14, fill=schedule_colour(u), stroke=None, rx=2)
        c.text(X1 - 290, yy + 12, f"{fmt_us(busy)} of work per iteration · {util * 100:.0f}% busy", size=13)
    kinds = {s.op.kind for s in slots}
    if stage.backward:
        return _backward_end(c, stage, kinds, did, title, height)
    merged: dict[str, list[str]] = {}  # one swatch per colour
    for kind, col, label in LEGEND:
        if kind in kinds:
            merged.setdefault(col, []).append(label)
    items = [(col, " / ".join(labels)) for col, labels in merged.items()]
    c.legend(12, height - 12, items, size=13)
    cap = (f"Placed by the schedule model (site_gen/diagrams/schedule.py) from stage {stage.id}'s "
           f"`[[schedule]]`: ops in program order per role, asynchronous copies prefetched as their "
           f"`after` dependencies allow, one op at a time per unit. Rates: {rates.ASSUMPTIONS}. "
           f"Warps of one role are modelled in lockstep; latencies are not modelled, only throughput. "
           f"Bars alternate shade by iteration; the number in a bar is its KV iteration.")
    return Diagram(did, title, "timeline", stage.number, c.tostring(), cap, W, height)


def _backward_end(c, stage, kinds, did, title, height) -> Diagram:
    """The backward's legend (its own colours, in rows that fit the width) and caption."""
    items = [(BACKWARD_COLOUR[k], label) for k, label in backward_legend(stage) if k in kinds]
    rows, row, x = [], [], 12
    for key, label in items:
        w = 13 + 4 + text_width(label, 13) + 16
        if row and x + w > W - 12:
            rows.append(row)
            row, x = [], 12
        row.append((key, label))
        x += w
    rows.append(row)
    y = height - 12
    c.height = height = int(height + 22 * (len(rows) - 1))
    for i, r in enumerate(rows):
        c.legend(12, y + 22 * i, r, size=13)
    cap = (f"Placed by the schedule model (site_gen/diagrams/schedule.py) from backward stage {stage.id}'s "
           "`[[schedule]]`: one query block's ops in program order per role, asynchronous ops issued as their "
           "`after` dependencies allow, one op at a time per unit; the five GEMMs are 2·block_m·block_n·head_dim "
           f"FLOP each, Q and dO come from L2, K and V once from HBM. Rates: {rates.ASSUMPTIONS}. "
           f"Not modelled: {_backward_unmodelled(stage)}. "
           "Bars alternate shade by query block; the number in a bar is its query block.")
    return Diagram(did, title, "timeline", stage.number, c.tostring(), cap, W, height)


def _backward_unmodelled(stage) -> str:
    """What the backward's schedule model leaves out: latencies, the waits where the warps meet (the
    CTA's barriers, or, when the GEMMs are one role's of several, its named barriers and the roles'
    mbarriers) and dQ's traffic (atomics, or bulk reduce-adds and the deterministic mode's turns)."""
    from .backward import facts as bwd
    from .backward import roles as bwd_roles

    several = len(stage.roles) > 1 and bwd_roles.computing_role(stage) is not None
    parts = ["latencies", "the named barriers' and mbarriers' waits" if several else "the CTA barriers' waits"]
    path = bwd.dq_path(stage)
    parts.append("the dQ bulk reduce-adds' traffic (the TMA unit's, beside the loads)" if path.bulk else
                 "the dQ atomics' traffic")
    if path.ordered:
        parts.append("the deterministic mode's turns")
    return f"{parts[0]}, {parts[1]} and {parts[2]}" if len(parts) == 3 else "; ".join(parts)


def schedule_colour(unit: str) -> str:
    return {"load": "load", "tensor": "tensor", "softmax": "softmax", "epilogue": "epilogue"}[unit]


def tick_step(end: float) -> float:
    """A round tick step (in seconds) giving 5-10 ticks over ``end`` seconds."""
    us = end * 1e6
    for step in (0.05, 0.1, 0.2, 0.25, 0.5, 1, 2, 2.5, 5, 10, 20, 25, 50, 100):
        if us / step <= 10:
            return step * 1e-6
    return 200e-6
