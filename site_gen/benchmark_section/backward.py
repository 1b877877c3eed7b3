"""The backward's numbers (Act V): each backward stage's #benchmark section and headline, the
overview's table and the backward climb (TFLOP/s per backward stage against the peers'
backwards: FlashAttention-4, cuDNN, FlashAttention-2, and FlashAttention-3 where its build has one).

Backward entries live in the results file's ``backward`` section (hopattn.records.results, schema 2:
per stage and mode, ``deterministic`` and each gradient's ``rel_errs``; TFLOP/s count 2.5× the
forward's FLOPs) and are read through ``GpuResults.backward``; a file without the section (schema 1)
reads as nothing measured. Where nothing is measured the page says so plainly: "Not measured yet".
Pure functions of the results: the same numbers give the same bytes.
"""

from __future__ import annotations

from html import escape

from hopattn.records import results

from ..diagrams.diagram import Diagram
from ..diagrams.svg import Canvas, text_width
from . import chart
from .tables import CROSS_RUN, STALE, md_cell

SHAPES = ("4k", "8k", "16k")
HEADLINE = "8k"
PEERS = (("fa4", "FA4", "FlashAttention-4"), ("cudnn", "cuDNN", "cuDNN"), ("fa2", "FA2", "FlashAttention-2"),
         ("fa3", "FA3", "FlashAttention-3"))
PEER_NAMES = {k: label for k, _s, label in PEERS}
NOT_MEASURED = "Not measured yet"
COMMAND = "python -m bench --what backward"
FLOPS = "TFLOP/s = 2.5 × 4·B·H·L²·D / time (halved for causal), the backward alone"


def entry(nums, kind: str, name: str, shape: str, causal: bool, deterministic: bool = False) -> dict | None:
    """A backward entry of one GPU's results (None: not in the file). Through GpuResults.backward; a
    results module without it (schema 1) has no backward entries."""
    get = getattr(nums, "backward", None)
    if callable(get):
        return get(kind, name, shape, causal, deterministic)
    return None


def entries(nums) -> list[dict]:
    return list(getattr(nums, "backward_entries", None) or [])


def _ok(e) -> bool:
    return e is not None and e.get("status") == "ok"


def shapes(nums) -> list[str]:
    found = {e["shape"] for e in entries(nums)}
    known = [s for s in results.SHAPE_ORDER if s in found]
    return known + sorted(found - set(known))


def measured(stage, nums) -> bool:
    """Whether this GPU's file holds any backward entry of the stage (any status)."""
    return any(e["kind"] == "stage" and e["name"] == stage.id for e in entries(nums))


def _ratio(x) -> str:
    return "–" if x is None else f"{x:.2f}×"


def _mode(deterministic: bool) -> str:
    return "deterministic" if deterministic else "default"


def stage_table(stage, prev, hashes: dict[str, str], nums) -> str:
    """The #benchmark table of one backward stage on one GPU ("" when it has no entry of it)."""
    rows, notes = [], []
    stale_seen = cross_seen = False
    peers = [(k, s) for k, s, _ in PEERS if any((e.get("ratios") or {}).get(k) for e in entries(nums)
                                                if e["kind"] == "stage" and e["name"] == stage.id)]
    for deterministic in (False, True):
        for causal in (False, True):
            for sh in shapes(nums):
                e = entry(nums, "stage", stage.id, sh, causal, deterministic)
                if e is None:
                    continue
                label = f"{sh}{' causal' if causal else ''}" + (" · deterministic" if deterministic else "")
                if not _ok(e):
                    cells = [label, e["status"]] + [""] * (3 + len(peers) + 2) + [md_cell(e.get("reason") or "")]
                    rows.append("| " + " | ".join(cells) + " |")
                    continue
                stale = results.is_stale(e, hashes[stage.id])
                stale_seen |= stale
                ratios = e.get("ratios") or {}
                p = entry(nums, "stage", prev.id, sh, causal, deterministic) if prev is not None else None
                vs_prev = _ratio(e["tflops"] / p["tflops"]) if _ok(p) and p["tflops"] else "–"
                if _ok(p) and p["run_id"] != e["run_id"]:
                    vs_prev += f" {CROSS_RUN}"
                    cross_seen = True
                errs = e.get("rel_errs") or {}
                err = " / ".join(f"{errs[g]:.1e}" if errs.get(g) is not None else "–" for g in ("dq", "dk", "dv"))
                vs_default = _ratio(e.get("vs_default")) if deterministic else ""
                mark = f" {STALE}" if stale else ""
                rows.append(f"| {label} | **{e['tflops']:.1f}**{mark} | {e['median_ms']:.4f} | "
                            f"{e['spread_pct']:.1f} % | " + " | ".join(_ratio(ratios.get(k)) for k, _ in peers)
                            + f" | {vs_prev} | {vs_default} | {err} |")
    if not rows:
        return ""
    prev_head = f"vs {prev.id}" if prev is not None else "vs previous"
    head = ("| Shape · mode | TFLOP/s | Median ms | Spread | " + "".join(f"vs {s} | " for _, s in peers)
            + f"{prev_head} | vs default | Rel. error dQ / dK / dV |\n"
            + "|---|---:|---:|---:|" + "---:|" * len(peers) + "---:|---:|---:|")
    if cross_seen:
        notes.append(f"{CROSS_RUN}: the two stages were timed in different runs.\n")
    if stale_seen:
        notes.append(f"{STALE}: measured on an older version of this stage's sources (the current hash is "
                     f"`{hashes[stage.id]}`).\n")
    return "\n".join([head, *rows, "", *notes])


