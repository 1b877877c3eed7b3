"""Where the diagrams go on the site: the parts of a stage page's #diagrams section, its lead
figure, and the gallery's cards. Figures are inline SVG (which follows the theme's CSS variables),
each with its standalone SVG file linked for zooming and a full-screen view (docs/assets).

A per-stage picture that shows the same thing as the previous stage's is not drawn again: its
place says so and links the stage where it last changed.
"""

from __future__ import annotations

from ..html import figure
from .diagram import Diagram

FOLDER = "assets/generated/diagrams"  # the standalone files, relative to the docs root
KINDS = ("memory", "roles", "timeline")
# Per-stage pictures that only some stages have (structure.py: the code by role, stage 23 on); they
# are "unchanged since" as KINDS are. (The gallery's places of unchanged pictures stay KINDS'.)
PARTS = KINDS + ("structure",)
KIND_TITLE = {"memory": "Memory movement", "roles": "Warp roles", "timeline": "Pipeline timeline",
              "structure": "The code by role", "concept": "Concepts"}
UNCHANGED = {"memory": "the operands move as they did there",
             "roles": "the roles and their hand-offs are the same",
             "timeline": "the schedule model places the same work",
             "structure": "each role calls the same functions with the same state"}


def figures(diagrams: list[Diagram], site, depth: int, thumbs: bool = False, *, scroll: bool | int = False,
            defer: bool = False, lead: bool = False) -> str:
    """The figures' HTML; ``depth``: how many folders below the docs root the page sits. ``scroll``
    and ``defer``: see site_gen/html.py figure (a picture kept legible by scrolling sideways; one
    loaded from its file when shown)."""
    out = []
    for d in diagrams:
        site.add_asset(f"{FOLDER}/{d.filename}", d.standalone)
        link = "../" * depth + f"{FOLDER}/{d.filename}"
        out.append(figure(d.id, d.svg, d.caption, d.title, link, kind=d.kind, stage=d.stage, scroll=scroll,
                          defer=defer, lead=lead))
    return "\n".join(out)


def last_change(kind: str, stage, drawn: dict) -> object | None:
    """The earliest stage from which this stage's picture of ``kind`` is unchanged (None: it changed
    here). ``drawn``: stage number -> (stage, its diagrams)."""
    mine = _of(drawn[stage.number][1], kind)
    since = None
    number = stage.number - 1
    while number in drawn and mine.same_picture(_of(drawn[number][1], kind)):
        since = drawn[number][0]
        number -= 1
    return since


def _of(diagrams: list[Diagram], kind: str) -> Diagram | None:
    return next((d for d in diagrams if d.kind == kind), None)


def stage_parts(stage, mine: list[Diagram], drawn: dict, lead: str | None, site) -> dict[str, str]:
    """Markdown for each part of ## Diagrams (memory, roles, timeline, concepts): a figure, or a line
    saying where it is drawn (at the top of the page, or on the stage where it last changed)."""
    parts: dict[str, str] = {}
    for kind in PARTS:
        d = _of(mine, kind)
        if d is None:
            continue
        since = last_change(kind, stage, drawn)
        if d.id == lead:
            parts[kind] = "Drawn at the top of this page, as the figure of this stage's change.\n"
        elif since is not None:
            parts[kind] = (f"Unchanged since [stage {since.id}]({since.name}.md#{kind}): {UNCHANGED[kind]}"
                           f"{_drawn_for(stage) if kind != 'structure' else ''}.\n")
        else:
            parts[kind] = site.add_fragment(f"fig-{d.id}", figures([d], site, depth=2))
    concepts = [d for d in mine if d.kind == "concept" and d.id != lead]
    if concepts:
        parts["concepts"] = site.add_fragment(f"concepts-{stage.name}", figures(concepts, site, depth=2))
    return parts


def _drawn_for(stage) -> str:
    """', drawn for head dim D' on a stage that serves several head dims (issue #29), else ''."""
    if len(getattr(stage, "head_dims", ())) <= 1:
        return ""
    return f" (drawn for head dim {stage.head_dim}, of {stage.head_dims_text()})"


def lead_figure(mine: list[Diagram], lead: str | None, site) -> str:
    """The figure that shows the stage's change, for the top of its page: legible where it stands on
    any screen (on a phone it scrolls sideways at its full scale; html.figure says why)."""
    d = next((d for d in mine if d.id == lead), None)
    if d is None:
        return ""
    return site.add_fragment(f"fig-{d.id}", figures([d], site, depth=2, scroll=True, lead=True))


def distinct(stages, drawn: dict) -> list[Diagram]:
    """Every diagram that shows something new: per-stage pictures where they changed, and concepts."""
    out = []
    for s in stages:
        for d in drawn[s.number][1]:
            if d.kind == "concept" or d.kind not in PARTS or last_change(d.kind, s, drawn) is None:
                out.append(d)
    return out
