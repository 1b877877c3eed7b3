"""Part II's numbers: each RMSNorm stage's #benchmark section and headline cards, the overview's table
and the climb (GB/s per stage at each row length against the copy ceiling timed in the same run); the
same for Part II's other lineages (pages/part_ii.py passes its folder, command and what its GB/s counts).

They come from bench/results/<folder>/<gpu>.json (hopattn.records.rowwise, written by
``python -m bench.rowwise`` and its siblings): one run a file, every ratio taken within it. Where there is no file, or
no entry of a stage, the page says so plainly: "Not measured yet". Pure functions of the records:
the same numbers give the same bytes.
"""

from __future__ import annotations

from html import escape

from hopattn.records import rowwise as records

from ..diagrams.diagram import Diagram
from ..diagrams.svg import Canvas, text_width
from .tables import STALE, md_cell

NOT_MEASURED = "Not measured yet"
COMMAND = "python -m bench.rowwise"
GPU_COMMAND = "bash research/rmsnorm/gpu_run.sh"
LENGTHS = ("4k", "16k", "64k", "256k")  # the cards, the overview's columns and the climb's lines
PEERS = (("eager", "eager", "eager PyTorch"), ("compile", "compile", "torch.compile"), ("liger", "Liger", "Liger"),
         ("quack", "QuACK", "QuACK"))
GBPS = ("GB/s = (bytes of x read + bytes of out written) / median time, bf16 in and out, the weight not counted; "
        "ratios are medians of per-round ratios within the run (> 1 is faster)")
W = 860
STYLE = {"4k": ("muted", 1.4, "circle"), "8k": ("o", 1.4, "square"), "16k": ("tensor", 2.0, "circle"),
         "64k": ("v", 2.0, "square"), "256k": ("s", 2.4, "circle"),
         "32k": ("q", 2.0, "square"), "128k": ("p", 2.0, "circle")}  # the cross-entropy's lengths


def _ok(e) -> bool:
    return e is not None and e.get("status") == "ok"


def ratio_text(x: float) -> str:
    """A ratio as the tables and cards write it: three decimals (the records' precision; two would show
    0.9286 as 0.93, at the issue's target), one above 10."""
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def _ratio(x) -> str:
    return "–" if x is None else f"{ratio_text(x)}×"


def _arm(stage) -> str:
    return f"stage {stage.id}"


def measured(stage, res) -> bool:
    return any(e["arm"] == _arm(stage) for e in res.entries)


def stage_table(stage, prev, current_hash: str, res) -> str:
    """The #benchmark table of one stage in one GPU's record ("" when the record has no entry of it), then the
    configuration that ran at each length (or why nothing ran), listed below it: in a column, its long text
    wrapped a word a line on a phone and made every row tall."""
    peers = [(k, s) for k, s, _ in PEERS if any(_ok(res.entry(k, size)) for size in res.sizes())]
    rows, ran, stale_seen = [], [], False
    for size in res.sizes():
        e = res.entry(_arm(stage), size)
        if e is None:
            continue
        if not _ok(e):
            cells = [size, e["status"], "", "", "", "", *[""] * len(peers), ""]
            rows.append("| " + " | ".join(cells) + " |")
            ran.append(f"- {size}: {e['status']}: {escape(' '.join(e.get('reason', '').split()), quote=False)}")
            continue
        stale = records.is_stale(e, current_hash)
        stale_seen |= stale
        vs = e.get("vs") or {}
        prev_ratio = _ratio(vs.get(_arm(prev))) if prev is not None else "–"
        err = f"{e['max_rel_err']:.1e}" if e.get("max_rel_err") is not None else "–"
        rows.append(f"| {size} | **{e['gbps']:.0f}**{f' {STALE}' if stale else ''} | {e['median_ms']:.4f} | "
                    f"{e['spread_pct']:.1f} % | {_ratio(vs.get('copy'))} | {prev_ratio} | "
                    + "".join(f"{_ratio(vs.get(k))} | " for k, _ in peers) + f"{err} |")
        if e.get("variant"):
            # the configuration that ran, as the stage describes it ("row in registers<bf16, 64 threads/row, ...>"):
            # its angle brackets escaped, or the browser takes "<bf16, ...>" for a tag and shows none of it
            ran.append(f"- {size}: {escape(e['variant'], quote=False)}")
    if not rows:
        return ""
    prev_head = f"vs {prev.id}" if prev is not None else "vs previous"
    head = ("| Row length | GB/s | Median ms | Spread | × copy | " + prev_head + " | "
            + "".join(f"vs {s} | " for _, s in peers) + "Max rel. error |\n"
            + "|---|---:|---:|---:|---:|---:|" + "---:|" * len(peers) + "---:|")
    out = [head, *rows, ""]
    if ran:
        out += ["The configuration that ran, at each length:", "", *ran, ""]
    if stale_seen:
        out.append(f"{STALE}: measured on an older version of this stage's sources (now `{current_hash}`).\n")
    return "\n".join(out)