def stage_section(stage, prev, hashes: dict[str, str], all_results: list) -> str:
    parts = []
    for nums in all_results:
        table = stage_table(stage, prev, hashes, nums)
        if table:
            head = (f"**{nums.gpu_name}**\n\n" if len(all_results) > 1 else
                    f"Measured on {nums.gpu_name}; bf16, head dim 128, {FLOPS}; ratios to each peer's backward timed "
                    "in the same run (> 1 is faster). Environment: [overview](../index.md#environment).\n\n")
            parts.append(head + table)
    if not parts:
        where = ", ".join(f"`bench/results/{n.gpu}.json`" for n in all_results) or "`bench/results/<gpu>.json`"
        return (f"**{NOT_MEASURED}.** The results file ({where}) holds no backward entry of this stage: "
                f"`{COMMAND}` on a GPU times it (its default mode and, where it has one, its deterministic mode, "
                "against the peers' backwards in the same run).\n")
    return "\n".join(parts)


def best_peer(e: dict) -> tuple[str, float] | None:
    """(peer, ratio) for the fastest peer of the entry's run: the smallest of its same-run ratios."""
    ratios = (e or {}).get("ratios") or {}
    if not ratios:
        return None
    key = min(ratios, key=lambda k: (ratios[k], k))
    return key, ratios[key]


def headline(stage, prev, hashes, all_results) -> str:
    """Cards at the top of the page: 8k backward TFLOP/s, or a card that says it is not measured yet."""
    nums = all_results[0] if all_results else None
    found = {cz: entry(nums, "stage", stage.id, HEADLINE, cz) if nums else None for cz in (False, True)}
    if found[False] is None and found[True] is None:
        return ('<div class="hd-cards"><div class="hd-card hd-card-off"><div class="hd-card-head">'
                f'{HEADLINE}, backward</div><div class="hd-card-note">{NOT_MEASURED}</div></div>'
                '<div class="hd-card-where"><a href="#benchmark">why, and how to measure it</a></div></div>')
    cards = []
    for causal in (False, True):
        e = found[causal]
        label = f"{HEADLINE} {'causal' if causal else 'non-causal'}, backward"
        if not _ok(e):
            why = NOT_MEASURED if e is None else (e.get("reason") or e["status"])
            cards.append(f'<div class="hd-card hd-card-off"><div class="hd-card-head">{escape(label)}</div>'
                         f'<div class="hd-card-note">{escape(why)}</div></div>')
            continue
        stale = STALE if results.is_stale(e, hashes[stage.id]) else ""
        lines = [f'<div class="hd-card-head">{escape(label)}</div>',
                 f'<div class="hd-card-value">{e["tflops"]:.0f} <span>TFLOP/s</span>{stale}</div>']
        best = best_peer(e)
        if best:
            lines.append(f'<div class="hd-card-line">{best[1]:.3f}× {escape(PEER_NAMES.get(best[0], best[0]))}, '
                         "same run</div>")
        det = entry(nums, "stage", stage.id, HEADLINE, causal, True)
        if _ok(det) and det.get("vs_default"):
            lines.append(f'<div class="hd-card-line">deterministic: {det["vs_default"]:.2f}× the default</div>')
        cards.append('<div class="hd-card">' + "".join(lines) + "</div>")
    where = (f'<div class="hd-card-where">{escape(nums.gpu_name)}, bf16, head dim 128; '
             '<a href="#benchmark">every shape</a></div>') if nums else ""
    return '<div class="hd-cards">' + "".join(cards) + where + "</div>"


# --- the backward climb --------------------------------------------------------------------------


