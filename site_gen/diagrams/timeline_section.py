"""The timeline part of a stage page's #diagrams section: what the GPU did (the committed trace
records, non-causal and, where recorded, causal, in tabs), the schedule model's prediction for the
same window under it, and the two set against each other in words: time per K/V step, the traced
build's overhead, and a flag when the trace is older than the stage's sources. A stage that serves
several head dims (stage 24) shows its records at the others (`--head-dim`) in tabs of their own,
after the head dim its figures draw, the model at each head dim's tile where its [[schedule]] holds.

A backward stage's page (Act V) has the same part once its stage has a trace (backward_section; its
records in bench/results/traces/<gpu>/backward/), in the backward's words: a step is a query block.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from hopattn import lineage
from hopattn.records import traces

from ..html import esc, inline_markdown, tabbed
from . import rates, schedule, timeline_focus, trace_lanes
from .diagram import Diagram
from .section import figures
from .timeline import measured_window, model_window_diagram, own_window, timeline_diagram
from .trace_timeline import BACKWARD_NAME, NAME, fmt_ns, trace_diagram

MIN_WIDTH = 820  # px: at the smallest font of the timelines (13), text stays 12 px or more; below it the
# picture scrolls sideways (html.figure's scroll); the every-warp view is loaded when its fold opens
DISAGREE = 0.15  # measured and predicted time per K/V step further apart than this: the page says so
# The clock the model's binding rate assumes, per bound: the tensor cores' 989 TFLOP/s hold at 1.83
# GHz, MUFU and FMA are taken at 1.98; a load-bound step is memory's, which no SM clock scales.
MODEL_MHZ = {"tensor": rates.TENSOR_CLOCK_HZ / 1e6, "softmax": rates.CLOCK_HZ / 1e6,
             "epilogue": rates.CLOCK_HZ / 1e6}
# The first line of the timeline part of a stage without a trace: the page heads it as the schedule
# model's prediction alone (pages/stage.py), not as measured.
UNTRACED = "<!-- hd-timeline: no trace recorded, the schedule model's prediction alone -->\n"
STALE = '<span class="hd-stale" title="recorded on older sources of this stage">stale</span>'


@dataclass(frozen=True)
class StepComparison:
    """A stage's time per K/V step: measured in its trace (traced build) and predicted by the model."""

    measured_ns: float
    predicted_ns: float
    overhead_pct: float
    bound: str
    clock_mhz: float | None = None  # the SM clock of the recorded launch

    @property
    def model_mhz(self) -> float | None:
        """The clock the model's binding rate assumes (None: memory, or no clock recorded)."""
        return MODEL_MHZ.get(self.bound) if self.clock_mhz else None

    @property
    def scaled_ns(self) -> float:
        """The measured step in the same cycles at the model's clock. The recorded launch ran at its
        own clock (1.2 to 1.8 GHz on the H200, lower as the GPU heats under the late stages' load),
        and the model's rates but memory's are per clock."""
        return self.measured_ns * self.clock_mhz / self.model_mhz if self.model_mhz else self.measured_ns

    @property
    def ratio(self) -> float:
        return self.scaled_ns / self.predicted_ns

    @property
    def untraced_ns(self) -> float:
        """The measured step at the model's clock with the traced build's overhead on the kernel's
        time taken out."""
        return self.scaled_ns / (1 + self.overhead_pct / 100)

    @property
    def disagree(self) -> bool:
        return abs(self.ratio - 1) > DISAGREE


def model_stage(stage, head_dim: int):
    """The stage as the schedule model takes it at ``head_dim``: that head dim's tile (query rows, keys,
    head dim: Stage.at_head_dim) in the spec's [[schedule]], where the schedule still describes the
    kernel (its consumers, V of q's head dim: 96 and 256 at stage 24); None where it does not (64's
    third consumer, 192's V of 128): not modelled."""
    if head_dim == stage.head_dim:
        return stage
    tiled = stage.at_head_dim(head_dim)
    return tiled if len(tiled.roles) == len(stage.roles) and stage.head_dim_v(head_dim) == head_dim else None


def step_comparison(stage, record: dict) -> StepComparison | None:
    """None: the record has no time per step, or its head dim is not modelled."""
    model = model_stage(stage, traces.head_dim_of(record))
    if not record.get("per_step_ns") or model is None:
        return None
    pred = schedule.predict(model)
    return StepComparison(record["per_step_ns"], pred.period * 1e9, record["overhead"]["pct"], pred.bound,
                          record.get("clock_mhz"))


