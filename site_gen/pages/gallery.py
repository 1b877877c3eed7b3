"""The gallery page: every distinct diagram of the site as a grid of thumbnails, filtered by kind
and stage, with a view that puts a stage's pictures beside its predecessor's.

The page is plain HTML; docs/assets/javascripts/figures.js drives the filters, the comparison and
the full-screen view. A per-stage picture that did not change is not repeated: its place in the
comparison says where it last changed. A stage's pipeline timeline is its measured one where a
trace is recorded (the trace its page opens on): what the GPU did changes at every stage, where the
schedule model's picture, which sees each unit's throughput and not which warp issues what, can
stay the same (stages 11 and 12 against 10); the model's picture stands in only for a stage
without a trace.
"""

from __future__ import annotations

from html import escape

from ..diagrams.section import FOLDER, KINDS, distinct, last_change
from ..html import figure
from .docs_figures import DOC_PAGES
from .stage import GENERATED, stage_title

KIND_LABEL = {"memory": "Memory movement", "roles": "Warp roles", "timeline": "Pipeline timeline",
              "concept": "Concepts"}
FRONT = "---\nhide:\n  - navigation\n  - toc\n---\n\n"


def _controls(stages) -> str:
    kinds = "".join(f'<button type="button" data-kind="{k}">{escape(v)}</button>' for k, v in KIND_LABEL.items())
    options = "".join(f'<option value="{s.id}">{escape(stage_title(s))}</option>' for s in stages)
    return ('<div class="hd-gallery-controls" role="group" aria-label="Filter the diagrams">'
            '<span class="hd-kinds"><button type="button" data-kind="" aria-pressed="true">All kinds</button>'
            f"{kinds}</span>"
            f'<label>Stage <select class="hd-stage-filter"><option value="">every stage</option>{options}</select></label>'
            '<label class="hd-compare-toggle"><input type="checkbox" class="hd-compare"> beside the previous stage</label>'
            '<span class="hd-gallery-count" aria-live="polite"></span></div>')


def _card(d, site, stage_of) -> str:
    site.add_asset(f"{FOLDER}/{d.filename}", d.standalone)
    link = f"../{FOLDER}/{d.filename}"
    where = stage_of.get(d.stage)
    kind = _kind(d)
    head = (f'<a class="hd-card-stage" href="../stages/{where.name}/#{_anchor(d)}">{escape(stage_title(where))}</a>'
            if where is not None else '<span class="hd-card-stage">General concepts</span>')
    fig = figure(d.id, d.svg, d.caption, d.title, link, kind=d.kind, stage=d.stage)
    return (f'<div class="hd-thumb" data-kind="{kind}" data-stage="{f"{d.stage:02d}" if d.stage else ""}">'
            f'{head}<div class="hd-thumb-title">{escape(d.title)}</div>{fig}</div>')


def _kind(d) -> str:
    """The gallery's kind of a picture: a measured trace is the stage's pipeline timeline."""
    return "timeline" if d.kind == "trace" else d.kind


def _anchor(d) -> str:
    return {"memory": "memory", "roles": "roles", "timeline": "timeline"}.get(_kind(d), f"fig-{d.id}")


def _same_card(stage, kind, since) -> str:
    if kind == "timeline":  # only for a stage without a trace: the model's picture is all there is
        said = (f'No trace of this stage is recorded; the schedule model places the same work as at '
                f'<a href="../stages/{since.name}/#{kind}">stage {since.id}</a> (it models each unit\'s throughput, '
                "not which warp issues what).")
    else:
        said = f'Unchanged since <a href="../stages/{since.name}/#{kind}">stage {since.id}</a>.'
    return (f'<div class="hd-thumb hd-thumb-same" data-kind="{kind}" data-stage="{stage.id}">'
            f'<span class="hd-card-stage">{escape(stage_title(stage))}</span>'
            f'<div class="hd-thumb-title">{escape(KIND_LABEL[kind])}</div>'
            f'<p>{said}</p></div>')


def gallery_page(stages, drawn: dict, site, doc_figures=(), docs_dir=None, measured: dict | None = None) -> str:
    """``drawn``: stage number -> (stage, its diagrams); ``doc_figures``: the hand-written pages' figures
    (``docs_dir``: where those pages are; only the ones that exist are linked); ``measured``: stage
    number -> its measured timeline, which is its timeline card (the model's picture where none)."""
    measured = measured or {}
    stage_of = {s.number: s for s in stages}
    new = distinct(stages, drawn)
    shown = []
    for s in stages:  # per stage: memory, roles, the timeline (measured, else the model's), concepts
        mine = [d for d in new if d.stage == s.number]
        model = [d for d in mine if d.kind == "timeline"]
        timeline = [measured[s.number]] if s.number in measured else model
        shown += [d for d in mine if d.kind in ("memory", "roles")] + timeline
        shown += [d for d in mine if d.kind not in ("memory", "roles", "timeline")]
    shown += list(doc_figures)
    cards = []
    for d in shown:
        cards.append(_card(d, site, stage_of))
    for s in stages:  # the places of unchanged pictures, for the comparison and the stage filter
        for kind in KINDS:
            if kind == "timeline" and s.number in measured:
                continue
            since = last_change(kind, s, drawn)
            if since is not None:
                cards.append(_same_card(s, kind, since))
    total = len(shown)
    pages = [f"[{title}]({page})" for page, title in DOC_PAGES if docs_dir is not None and (docs_dir / page).is_file()]
    intro = (f"{total} distinct diagrams: the memory movement and warp roles of every stage where they change, "
             "every stage's pipeline timeline as measured on the GPU (the schedule model's prediction where no trace "
             "is recorded), the concepts each stage introduces"
             + (", and the figures of the " + " and the ".join(pages) if pages else "")
             + ". Click a picture for the full-screen view; choose a stage and tick *beside the previous stage* "
             "to compare.\n")
    html = (f'<div class="hd-gallery" data-total="{total}">' + _controls(stages)
            + '<div class="hd-gallery-grid">' + "\n".join(cards) + "</div></div>")
    parts = [FRONT, "# Diagram gallery\n", GENERATED, intro]
    if not shown:
        parts.append("No diagrams yet.\n")
    else:
        parts.append(site.add_fragment("gallery", html))
    return "\n".join(parts)