def stage_section(stage, prev, current_hash: str, all_results: list, *, folder: str = "rmsnorm",
                  command: str = COMMAND, gbps: str = GBPS, gpu_command: str | None = GPU_COMMAND,
                  figures: bool = True) -> str:
    """``folder``, ``command``, ``gbps``: the lineage's results folder, the command that writes them and
    what its GB/s counts; ``gpu_command``: the script that builds, tests and times in one (None: none);
    ``figures``: the page has figures drawn from the spec."""
    parts = []
    for res in all_results:
        table = stage_table(stage, prev, current_hash, res)
        if table:
            parts.append(f"Measured on {res.gpu_name} (run {res.run['date']}, `bench/results/{folder}/{res.gpu}.json`); "
                         f"{gbps}.\n\n" + table)
    if not parts:
        where = ", ".join(f"`bench/results/{folder}/{r.gpu}.json`" for r in all_results) or \
            f"`bench/results/{folder}/<gpu>.json`"
        script = f" (`{gpu_command}` builds, tests and times in one command)" if gpu_command else ""
        until = ("Until then the figures above are the stage's own numbers, and its notes' prediction is a "
                 "prediction." if figures else "Until then its notes' prediction is a prediction.")
        return (f"**{NOT_MEASURED}.** The record ({where}) holds no entry of this stage: `{command}` on a GPU "
                f"times it against the copy ceiling, eager PyTorch, torch.compile, Liger and QuACK in the same run"
                f"{script}. {until}\n")
    return "\n".join(parts)


def headline(stage, current_hash: str, all_results: list, lengths: tuple = LENGTHS) -> str:
    """Cards: GB/s and × copy at each length (``lengths``: the lineage's), or one card saying it is not
    measured yet."""
    res = all_results[0] if all_results else None
    found = {size: res.entry(_arm(stage), size) for size in lengths} if res else {}
    if not any(found.values()):
        return ('<div class="hd-cards"><div class="hd-card hd-card-off"><div class="hd-card-head">'
                f'GB/s, 4k to 256k</div><div class="hd-card-note">{NOT_MEASURED}</div></div>'
                '<div class="hd-card-where"><a href="#benchmark">why, and how to measure it</a></div></div>')
    cards = []
    for size in lengths:
        e = found[size]
        if not _ok(e):
            why = NOT_MEASURED if e is None else (e.get("reason") or e["status"])
            cards.append(f'<div class="hd-card hd-card-off"><div class="hd-card-head">{size}</div>'
                         f'<div class="hd-card-note">{escape(why)}</div></div>')
            continue
        stale = STALE if records.is_stale(e, current_hash) else ""
        copy = (e.get("vs") or {}).get("copy")
        lines = [f'<div class="hd-card-head">{size}</div>',
                 f'<div class="hd-card-value">{e["gbps"]:.0f} <span>GB/s</span>{stale}</div>']
        if copy:
            lines.append(f'<div class="hd-card-line">{ratio_text(copy)}× the copy, same run</div>')
        cards.append('<div class="hd-card">' + "".join(lines) + "</div>")
    where = f'<div class="hd-card-where">{escape(res.gpu_name)}, bf16; <a href="#benchmark">every length</a></div>'
    return '<div class="hd-cards">' + "".join(cards) + where + "</div>"


