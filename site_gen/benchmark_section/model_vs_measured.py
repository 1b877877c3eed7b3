"""The overview's model-against-measurement view: per stage, the TFLOP/s the schedule model
predicts and the TFLOP/s the benchmark measured (8k, non-causal: the traces' shape), as an inline
SVG in the site's fonts and theme, and a table that adds the time per K/V step from the traces.
Where the model is blind (latencies, co-resident CTAs, issue costs), the gap is plain.
"""

from __future__ import annotations

from dataclasses import dataclass

from hopattn.records import results, traces

from ..diagrams import rates, schedule
from ..diagrams.diagram import Diagram
from ..diagrams.section import figures
from ..diagrams.svg import Canvas, text_width
from ..diagrams.timeline_section import step_comparison
from ..diagrams.trace_timeline import fmt_ns
from ..html import inline_markdown

SHAPE = "8k"
W, H = 860, 410
X0, X1, Y0, Y1 = 64, 846, 84, 340  # plot area; Y0 is the top
TOP = 1100.0  # TFLOP/s at the top of the axis: room for the labels above a bar at the peak


@dataclass(frozen=True)
class Row:
    stage: object
    predicted_tflops: float
    measured_tflops: float | None  # the benchmark, untraced
    measured_stale: bool
    step: object  # StepComparison or None (no trace)
    trace_stale: bool


def predicted_tflops(stage) -> float:
    """The model's steady state for the whole GPU: one K/V step's FLOPs per period on every SM."""
    flops = 4 * stage.block_m * stage.block_n * stage.head_dim
    return flops / schedule.predict(stage).period * rates.SMS / 1e12


def rows(inp) -> list[Row]:
    main = inp.results[0] if inp.results else None
    shape = SHAPE if main is None or SHAPE in main.shapes() else (main.shapes() or [SHAPE])[0]
    out = []
    for s in inp.stages:
        entry = main.stage(s.id, shape, False) if main else None
        ok = entry is not None and entry.get("status") == "ok" and entry.get("tflops")
        rec = inp.trace(s, False)
        out.append(Row(s, predicted_tflops(s), entry["tflops"] if ok else None,
                       bool(ok) and results.is_stale(entry, inp.hashes[s.id]),
                       step_comparison(s, rec) if rec else None, rec is not None and traces.is_stale(rec, s)))
    return out


def chart(data: list[Row]) -> Diagram:
    did = "model-vs-measured"
    title = "The schedule model against the GPU, per stage"
    desc = ("Bar chart: for each stage, the TFLOP/s the schedule model predicts (outlined bar) and the TFLOP/s "
            "measured on the H200 at 8k non-causal (solid bar), with the measured share of the prediction above.")
    c = Canvas(did, W, H, title, desc)
    c.text(12, 22, "Predicted and measured TFLOP/s per stage (8k, non-causal)", size=14, weight="600")
    # legend by hand: an outline for the model, a solid swatch for the measurement
    x = 12.0
    for swatch, label in (("model", "predicted by the schedule model"), ("measured", "measured (benchmark, untraced)"),
                          (None, "above the bars: measured ÷ predicted")):
        if swatch == "model":
            c.rect(x, 33, 14, 12, fill="panel", stroke="tensor", sw=1.5, rx=1, dash="3 2")
        elif swatch == "measured":
            c.rect(x, 33, 14, 12, fill="q", stroke=None, rx=1)
        tx = x + (19 if swatch else 0)
        c.text(tx, 44, label, size=13, fill="muted")
        x = tx + text_width(label, 13) + 22

    def y_of(v: float) -> float:
        return Y1 - (Y1 - Y0) * min(v, TOP) / TOP

    for v in range(0, 1001, 200):
        y = y_of(v)
        c.line(X0, y, X1, y, stroke="grid")
        c.text(X0 - 6, y + 4, f"{v}", size=13, anchor="end", fill="muted")
    c.text(X0 - 6, Y0 - 4, "TFLOP/s", size=13, anchor="end", fill="muted")
    peak = 989.0  # the early stages' bars are low: the label sits above the line on the left
    c.line(X0, y_of(peak), X1, y_of(peak), stroke="bar", dash="6 3")
    c.text(X0 + 6, y_of(peak) - 6, "989: the datasheet's dense bf16 peak", size=13, fill="bar")
    n = max(len(data), 1)
    slot = (X1 - X0) / n
    g = c.group("bars")
    for i, r in enumerate(data):
        x = X0 + i * slot
        pw, mw = slot * 0.72, slot * 0.44
        py = y_of(r.predicted_tflops)
        el = c.rect(x + (slot - pw) / 2, py, pw, Y1 - py, fill="panel", stroke="tensor", sw=1.5, rx=1, dash="3 2",
                    parent=g)
        el.set_desc(title=f"stage {r.stage.id}: the model predicts {r.predicted_tflops:.0f} TFLOP/s")
        label = r.stage.id + ("*" if r.measured_stale or r.trace_stale else "")
        c.text(x + slot / 2, Y1 + 18, label, size=13, anchor="middle", fill="fg")
        if r.measured_tflops is None:
            c.text(x + slot / 2, Y1 - 6, "—", size=13, anchor="middle", fill="muted")
            continue
        my = y_of(r.measured_tflops)
        el = c.rect(x + (slot - mw) / 2, my, mw, Y1 - my, fill="q", stroke=None, rx=1, parent=g)
        el.set_desc(title=f"stage {r.stage.id}: measured {r.measured_tflops:.0f} TFLOP/s, "
                          f"{r.measured_tflops / r.predicted_tflops * 100:.0f} % of the model's "
                          f"{r.predicted_tflops:.0f}")
        share = r.measured_tflops / r.predicted_tflops
        c.text(x + slot / 2, min(py, my) - 6, f"{share * 100:.0f}%", size=13, anchor="middle", fill="fg")
    c.line(X0, Y1, X1, Y1, stroke="stroke")
    c.text((X0 + X1) / 2, Y1 + 40, "stage (* : a number or trace measured on older sources)", size=13,
           anchor="middle", fill="muted")
    cap = ("The model (site_gen/diagrams/schedule.py) places each stage's `[[schedule]]` ops at the H200's "
           f"throughputs ({rates.ASSUMPTIONS}) and knows no latencies, no issue costs and no second CTA on the SM; "
           "the measurement is the benchmark's median at batch 4, 16 heads, length 8192. Hover a bar for its number.")
    return Diagram(did, title, "chart", None, c.tostring(), cap, W, H)