def climb_data(stages, nums) -> dict:
    """As chart.progression_data, for the backward stages' default mode and the peers' backwards."""
    series: dict = {False: {}, True: {}}
    refs: dict = {False: {}, True: {}}
    runs: dict = {False: {}, True: {}}
    for causal in (False, True):
        for shape in SHAPES:
            pts = [(s.number, float(e["tflops"])) for s in stages
                   if _ok(e := entry(nums, "stage", s.id, shape, causal))]
            if pts:
                series[causal][shape] = pts
            for key, _short, _label in PEERS:
                p = entry(nums, "peer", key, shape, causal)
                if _ok(p):
                    refs[causal].setdefault(key, {})[shape] = float(p["tflops"])
                    runs[causal][key] = p["run_id"]
    return {"series": series, "refs": refs, "runs": runs,
            "stages": [(s.number, f"{s.id} {chart.short_name(s)}") for s in stages]}


def climb_diagram(data: dict, gpu_name: str) -> Diagram | None:
    """The backward climb, or None while no backward stage is measured (the page says so)."""
    if not data["series"][False] and not data["series"][True]:
        return None
    values = [v for cz in (False, True) for pts in data["series"][cz].values() for _, v in pts]
    values += [v for cz in (False, True) for p in data["refs"][cz].values() for v in p.values()]
    ymax = max(100.0, (int(max(values) / 100) + 1) * 100)
    label_w = max((text_width(lbl, 12) for _, lbl in data["stages"]), default=60)
    below = label_w * 0.66 + 24
    panels = [cz for cz in (False, True) if data["series"][cz]]
    height = 40 + len(panels) * (40 + 240 + below) + 60
    desc = (f"TFLOP/s of every measured backward stage on the {gpu_name} at 4k, 8k and 16k (backward alone, 2.5 × "
            "the forward's FLOPs), non-causal and causal; right of the stages, the backwards of FlashAttention-4, "
            "cuDNN and FlashAttention-2 at each shape, with a dashed line per shape at the fastest of them.")
    c = Canvas("climb-backward", chart.W, int(height), "The backward climb: TFLOP/s per backward stage", desc)
    c.heading("The backward climb: TFLOP/s per backward stage", f" ({gpu_name}, bf16, head dim 128)")
    x0, x1 = 84, chart.W - 150
    y = 60
    for cz in panels:
        numbers = [n for n, _ in data["stages"] if any(n == m for pts in data["series"][cz].values() for m, _ in pts)]
        chart._panel(c, data, cz, x0, x1, y, y + 240, ymax, numbers,
                     f"{'causal' if cz else 'non-causal'}: the backward stages' default mode", legend_right=True,
                     legend_at=ymax * 0.12, peer_table=PEERS)
        y += 240 + below + 40
    c.text(12, y - 10, "Right of the stages: the peers' backwards (FA4 = FlashAttention-4, FA2 = FlashAttention-2, "
                       "cuDNN) at each shape.", size=12, fill="muted")
    c.text(12, y + 8, "Dashed: the fastest of them at each shape, in that shape's colour.", size=12, fill="muted")
    c.height = int(y + 20)
    runs = sorted({r for cz in (False, True) for r in data["runs"][cz].values()})
    cap = ("Each backward stage's default mode, from the run that last timed it; the peers' points are their "
           f"backwards in run{'s' if len(runs) != 1 else ''} {', '.join(runs) or '(none)'}. The deterministic modes are "
           "in each stage's table.")
    return Diagram("climb-backward", "The backward climb: TFLOP/s per backward stage", "chart", None, c.tostring(),
                   cap, chart.W, c.height)


def overview_table(stages, hashes: dict[str, str], nums) -> str:
    """Act V at a glance: each backward stage, its one change, its 8k numbers (or "not measured yet")."""
    out = ["| Backward stage | 8k | 8k causal | 8k deterministic |", "|---|---:|---:|---:|"]
    for s in stages:
        link = f"[{s.id} · {md_cell(chart.short_name(s))}](backward/{s.name}.md)"
        cells = []
        for causal, det in ((False, False), (True, False), (False, True)):
            e = entry(nums, "stage", s.id, HEADLINE, causal, det) if nums else None
            if _ok(e):
                mark = f" {STALE}" if results.is_stale(e, hashes[s.id]) else ""
                best = best_peer(e)
                ref = f"<br><small>{best[1]:.2f}× {PEER_NAMES.get(best[0], best[0])}</small>" if best else ""
                cells.append(f"**{e['tflops']:.0f}**{mark}{ref}")
            else:
                cells.append("–" if e is None and det and not s.deterministic else
                             (e["status"] if e is not None else "not measured yet"))
        out.append(f"| {link} | " + " | ".join(cells) + " |")
    peers = []
    for key, _short, label in PEERS:
        row = [entry(nums, "peer", key, HEADLINE, cz) if nums else None for cz in (False, True)]
        if any(_ok(p) for p in row):
            peers.append(f"| *{label}* | " + " | ".join(f"*{p['tflops']:.0f}*" if _ok(p) else "–" for p in row)
                         + " | – |")
    return "\n".join(out + peers) + "\n"