def overview_table(stages, hashes: dict[str, str], res) -> str:
    """The stages at a glance: the one change, and GB/s at each length (or "not measured yet")."""
    out = ["| Stage | " + " | ".join(LENGTHS) + " |", "|---|" + "---:|" * len(LENGTHS)]
    for s in stages:
        cells = []
        for size in LENGTHS:
            e = res.entry(_arm(s), size) if res else None
            if _ok(e):
                copy = (e.get("vs") or {}).get("copy")
                mark = f" {STALE}" if records.is_stale(e, hashes[s.id]) else ""
                cells.append(f"**{e['gbps']:.0f}**{mark}" + (f"<br><small>{ratio_text(copy)}× copy</small>" if copy else ""))
            else:
                cells.append("not measured yet" if e is None else e["status"])
        out.append(f"| [{s.id} · {md_cell(s.title.split(':')[0])}]({s.name}.md) | " + " | ".join(cells) + " |")
    if res:
        for arm, label in [("copy", "copy (the ceiling)")] + [(k, lbl) for k, _s, lbl in PEERS]:
            row = [res.entry(arm, size) for size in LENGTHS]
            if any(_ok(e) for e in row):
                out.append(f"| *{label}* | " + " | ".join(f"*{e['gbps']:.0f}*" if _ok(e) else "–" for e in row) + " |")
    return "\n".join(out) + "\n"


# --- the climb ---------------------------------------------------------------------------------


def stage_label(stage) -> str:
    """How the climb names a stage: its id and its title up to the first colon."""
    return f"{stage.id} {stage.title.split(':')[0]}"


def climb_data(stages, res, label=stage_label, lengths: tuple = LENGTHS) -> dict:
    """{"series": {length: [(stage number, GB/s)]}, "copy": {length: GB/s}, "peers": {key: {length: GB/s}},
    "stages": [(number, label)]} from one run, at ``lengths`` (the lineage's)."""
    series, copy, peers = {}, {}, {}
    for size in lengths:
        pts = [(s.number, float(e["gbps"])) for s in stages if _ok(e := res.entry(_arm(s), size))]
        if pts:
            series[size] = pts
        if _ok(e := res.entry("copy", size)):
            copy[size] = float(e["gbps"])
        for key, _short, _label in PEERS:
            if _ok(p := res.entry(key, size)):
                peers.setdefault(key, {})[size] = float(p["gbps"])
    return {"series": series, "copy": copy, "peers": peers,
            "stages": [(s.number, label(s)) for s in stages]}


def _marker(c, x, y, size):
    colour, _sw, kind = STYLE.get(size, ("fg", 1.4, "circle"))
    if kind == "circle":
        c.circle(x, y, 3.4, fill=colour, stroke="bg", sw=0.8)
    else:
        c.rect(x - 3.2, y - 3.2, 6.4, 6.4, fill=colour, stroke="bg", sw=0.8, rx=0)


def empty_climb(stages) -> Diagram:
    """The climb's frame while nothing is measured: the stages on their axis, no point, no ceiling, and
    "Not measured yet" where the lines will be."""
    labels = [(s.number, f"{s.id} {s.title.split(':')[0]}") for s in stages]
    label_w = max((text_width(lbl, 12) for _, lbl in labels), default=60)
    x0, x1, y0, y1 = 84, W - 150, 60, 300
    step = (x1 - x0) / max(1, len(labels))
    title = "The RMSNorm climb: GB/s per stage against the copy"
    desc = ("The frame of the climb: the RMSNorm stages along the axis, and no measurement yet: no stage, copy or "
            "peer has been timed on a GPU.")
    c = Canvas("climb-rmsnorm", W, int(y1 + label_w * 0.66 + 70), title, desc)
    c.heading(title, " (not measured yet)")
    c.rect(x0, y0, x1 - x0, y1 - y0, fill="panel", stroke="grid", rx=0)
    c.line(x0, y1, x1, y1, stroke="stroke")
    c.text(x0 - 6, y0 + 4, "GB/s", size=12, anchor="end", fill="muted")
    for i, (_n, label) in enumerate(labels):
        x = x0 + (i + 0.5) * step
        c.line(x, y1, x, y1 + 4, stroke="stroke")
        c.text(x + 4, y1 + 18, label, size=12, anchor="end", rotate=-40)
    c.text((x0 + x1) / 2, (y0 + y1) / 2 - 6, NOT_MEASURED, size=20, anchor="middle", weight="700", fill="muted")
    c.text((x0 + x1) / 2, (y0 + y1) / 2 + 18, f"{COMMAND} on a GPU draws a line per row length here,", size=12,
           anchor="middle", fill="muted", mono=False)
    c.text((x0 + x1) / 2, (y0 + y1) / 2 + 36, "and the copy of the same run as each length's ceiling.", size=12,
           anchor="middle", fill="muted")
    cap = f"{NOT_MEASURED}: no record in `bench/results/rmsnorm/`; the frame waits for `{COMMAND}` on a GPU."
    return Diagram("climb-rmsnorm", title, "chart", None, c.tostring(), cap, W, c.height)


