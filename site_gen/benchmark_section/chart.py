"""The climb: TFLOP/s per stage as inline SVG in the site's fonts and theme colours (the diagrams'
Canvas), one line per shape, the stage names on the axis, the reference peers in columns of their own
(a point per shape, in the shape's style) with the fastest one's number at each shape drawn across as
a dashed line of that shape's colour, so every line is set against the peers at its own shape; the
regressions annotated; the causal panel covers only the stages that have a causal path.

Pure function of the results: the same numbers give the same bytes.
"""

from __future__ import annotations

from hopattn.records.results import GpuResults

from ..diagrams.diagram import Diagram
from ..diagrams.svg import Canvas, text_width

W = 860
SHAPES = ("4k", "8k", "16k")  # the climb's shapes (the users' shapes have their own table)
HEADLINE = "8k"
PEERS = (("fa3", "FA3", "FlashAttention-3"), ("fa4", "FA4", "FlashAttention-4"), ("cudnn", "cuDNN", "cuDNN"))
SHAPE_STYLE = {"4k": ("muted", 1.4, "circle"), "8k": ("tensor", 2.4, "circle"), "16k": ("s", 1.4, "square")}
REGRESSION = 0.01  # a drop of more than 1 % at the headline shape is annotated


def short_name(stage) -> str:
    return stage.title.split(":")[0]


def progression_data(stages, nums: GpuResults) -> dict:
    """{"series": {causal: {shape: [(stage number, tflops)]}}, "refs": {causal: {peer: {shape: tflops}}},
    "runs": {causal: {peer: run id}}, "stages": [(number, label)]}."""
    series: dict = {False: {}, True: {}}
    refs: dict = {False: {}, True: {}}
    runs: dict = {False: {}, True: {}}
    for causal in (False, True):
        for shape in SHAPES:
            pts = []
            for s in stages:
                e = nums.stage(s.id, shape, causal)
                if e is not None and e["status"] == "ok":
                    pts.append((s.number, float(e["tflops"])))
            if pts:
                series[causal][shape] = pts
            for key, _short, _label in PEERS:
                p = nums.peer(key, shape, causal)
                if p is not None and p["status"] == "ok":
                    refs[causal].setdefault(key, {})[shape] = float(p["tflops"])
                    runs[causal][key] = p["run_id"]
    return {"series": series, "refs": refs, "runs": runs,
            "stages": [(s.number, f"{s.id} {short_name(s)}") for s in stages]}