def table(data: list[Row]) -> str:
    head = ("| Stage | model's bound | predicted per K/V step | measured per step (traced, at the model's clock) | traced build's "
            "overhead | predicted TFLOP/s | measured TFLOP/s | measured ÷ predicted |\n"
            "|---|---|--:|--:|--:|--:|--:|--:|")
    lines = [head]
    for r in data:
        s = r.stage
        pred = schedule.predict(s)
        step = r.step
        measured_step = ((fmt_ns(step.scaled_ns) + (f" ({fmt_ns(step.measured_ns)} at {step.clock_mhz:.0f} MHz)"
                                                     if step.model_mhz else "") + (" (stale)" if r.trace_stale else ""))
                         if step else "—")
        overhead = f"{step.overhead_pct:+.1f} %" if step else "—"
        tf = f"{r.measured_tflops:.0f}" + (" (stale)" if r.measured_stale else "") if r.measured_tflops else "—"
        share = f"{r.measured_tflops / r.predicted_tflops:.2f}" if r.measured_tflops else "—"
        lines.append(f"| [{s.id}](stages/{s.name}.md#timeline) | {schedule.UNIT_LABEL[pred.bound]} | "
                     f"{fmt_ns(pred.period * 1e9)} | {measured_step} | {overhead} | {r.predicted_tflops:.0f} | "
                     f"{tf} | {share} |")
    return "\n".join(lines) + "\n"


def overview_section(inp, site) -> str:
    """The Markdown of the overview's model-against-measurement section (chart as a fragment, then
    the table)."""
    data = rows(inp)
    d = chart(data)
    intro = inline_markdown(
        "Every stage's timeline sets the model's prediction beside what the GPU did; here is the whole lineage "
        "at once. The model is a throughput bound: where the solid bar falls short of the outline, something "
        "the model does not see — latencies, instruction issue, a second CTA sharing the SM — sets the pace. "
        "The stage pages' timelines show which.")
    fragment = site.add_fragment("model-vs-measured", intro + "\n" + figures([d], site, depth=0))
    return (fragment + "\n" + "Per K/V step, from the committed traces (the traced build runs slower than the plain "
            "one by the overhead shown; its times show the protocol, not exact speed). The measured step is "
            "given in the cycles it took at the clock the model's binding rate holds at (the tensor cores' 989 "
            "TFLOP/s: 1.83 GHz; memory: as recorded), and in brackets as recorded, at the SM clock of the recorded "
            "launch (the H200 ran the late stages' traces at 1.2 to 1.55 GHz, heated by the run):\n\n"
            + table(data))