COUNTS = "GB/s counts one read of x and one write of the output."


def climb_diagram(data: dict, gpu_name: str, date: str, *, chart_id: str = "climb-rmsnorm", label: str = "RMSNorm",
                  counts: str = COUNTS) -> Diagram | None:
    """GB/s per stage at each length, the copy ceiling of the same run dashed at each length, the
    peers in columns to the right; None while no stage is measured (the page says so). ``chart_id``,
    ``label``, ``counts``: the lineage's (the RMSNorm forward's by default)."""
    if not data["series"]:
        return None
    title = f"The {label} climb: GB/s per stage against the copy"
    values = [v for pts in data["series"].values() for _, v in pts] + list(data["copy"].values())
    values += [v for p in data["peers"].values() for v in p.values()]
    ymax = max(500.0, (int(max(values) / 500) + 1) * 500)
    label_w = max((text_width(lbl, 12) for _, lbl in data["stages"]), default=60)
    below = label_w * 0.66 + 24
    x0, x1, y0, y1 = 84, W - 150, 60, 360
    numbers = [n for n, _ in data["stages"]]
    peers = [(k, s) for k, s, _ in PEERS if k in data["peers"]]
    columns = len(numbers) + (0.6 + len(peers) if peers else 0)
    step = (x1 - x0) / columns
    # the first stage's label, rotated 40°, reaches cos 40° of its width left of its tick: room for it
    first = text_width(data["stages"][0][1], 12) * 0.77 if data["stages"] else 0
    for _ in range(3):
        if x0 + step / 2 + 4 - first < 6:
            x0 = 6 + first - 4 - step / 2
            step = (x1 - x0) / columns

    def x(n):
        return x0 + (numbers.index(n) + 0.5) * step

    def xp(i):
        return x0 + (len(numbers) + 0.6 + i + 0.5) * step

    def y(v):
        return y1 - (y1 - y0) * v / ymax

    desc = (f"GB/s of every measured {label} stage on the {gpu_name} at rows of {', '.join(data['series'])} bf16 "
            "columns; dashed, the device-to-device copy of the same bytes timed in the same run, at each length; "
            "right of the stages, the peers (eager PyTorch, torch.compile, Liger, QuACK) at each length.")
    height = y1 + below + 110
    c = Canvas(chart_id, W, int(height), title, desc)
    c.heading(title, f" ({gpu_name}, bf16)")
    for tick in range(0, int(ymax) + 1, 500):
        c.line(x0, y(tick), x1, y(tick), stroke="grid", sw=0.8)
        c.text(x0 - 6, y(tick) + 4, f"{tick:,}", size=12, anchor="end", fill="muted")
    c.line(x0, y1, x1, y1, stroke="stroke")
    for n, label in data["stages"]:
        c.text(x(n) + 4, y1 + 18, label, size=12, anchor="end", rotate=-40)
    if peers:
        sep = x0 + (len(numbers) + 0.3) * step
        c.line(sep, y0, sep, y1, stroke="stroke", sw=1, dash="2 3")
        for i, (_k, short) in enumerate(peers):
            c.text(xp(i) + 4, y1 + 18, short, size=12, anchor="end", rotate=-40, fill="muted", weight="700")
    placed = []
    for size, v in sorted(data["copy"].items(), key=lambda kv: -kv[1]):
        colour = STYLE.get(size, ("fg",))[0]
        c.line(x0, y(v), x1, y(v), stroke=colour, sw=1.2, dash="6 4")
        ly = y(v) + 4
        while any(abs(ly - p) < 15 for p in placed):
            ly += 15
        placed.append(ly)
        c.text(x1 + 6, ly, f"{size}: copy {v:,.0f}", size=12, fill=colour, weight="700")
    for i, (key, _short) in enumerate(peers):
        for size, v in data["peers"][key].items():
            _marker(c, xp(i), y(v), size)
    lx, ly = 12, y1 + below + 10  # the lengths' key, below the axis labels: the plot stays clear
    c.text(lx, ly + 4, "Row length:", size=12, fill="muted")
    lx += text_width("Row length:", 12) + 10
    for size in data["series"]:  # the lengths of the data, in its order
        pts = data["series"].get(size)
        if not pts:
            continue
        colour, sw, _kind = STYLE[size]
        c.path([(x(n), y(v)) for n, v in pts], stroke=colour, sw=sw)
        for n, v in pts:
            _marker(c, x(n), y(v), size)
        c.line(lx, ly, lx + 22, ly, stroke=colour, sw=sw)
        _marker(c, lx + 11, ly, size)
        c.text(lx + 28, ly + 4, size, size=12, weight="700", fill=colour)
        lx += 28 + text_width(size, 12, bold=True) + 18
    yb = ly + 30
    c.text(12, yb, "Dashed: the device-to-device copy of the same bytes, timed in the same run: the ceiling at each "
                   "length.", size=12, fill="muted")
    c.text(12, yb + 18, "Right of the stages: the peers at each length (eager PyTorch, torch.compile, Liger, QuACK).",
           size=12, fill="muted")
    c.height = int(yb + 30)
    cap = (f"One run ({date}): the stages, the copy and the peers timed in it, so each ratio is a same-run ratio "
           "(a stage without points was not in the run). "
           f"{counts}")
    return Diagram(chart_id, title, "chart", None, c.tostring(), cap, W, c.height)


