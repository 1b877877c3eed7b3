"""The progression chart: TFLOP/s per stage, one line per shape, non-causal and causal side by side.

Deterministic SVG: fixed hash salt (element ids), no date in the metadata, the bundled DejaVu font
drawn as paths, fixed size. The background stays transparent and text and axes use a mid grey, so
one file reads on both the light and the dark theme when shown as <img>.
"""

from __future__ import annotations

import io

from hopattn.records.results import GpuResults

WIDTH_IN, HEIGHT_IN = 10.0, 4.0  # 720 x 288 pt
SHAPE_COLOURS = ("#3b6fd6", "#e07b39", "#2a9d6f", "#b4469b", "#8a8a2a")
INK = "#8c8c8c"


def progression_data(stages, nums: GpuResults) -> dict:
    """{causal: {shape: [(stage number, tflops)]}} plus the reference (FA4) TFLOP/s per line."""
    series: dict = {False: {}, True: {}}
    refs: dict = {False: {}, True: {}}
    for causal in (False, True):
        for shape in nums.shapes():
            pts = []
            for s in stages:
                e = nums.stage(s.id, shape, causal)
                if e is not None and e["status"] == "ok":
                    pts.append((s.number, float(e["tflops"])))
            if pts:
                series[causal][shape] = pts
            peer = nums.peer("fa4", shape, causal)
            if peer is not None and peer["status"] == "ok":
                refs[causal][shape] = float(peer["tflops"])
    return {"series": series, "refs": refs, "stages": [s.number for s in stages]}


def progression_svg(data: dict) -> str | None:
    """The chart as SVG text, or None when nothing was measured."""
    if not any(data["series"][c] for c in (False, True)):
        return None
    import matplotlib  # heavy: imported only when a chart is actually drawn

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    rc = {"svg.hashsalt": "hopattn-progression", "svg.fonttype": "path", "font.family": "DejaVu Sans",
          "font.size": 10, "text.color": INK, "axes.labelcolor": INK, "axes.edgecolor": INK,
          "xtick.color": INK, "ytick.color": INK, "axes.facecolor": "none", "figure.facecolor": "none",
          "savefig.facecolor": "none", "path.simplify": False}
    with matplotlib.rc_context(rc):
        fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained")
        panels = [c for c in (False, True) if data["series"][c]]  # no empty causal panel
        axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
        ymax = max([y for c in (False, True) for pts in data["series"][c].values() for _, y in pts]
                   + [v for c in (False, True) for v in data["refs"][c].values()])
        shapes = sorted({sh for c in (False, True) for sh in data["series"][c]},
                        key=lambda sh: (len(sh), sh))
        handles = {}
        for ax, causal in zip(axes, panels):
            for i, shape in enumerate(shapes):
                colour = SHAPE_COLOURS[i % len(SHAPE_COLOURS)]
                pts = data["series"][causal].get(shape)
                if pts:
                    xs, ys = zip(*pts)
                    (line,) = ax.plot(xs, ys, marker="o", markersize=3.5, linewidth=1.6, color=colour,
                                      linestyle="-" if not causal else "--", label=shape)
                    handles.setdefault(shape, line)
                ref = data["refs"][causal].get(shape)
                if ref is not None:
                    ax.axhline(ref, color=colour, linewidth=0.8, linestyle=":", alpha=0.9)
            ax.set_title("causal" if causal else "non-causal", color=INK)
            ax.set_xlabel("stage")
            ax.set_xticks(data["stages"])
            ax.set_xticklabels([f"{n:02d}" for n in data["stages"]])
            ax.set_xlim(min(data["stages"]) - 0.5, max(data["stages"]) + 0.5)
            ax.set_ylim(0, ymax * 1.08)
            ax.grid(True, axis="y", color=INK, alpha=0.25, linewidth=0.6)
            for side in ("top", "right"):
                ax.spines[side].set_visible(False)
        # One legend outside the panels, so it never hides a line; dotted = the FA4 reference.
        from matplotlib.lines import Line2D

        items = [handles[sh] for sh in shapes if sh in handles]
        items.append(Line2D([], [], color=INK, linestyle=":", linewidth=0.8, label="FA4, same shape"))
        fig.legend(handles=items, loc="outside right upper", frameon=False, fontsize=9, title="shape",
                   title_fontsize=9)
        axes[0].set_ylabel("TFLOP/s")
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    return buf.getvalue()
