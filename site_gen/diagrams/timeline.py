"""Tensor-core pipeline timeline: a Gantt chart of a few KV iterations from the schedule model."""

from __future__ import annotations

from . import facts, rates, schedule
from .diagram import Diagram
from .svg import Canvas, fmt_us, text_width

W = 860
LABEL_W = 150
X0, X1 = 166, 846
LANE_H, LANE_GAP = 34, 8
KIND_COLOUR = {"load_k": "k", "load_v": "v", "load_kv": "k", "load_q": "q", "qk": "s", "softmax": "p",
               "pv": "o", "store_o": "o"}


LEGEND = (("load_q", "q", "load Q"), ("load_k", "k", "load K"), ("load_kv", "k", "load K+V"),
          ("load_v", "v", "load V"), ("qk", "s", "S = QKᵀ"), ("softmax", "p", "softmax"),
          ("pv", "o", "O += PV"), ("store_o", "o", "store O"))


def iterations_for(stage) -> tuple[int, int]:
    """(iterations per tile, tiles) to draw: a persistent kernel shows the next tile starting."""
    return (3, 2) if facts.persistent(stage) else (4, 1)


def timeline_diagram(stage, stages) -> Diagram:
    did = f"s{stage.id}-timeline"
    iters, tiles = iterations_for(stage)
    slots = schedule.simulate(stage, iters, tiles)
    pred = schedule.predict(stage)
    end = max(s.end for s in slots)
    scale = (X1 - X0) / end
    title = f"Stage {stage.id} pipeline timeline"
    unit_name = schedule.UNIT_LABEL
    desc = (f"Gantt chart of {iters * tiles} KV iterations"
            f"{' over two output tiles' if tiles > 1 else ''} of stage {stage.id} on one H200 SM, one lane "
            f"per unit, as placed by the schedule model. Predicted {fmt_us(pred.period)} per iteration; "
            f"bound by {unit_name[pred.bound]}.")
    top = 40
    lanes_h = len(schedule.UNITS) * (LANE_H + LANE_GAP)
    height = top + lanes_h + 30 + 24 + 22 * 3 + 36
    c = Canvas(did, W, height, title, desc)
    c.text(14, 22, f"{stage.id} · {stage.title}: {iters * tiles} KV iterations on one SM", size=14, weight="600")

    lane_y = {u: top + i * (LANE_H + LANE_GAP) for i, u in enumerate(schedule.UNITS)}
    for u, y in lane_y.items():
        c.rect(X0, y, X1 - X0, LANE_H, fill="panel", stroke="grid", rx=3)
        c.text(14, y + LANE_H / 2 + 4, unit_name[u], size=12)

    # Tile boundaries of a persistent kernel.
    if tiles > 1:
        for t in range(1, tiles):
            first = min(s.start for s in slots if s.tile == t)
            x = X0 + first * scale
            c.line(x, top - 6, x, top + lanes_h - LANE_GAP + 4, stroke="muted", dash="4 3")
            c.text(x + 4, top - 8, f"tile {t + 1} starts", size=10, fill="muted")

    g = c.group("bars")
    for s in slots:
        y = lane_y[s.op.unit]
        x, w = X0 + s.start * scale, max(s.end - s.start, 0) * scale
        fill = KIND_COLOUR.get(s.op.kind, "stroke")
        c.rect(x, y + 3, w, LANE_H - 6, fill=fill, stroke="bg", sw=1, rx=2,
               opacity=0.95 if s.it % 2 == 0 else 0.7, parent=g)
        it = s.it % iters
        once = s.op.kind in schedule.ONCE
        name = s.op.name if not once or tiles == 1 else f"{s.op.name} t{s.tile + 1}"
        if text_width(f"{name} {it}", 10.5) > w - 4:
            name = name.replace("softmax", "sm").replace("load_", "")
        one = name if once else f"{name} {it}"
        cx, cy = x + w / 2, y + LANE_H / 2
        if text_width(one, 10.5) <= w - 8:
            c.text(cx, cy + 4, one, size=10.5, anchor="middle", fill="bg", weight="600", parent=g)
        elif not once and text_width(name, 9.5) <= w - 6:
            c.text(cx, cy - 1.5, name, size=9.5, anchor="middle", fill="bg", weight="600", parent=g)
            c.text(cx, cy + 9.5, f"#{it}", size=9, anchor="middle", fill="bg", parent=g)
        elif text_width(f"{it}", 10) <= w - 5:
            short = s.op.kind[-1].upper() if once else f"{it}"  # "Q" / "O" for the prologue/epilogue
            c.text(cx, cy + 4, short, size=10, anchor="middle", fill="bg", weight="600", parent=g)

    # Time axis.
    ay = top + lanes_h + 2
    c.line(X0, ay, X1, ay, stroke="stroke")
    step = _tick(end)
    for k in range(int(end / step + 1e-9) + 1):
        x = X0 + k * step * scale
        c.line(x, ay, x, ay + 4, stroke="stroke")
        c.text(x, ay + 16, f"{round(k * step * 1e6, 2):g}", size=10, anchor="middle", fill="muted")
    c.text(X1, ay + 30, "time on one SM (µs)", size=10, anchor="end", fill="muted")

    # Prediction beside the chart: per-unit work per iteration and the bound.
    y = ay + 46
    c.text(14, y, f"Predicted {fmt_us(pred.period)} per KV iteration (steady state) · bound: "
                  f"{unit_name[pred.bound]}", size=13, weight="600")
    y += 8
    for i, u in enumerate(u for u in schedule.UNITS if u != "epilogue"):
        yy = y + 8 + i * 22
        busy = pred.busy[u]
        util = pred.utilisation(u)
        c.text(14, yy + 11, unit_name[u], size=11, fill="muted")
        c.rect(X0, yy, (X1 - X0 - 250), 14, fill="panel", stroke="grid", rx=2)
        c.rect(X0, yy, (X1 - X0 - 250) * min(util, 1.0), 14, fill=schedule_colour(u), stroke=None, rx=2)
        c.text(X1 - 240, yy + 11, f"{fmt_us(busy)} of work per iteration · {util * 100:.0f}% busy", size=11)
    kinds = {s.op.kind for s in slots}
    merged: dict[str, list[str]] = {}  # one swatch per colour
    for kind, col, label in LEGEND:
        if kind in kinds:
            merged.setdefault(col, []).append(label)
    items = [(col, " / ".join(labels)) for col, labels in merged.items()]
    c.legend(14, height - 10, items, size=11)
    cap = (f"Placed by the schedule model (site_gen/diagrams/schedule.py) from stage {stage.id}'s "
           f"`[[schedule]]`: ops in program order per role, asynchronous copies prefetched as their "
           f"`after` dependencies allow, one op at a time per unit. Rates: {rates.ASSUMPTIONS}. "
           f"Warps of one role are modelled in lockstep; latencies are not modelled, only throughput. "
           f"Bars alternate shade by iteration; the number in a bar is its KV iteration.")
    return Diagram(did, title, "timeline", stage.number, c.tostring(), cap, W, height)


def schedule_colour(unit: str) -> str:
    return {"load": "load", "tensor": "tensor", "softmax": "softmax", "epilogue": "epilogue"}[unit]


def _tick(end: float) -> float:
    """A round tick step (in seconds) giving 5-10 ticks."""
    us = end * 1e6
    for step in (0.05, 0.1, 0.2, 0.25, 0.5, 1, 2, 2.5, 5, 10, 20, 50):
        if us / step <= 10:
            return step * 1e-6
    return 100e-6