# --- the targets ---------------------------------------------------------------------------------

TARGET_COPY, TARGET_QUACK = 0.93, 1.00  # issue #30: at every length, forward and backward


def best_stage(stages, res, size: str) -> tuple | None:
    """(stage, its entry) of the fastest measured stage of one run at one length (None: none measured)."""
    found = [(s, e) for s in stages if _ok(e := res.entry(_arm(s), size))]
    return max(found, key=lambda se: se[1]["gbps"]) if found else None


def targets_table(lineages: list[tuple[str, str, list, object]]) -> str:
    """Each lineage's fastest stage at every length of the records against the copy and QuACK of the same run, and
    whether it reaches the targets (≥ 0.93× the copy and ≥ 1.00× QuACK); ``lineages``: (label, the pages'
    folder relative to this page, stages, main record). "" when no lineage has a record."""
    rows = []
    present = {size for _l, _w, _s, res in lineages if res is not None for size in res.sizes()}
    sizes = [size for size in records.SIZE_ORDER if size in present]  # every length some record has
    for label, where, stages, res in lineages:
        if res is None:
            continue
        cells = []
        for size in sizes:
            best = best_stage(stages, res, size)
            if best is None:
                cells.append("not in the run" if res.entry("copy", size) is None else "–")
                continue
            s, e = best
            vs = e.get("vs") or {}
            copy, quack = vs.get("copy"), vs.get("quack")
            met = copy is not None and copy >= TARGET_COPY and quack is not None and quack >= TARGET_QUACK
            bold = "**" if met else ""
            cells.append(f"{bold}{_ratio(copy)} copy{bold}<br>{bold}{_ratio(quack)} QuACK{bold}"
                         f"<br><small>[stage {s.id}]({where}{s.name}.md#benchmark)"
                         f"{' · both targets' if met else ''}</small>")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    if not rows:
        return ""
    return "\n".join([
        f"The fastest stage of each lineage at each length, × the copy and × QuACK of the same run (> 1 is faster); "
        f"in bold where it reaches both of the part's targets, ≥ {TARGET_COPY:.2f}× the copy and "
        f"≥ {TARGET_QUACK:.2f}× QuACK. A dash under QuACK: QuACK did not run there.\n",
        "| Lineage | " + " | ".join(sizes) + " |",
        "|---|" + "---|" * len(sizes),
        *rows, ""])