def diagrams_for(stage, record: dict | None, causal_record: dict | None, prev: dict | None = None) -> list[Diagram]:
    """Per record (non-causal first): the measured timeline, its every-warp view and the model's
    prediction for the same window; the model's own window when nothing is recorded. ``prev``:
    {causal: (previous stage's id, its record's stats)}. A pure function of the spec and records."""
    out = []
    view = timeline_focus.focus(stage).view
    for rec in (record, causal_record):
        if rec is None:
            continue
        lay = trace_lanes.layout(rec)
        causal = rec["causal"]
        against = (prev or {}).get(causal)
        out += [trace_diagram(stage, rec, causal=causal, prev=against, view=view),
                trace_diagram(stage, rec, every_warp=True, causal=causal)]
        model = model_stage(stage, traces.head_dim_of(rec))
        if model is not None:
            before, after = trace_lanes.steps(lay)
            win = measured_window(model, before, after) if before else own_window(model)
            did = f"{_p_id(stage)}{stage.id}-model{_suffix(rec)}"
            out.append(model_window_diagram(model, win, lay.length * 1e-9, did))
    if not out:
        out.append(timeline_diagram(stage, None))
    return out


def stage_section(stage, prev, inp, site, cache, keep: dict | None = None) -> str:
    """The Markdown of the stage page's timeline part (its heading and #timeline anchor are the page's):
    ``inp``: the site's inputs (traces, hashes); ``cache``: the site's DiskCache for the drawings;
    ``keep``: where to put {stage number: the measured timeline its page opens on}, for the gallery."""
    record, causal_record = inp.trace(stage, False), inp.trace(stage, True)
    prev_records = {c: _previous(inp, prev, c) for c in (False, True)}
    # the previous stage's trace of the same mask, else its non-causal one (named so in the figure)
    # ... in this stage's record's clock: the same cycles, as each record's clock makes them nanoseconds
    mine = {False: record, True: causal_record}
    against = {c: (prev.id if r["causal"] == c else f"{prev.id}, non-causal", at_clock(r, mine[c] or r),
                   boundary_at_clock(r, mine[c] or r))
               for c, r in prev_records.items() if r is not None}
    drawn = _drawn(stage, record, causal_record, against, cache)
    by_id = {d.id: d for d in drawn}
    if record is None and causal_record is None:
        html = (_p("No trace of this stage is recorded yet: `python -m bench.trace` on a GPU writes one "
                   "(`bench/results/traces/<gpu>/<NN>.json`). Below, the schedule model's prediction alone.")
                + figures([by_id[f"s{stage.id}-timeline"]], site, depth=2))
        return UNTRACED + _wrap(stage, site, html)
    shown = [r for r, _ in _tab_order(stage, record, causal_record) if r is not None]
    if keep is not None:
        keep[stage.number] = by_id[f"s{stage.id}-trace{_suffix(shown[0])}"]
    tabs = [_tab(stage, prev, rec, prev_records[rec["causal"]], by_id, site, inp.trace_gpu) for rec in shown]
    for d in inp.other_head_dims(stage):  # stage 24's other head dims, each set against nothing
        pair = (inp.trace(stage, False, d), inp.trace(stage, True, d))
        by_id |= {x.id: x for x in _drawn(stage, *pair, {}, cache)}
        tabs += [_tab(stage, None, rec, None, by_id, site, inp.trace_gpu)
                 for rec, _ in _tab_order(stage, *pair) if rec is not None]
    return _wrap(stage, site, tabbed(f"timeline-{stage.id}", tabs) if len(tabs) > 1 else tabs[0][1])


def _tab(stage, prev, rec: dict, prev_rec: dict | None, by_id: dict, site, gpu: str | None) -> tuple[str, str]:
    """(label, HTML) of one record's tab: its timeline, the model's for the same window, the two compared."""
    suffix = _suffix(rec)
    model = by_id.get(f"s{stage.id}-model{suffix}")
    body = [_stale(stage, rec, gpu), _focus_note(stage),
            figures([by_id[f"s{stage.id}-trace{suffix}"]], site, depth=2, scroll=MIN_WIDTH),
            figures([model], site, depth=2, scroll=MIN_WIDTH) if model else "",
            _head_dim_note(stage, rec), _comparison(stage, rec),
            _folded(f"Every traced warp: {len(trace_lanes.layout(rec, every_warp=True).lanes)} lanes",
                    figures([by_id[f"s{stage.id}-trace{suffix}-warps"]], site, depth=2, scroll=MIN_WIDTH,
                            defer=True)),
            _folded("Median time of each event" + (f", against stage {prev.id}" if prev_rec else ""),
                    _event_table(prev, rec, prev_rec))]
    d = traces.head_dim_of(rec)
    dim = f"head dim {d}, " if d != stage.head_dim else ""
    return f"Measured, {dim}{'causal' if rec['causal'] else 'non-causal'}", "\n".join(b for b in body if b)