def regressions(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """(stage number, relative change) where a stage is slower than the one before it."""
    out = []
    for (n0, a), (n1, b) in zip(points, points[1:]):
        if n1 == n0 + 1 and b < a * (1 - REGRESSION):
            out.append((n1, b / a - 1))
    return out


def fastest_peers(data: dict, causal: bool) -> dict[str, tuple[str, float]]:
    """{shape: (peer key, TFLOP/s)}: the fastest reference peer at each shape, by median TFLOP/s."""
    out = {}
    for shape in SHAPES:
        timed = [(v[shape], key) for key, v in data["refs"][causal].items() if shape in v]
        if timed:
            v, key = max(timed)
            out[shape] = (key, v)
    return out


def _marker(c, x, y, shape):
    colour, _sw, marker = SHAPE_STYLE[shape]
    if marker == "circle":
        c.circle(x, y, 3.2, fill=colour, stroke="bg", sw=0.8)
    else:
        c.rect(x - 3, y - 3, 6, 6, fill=colour, stroke="bg", sw=0.8, rx=0)


def _panel(c, data, causal, x0, x1, y0, y1, ymax, numbers, title, ymin=0, legend_at=None, legend_right=False,
           peer_table=PEERS):
    """One panel: a line per shape over the stages, then a column per reference peer with its point
    at each shape in that shape's style, and per shape a dashed line at the fastest peer's number, in
    the shape's colour: a stage's 16k point is set against the peers' 16k, never against their 8k."""
    labels = dict(data["stages"])
    peers = [(key, short) for key, short, _label in peer_table if data["refs"][causal].get(key)]
    gap = 0.6 if peers else 0.0  # between the last stage and the first peer, in columns
    step = (x1 - x0) / (len(numbers) + gap + len(peers))

    def x(n):
        return x0 + (numbers.index(n) + 0.5) * step

    def xp(i):
        return x0 + (len(numbers) + gap + i + 0.5) * step

    def y(v):
        return y1 - (y1 - y0) * (v - ymin) / (ymax - ymin)
    c.text(x0, y0 - 12, title, size=13, weight="700")
    for tick in range(int(ymin), int(ymax) + 1, 100):
        c.line(x0, y(tick), x1, y(tick), stroke="grid", sw=0.8)
        c.text(x0 - 6, y(tick) + 4, str(tick), size=12, anchor="end", fill="muted")
    c.line(x0, y1, x1, y1, stroke="stroke")
    for n in numbers:
        c.text(x(n) + 4, y1 + 18, labels[n], size=12, anchor="end", rotate=-40, fill="fg")
    if peers:
        sep = x0 + (len(numbers) + gap / 2) * step
        c.line(sep, y0, sep, y1, stroke="stroke", sw=1, dash="2 3")
        for i, (_key, short) in enumerate(peers):
            c.text(xp(i) + 4, y1 + 18, short, size=12, anchor="end", rotate=-40, fill="muted", weight="700")
    # Per shape, the fastest peer's number: dashed in the shape's colour, from the axis to its column.
    best = fastest_peers(data, causal)
    placed = []
    drawn = [sh for sh in SHAPES if sh in best and data["series"][causal].get(sh)]
    for shape in sorted(drawn, key=lambda sh: -best[sh][1]):  # labels top down, pushed apart downwards
        key, v = best[shape]
        colour, _sw, _marker_kind = SHAPE_STYLE[shape]
        end = xp([k for k, _ in peers].index(key)) if key in [k for k, _ in peers] else x1
        c.line(x0, y(v), end, y(v), stroke=colour, sw=1.2, dash="6 4")
        ly = y(v) + 4
        while any(abs(ly - p) < 15 for p in placed):
            ly += 15
        placed.append(ly)
        short = dict((k, sh) for k, sh, _ in peer_table)[key]
        c.text(x1 + 6, ly, f"{shape}: {short} {v:.0f}", size=12, fill=colour, weight="700")
    for i, (key, _short) in enumerate(peers):
        for shape in SHAPES:
            v = data["refs"][causal][key].get(shape)
            if v is not None and data["series"][causal].get(shape):
                _marker(c, xp(i), y(v), shape)
    # Shapes: one line each over the stages.
    ends = []
    for shape in SHAPES:
        pts = [(n, v) for n, v in data["series"][causal].get(shape, []) if n in numbers]
        if not pts:
            continue
        colour, sw, marker = SHAPE_STYLE[shape]
        c.path([(x(n), y(v)) for n, v in pts], stroke=colour, sw=sw)
        for n, v in pts:
            _marker(c, x(n), y(v), shape)
        ends.append((shape, pts[-1]))
    # The shapes' legend, where no line runs (given as a value, or the panel's top).
    width = sum(30 + text_width(sh, 12, bold=True) + 18 for sh, _ in ends)
    lx = (x0 + (len(numbers) + gap / 2) * step if peers else x1) - width if legend_right else x0 + 12
    ly = y(legend_at) if legend_at is not None else y0 + 12
    for shape, _ in ends:
        colour, sw, marker = SHAPE_STYLE[shape]
        c.line(lx, ly, lx + 24, ly, stroke=colour, sw=sw)
        _marker(c, lx + 12, ly, shape)
        c.text(lx + 30, ly + 4, shape, size=12, weight="700", fill=colour)
        lx += 30 + text_width(shape, 12, bold=True) + 18
    # Regressions at the headline shape.
    pts = [(n, v) for n, v in data["series"][causal].get(HEADLINE, []) if n in numbers]
    values = dict(pts)
    last = None  # (x, y) of the label before: a neighbour's label goes lower instead of on top of it
    for n, change in regressions(pts):
        label = f"{change * 100:.0f} %"
        ly = y(values[n]) + 22
        if last is not None and x(n) - last[0] < text_width(label, 12, bold=True) + 4 and abs(ly - last[1]) < 14:
            ly = last[1] + 14
        c.text(x(n), ly, label, size=12, anchor="middle", fill="bar", weight="700", cls="hd-text hd-halo")
        last = (x(n), ly)
    return x, y


def progression_diagram(data: dict, gpu_name: str) -> Diagram | None:
    """The climb as a Diagram (inline figure and standalone file), or None when nothing was measured."""
    if not data["series"][False] and not data["series"][True]:
        return None
    all_values = [v for c in (False, True) for pts in data["series"][c].values() for _, v in pts]
    all_values += [v for c in (False, True) for p in data["refs"][c].values() for v in p.values()]
    ymax = max(100.0, (int(max(all_values) / 100) + 1) * 100)
    numbers = [n for n, _ in data["stages"] if any(n == m for pts in data["series"][False].values() for m, _ in pts)]
    causal = [n for n, _ in data["stages"] if any(n == m for pts in data["series"][True].values() for m, _ in pts)]
    label_w = max((text_width(lbl, 12) for _, lbl in data["stages"]), default=60)
    below = label_w * 0.66 + 24
    h1 = 300
    height = 40 + h1 + below + (40 + 220 + below if causal else 0) + 50
    desc = (f"TFLOP/s of every stage on the {gpu_name} at 4k, 8k and 16k (non-causal), and of the stages with a "
            "causal path (causal). Right of the stages, FlashAttention-3, FlashAttention-4 and cuDNN at each shape; a "
            "dashed line per shape, in its colour, at the fastest of them at that shape. Drops from one stage to the "
            "next at 8k are marked in per cent.")
    c = Canvas("climb", W, int(height), "The climb: TFLOP/s per stage", desc)
    c.heading("The climb: TFLOP/s per stage", f" ({gpu_name}, bf16, head dim 128)")
    x0, x1 = 84, W - 150
    y0 = 60
    if numbers:
        # the legend bottom right: the late stages are far above it
        _panel(c, data, False, x0, x1, y0, y0 + h1, ymax, numbers, "non-causal: every stage",
               legend_at=ymax * 0.12, legend_right=True)
    y = y0 + h1 + below + 40
    if causal:
        width = min(x1 - x0, 90 * (len(causal) + 3.6) + 60)
        lowest = min([v for pts in data["series"][True].values() for n, v in pts if n in causal]
                     + [v for p in data["refs"][True].values() for v in p.values()])
        _panel(c, data, True, x0, x0 + width, y, y + 220, ymax, causal,
               f"causal: stages {causal[0]:02d}–{causal[-1]:02d}, the ones with a causal path (axis from "
               f"{int(lowest / 100) * 100 - 100})", ymin=max(0, int(lowest / 100) * 100 - 100))
        y += 220 + below
    c.text(12, y + 14, "Right of the stages: the reference peers (FA3 = FlashAttention-3, FA4 = FlashAttention-4, "
                       "cuDNN) at each shape, same run.", size=12, fill="muted")
    c.text(12, y + 32, "Dashed: the fastest of them at each shape, in that shape's colour, so each line meets the "
                       "peers at its own shape.", size=12, fill="muted")
    c.text(12, y + 50, "Red per cent: slower than the stage before at 8k.", size=12, fill="muted")
    c.height = int(y + 62)
    runs = sorted({r for cz in (False, True) for r in data["runs"][cz].values()})
    cap = ("Each stage's own entry, from the run that last timed it; the peers' points and dashed lines are their numbers in run"
           f"{'s' if len(runs) > 1 else ''} {', '.join(runs)}. Ratios to a peer are only ever taken within one run: "
           "see the tables below and each stage's page.")
    return Diagram("climb", "The climb: TFLOP/s per stage", "chart", None, c.tostring(), cap, W, c.height)