def _suffix(record: dict) -> str:
    """What a record's figure ids end with: its head dim's tag (none at 128), then -causal for the mask."""
    return traces.head_dim_tag(traces.head_dim_of(record)) + ("-causal" if record["causal"] else "")


def _head_dim_note(stage, record: dict) -> str:
    """At a head dim other than the one the figures draw: what the model takes of its tile, and what not."""
    d = traces.head_dim_of(record)
    if d == stage.head_dim:
        return ""
    model = model_stage(stage, d)
    if model is None:
        return _p(f"*Head dim {d} is not modelled*: its kernel is not the one the `[[schedule]]` of stage.toml "
                  f"describes (written for head dim {stage.head_dim}: its consumers, V of q's head dim), so no "
                  "prediction is drawn under the measured timeline.")
    q, q0 = stage.constants(d)["Q_STAGES"], stage.constants()["Q_STAGES"]
    rest = (f": {q} Q buffer{'s' if q > 1 else ''} where the schedule has {q0}, so the model loads the next tile's Q "
            "under the current tile's last steps, where the kernel waits for a free Q buffer" if q != q0 else "")
    return _p(f"*Head dim {d}*: the model takes this head dim's tile ({model.block_m} query rows × {model.block_n} "
              f"keys, `HeadDimTile<{d}>`) into the `[[schedule]]` written for head dim {stage.head_dim}, so its time "
              f"per K/V step is this tile's; what else differs is not modelled{rest}.")


def backward_section(stage, prev, inp, site, cache) -> str | None:
    """The Markdown of a backward stage page's timeline part when the stage has a trace (None when it
    has none: the page keeps the schedule model's own window and says so). As stage_section, in the
    backward's words; the previous backward stage's record, where it has one, is the comparison."""
    record, causal_record = inp.trace(stage, False), inp.trace(stage, True)
    if record is None and causal_record is None:
        return None
    prev_records = {c: _previous(inp, prev, c) for c in (False, True)}
    mine = {False: record, True: causal_record}
    against = {c: (prev.id if r["causal"] == c else f"{prev.id}, non-causal", at_clock(r, mine[c] or r),
                   boundary_at_clock(r, mine[c] or r))
               for c, r in prev_records.items() if r is not None}
    drawn = _drawn(stage, record, causal_record, against, cache, "backward-timelines")
    by_id = {d.id: d for d in drawn}
    tabs = []
    for rec, suffix in ((record, ""), (causal_record, "-causal")):
        if rec is None:
            continue
        prev_rec = prev_records[rec["causal"]]
        did = f"b{stage.id}"
        # the second tab's trace (the causal one) is loaded when it is opened: two measured traces
        # inline put a backward page past half a megabyte
        later = bool(tabs)
        body = [_stale(stage, rec, inp.trace_gpu),
                figures([by_id[f"{did}-trace{suffix}"]], site, depth=2, scroll=MIN_WIDTH, defer=later),
                figures([by_id[f"{did}-model{suffix}"]], site, depth=2, scroll=MIN_WIDTH),
                _comparison(stage, rec),
                _folded(f"Every traced warp: {len(trace_lanes.layout(rec, every_warp=True).lanes)} lanes",
                        figures([by_id[f"{did}-trace{suffix}-warps"]], site, depth=2, scroll=MIN_WIDTH, defer=True)),
                _folded("Median time of each event" + (f", against backward stage {prev.id}" if prev_rec else ""),
                        _event_table(prev, rec, prev_rec))]
        tabs.append((f"Measured, {'causal' if suffix else 'non-causal'}", "\n".join(b for b in body if b)))
    html = tabbed(f"timeline-backward-{stage.id}", tabs) if len(tabs) > 1 else tabs[0][1]
    return site.add_fragment(f"timeline-backward-{stage.name}", html)


def _p_id(stage) -> str:
    """The prefix of a stage's figure ids: the backward's are b<NN>-..., apart from the forward's s<NN>-..."""
    return "b" if getattr(stage, "backward", False) else "s"


def _tab_order(stage, record, causal_record) -> tuple:
    """(record, suffix) pairs in the order the tabs show them: the causal trace first for a stage
    whose change is the causal path (timeline_focus.py), else the non-causal one."""
    pairs = ((record, ""), (causal_record, "-causal"))
    return pairs[::-1] if timeline_focus.focus(stage).causal_first and causal_record is not None else pairs


def _focus_note(stage) -> str:
    why = timeline_focus.focus(stage).why
    return _p(f"*Where this timeline looks:* {why}.") if why else ""


def _folded(summary: str, html: str) -> str:
    return f'<details class="note"><summary>{esc(summary)}</summary>\n{html}\n</details>'


def _previous(inp, prev, causal: bool) -> dict | None:
    """The previous stage's record to compare with: the same mask, else its non-causal one."""
    if prev is None:
        return None
    return inp.trace(prev, causal) or inp.trace(prev, False)


def _drawn(stage, record, causal_record, against, cache, namespace: str = "timelines") -> list[Diagram]:
    """diagrams_for, through the disk cache: keyed by the spec and the records, and by this package's code."""

    def make():
        return [dataclasses.asdict(d) for d in diagrams_for(stage, record, causal_record, against)]

    parts = [stage.name, stage.spec_path.read_text(), record, causal_record, sorted(against.items())]
    drawn = cache.get(namespace, parts, make, code=[Path(__file__).parent, Path(lineage.__file__)],
                      libraries=["svgwrite"])
    return [Diagram(**d) for d in drawn]


DEFERRED_BYTES = 200_000  # a timeline this large (stage 24's six traces) is loaded by its page, not carried


def _wrap(stage, site, html: str) -> str:
    """The section's body; the stage page puts it under its ### heading (anchor #timeline). One of
    DEFERRED_BYTES or more is written beside the page and loaded by it (as the diffs are), so the page
    stays under the size a phone loads quickly."""
    file = None
    if len(html.encode()) >= DEFERRED_BYTES:
        file = (f"assets/generated/timelines/{stage.name}.html", 2, "the measured timeline")
    return site.add_fragment(f"timeline-{stage.name}", html, file=file)


def _p(markdown: str) -> str:
    return inline_markdown(markdown)


def _stale(stage, record: dict, gpu: str | None) -> str:
    if not traces.is_stale(record, stage):
        return ""
    backward = traces.is_backward(record)
    d = traces.head_dim_of(record)
    name = (f"bench/results/traces/{gpu}/{'backward/' if backward else ''}"
            f"{traces.record_name(stage.id, record['causal'], d)}")
    command = ("python -m bench.trace --lineage backward" if backward else
               "python -m bench.trace" + (f" --stages {stage.number} --head-dim {d}" if d != stage.head_dim else ""))
    return ('<div class="admonition warning"><p class="admonition-title">Stale trace</p>'
            f"<p>{STALE} This trace was recorded on older sources of the stage (source hash "
            f"<code>{esc(record['source_hash'])}</code>; the stage's is now <code>{esc(stage.source_hash())}</code>): "
            f"what it shows is a kernel that no longer exists. Re-run <code>{command}</code> on a GPU "
            f"to refresh <code>{esc(name)}</code>.</p></div>")


def _comparison(stage, record: dict) -> str:
    cmp = step_comparison(stage, record)
    over = record["overhead"]
    slower = "slower" if over["pct"] >= 0 else "faster"
    spread = (f"; the {over['pct_range'][0]:+.1f} to {over['pct_range'][1]:+.1f} % of its timing rounds"
              if "pct_range" in over else "")
    overhead = (f"The traced build ran **{abs(over['pct']):.1f} % {slower}** than the plain one "
                f"({over['traced_ms']:.3f} ms against {over['plain_ms']:.3f} ms for the whole launch{spread}): the "
                "trace shows the protocol and the relative durations, not exact times.")
    backward = traces.is_backward(record)
    step = "query block" if backward else "K/V step"
    if cmp is None and record.get("per_step_ns"):  # not modelled at its head dim (_head_dim_note)
        return _p(f"**Per {step}**: measured **{fmt_ns(record['per_step_ns'])}** (traced build). {overhead}")
    if cmp is None:
        return _p(f"This record has no time per {step}. {overhead}")
    lay = trace_lanes.layout(record)
    verdict = (f"they **disagree**: the GPU took {cmp.ratio:.2f}× the model's time per step"
               if cmp.disagree else f"they agree within {DISAGREE * 100:.0f} % ({cmp.ratio:.2f}×)")
    clock = ""
    if cmp.model_mhz:
        clock = (f" at the {cmp.clock_mhz:.0f} MHz the SM ran at during the recorded launch, "
                 f"**{fmt_ns(cmp.scaled_ns)}** in the same cycles at the {cmp.model_mhz:.0f} MHz the model's "
                 f"{schedule.UNIT_LABEL[cmp.bound]} rate holds at")
    elif cmp.clock_mhz:
        clock = (f" at the {cmp.clock_mhz:.0f} MHz the SM ran at during the recorded launch (memory binds in the "
                 "model: no clock scales it)")
    lines = [f"**Per {step}**: measured **{fmt_ns(cmp.measured_ns)}**{clock} (the median over every step recorded "
             f"on this SM, traced build), predicted **{fmt_ns(cmp.predicted_ns)}** (the schedule model, bound by "
             f"{schedule.UNIT_LABEL[cmp.bound]}): {verdict}. {overhead} With the overhead taken out, a step takes "
             f"about {fmt_ns(cmp.untraced_ns)}, {cmp.untraced_ns / cmp.predicted_ns:.2f}× the prediction."]
    if len(lay.rows) > 1:
        lines.append(f"{len(lay.rows)} CTAs shared this SM at once; the model gives one CTA the SM to itself, so "
                     f"each CTA's step may take up to {len(lay.rows)}× the model's time from that alone.")
    both = trace_lanes.both_in_flight(lay, 0)
    if both is not None:
        lines.append(f"Both consumer warpgroups had a wgmma in flight at the same time for **{both[1] * 100:.0f} %** "
                     "of the time either had one, in this window (from issue to the wait that retired it).")
    if not lay.boundaries and backward:
        lines.append("This window holds the start of the CTA's key block (its prologue and first query blocks), "
                     "not a boundary between two CTAs: no second CTA started on the SM while the first was recorded.")
    elif not lay.boundaries:
        lines.append("This window holds the start of the CTA's first output tile (its prologue and first steps), "
                     "not a tile boundary: the windows of the persistent stages were chosen before a fix to how "
                     "the trace producer picks them, and a later recording will show a boundary.")
    return "\n".join(_p(x) for x in lines)


def at_clock(record: dict, to: dict) -> dict:
    """A record's event statistics in another record's clock: the same cycles, as nanoseconds at the
    SM clock ``to`` was recorded at. Stages recorded minutes apart ran at clocks up to a third apart
    (the H200 slows as it heats), so a comparison of two stages' nanoseconds is one of cycles only
    this way."""
    f = record.get("clock_mhz", 1.0) / to.get("clock_mhz", 1.0) if "clock_mhz" in record and "clock_mhz" in to else 1.0
    return {e: {**v, "median_ns": round(v["median_ns"] * f, 1), "total_ns": round(v["total_ns"] * f, 1)}
            for e, v in record["stats"].items()}


def boundary_at_clock(record: dict, to: dict) -> list[tuple[str, float]]:
    """A record's tile-boundary stretches (trace_lanes.boundary_stretches) in another record's
    clock, as at_clock does for the event statistics."""
    f = record.get("clock_mhz", 1.0) / to.get("clock_mhz", 1.0) if "clock_mhz" in record and "clock_mhz" in to else 1.0
    return [(label, round(ns * f, 1)) for label, ns in trace_lanes.boundary_stretches(trace_lanes.layout(record))]


def _event_table(prev, record: dict, prev_record: dict | None) -> str:
    """Median duration per event kind over everything recorded on the SM, against the previous stage
    (its cycles at this record's clock)."""
    stats = record["stats"]
    pstats = at_clock(prev_record, record) if prev_record else {}
    pid = prev.id if prev is not None and prev_record else None
    names = BACKWARD_NAME if traces.is_backward(record) else NAME
    head = "<th>event</th><th>recorded</th><th>median</th>" + (f"<th>stage {pid}</th><th>change</th>" if pid else "")
    rows = []
    for event in traces.events_of(record):
        mine, theirs = stats.get(event), pstats.get(event)
        if mine is None and theirs is None:
            continue
        cells = [esc(names[event]), str(mine["count"]) if mine else "—", fmt_ns(mine["median_ns"]) if mine else "—"]
        if pid:
            cells.append(fmt_ns(theirs["median_ns"]) if theirs else "—")
            if mine and theirs:
                cells.append(f"{mine['median_ns'] / theirs['median_ns']:.2f}×" if theirs["median_ns"] > 0 else "—")
            else:
                cells.append("new" if mine else "gone")
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    mask = "causal" if record["causal"] else "non-causal"
    against = (f", against stage {pid}'s {'causal' if prev_record['causal'] else 'non-causal'} trace, its cycles at "
               f"this record's {record.get('clock_mhz', 0):.0f} MHz (it ran at {prev_record.get('clock_mhz', 0):.0f})"
               if pid else "")
    return (f"<p>The median duration of each event over all {record['recorded']} events recorded on the SM "
            f"({mask}{against}):</p>\n<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(rows)
            + "\n</tbody>\n</table>")
