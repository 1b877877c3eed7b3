"""Where the diagrams go on the site: the #diagrams section of a stage page and the gallery's
groups, as figures with inline SVG (which follows the theme's CSS variables) and, for zooming,
each diagram's standalone SVG file linked as "Open full size"."""

from __future__ import annotations

from ..html import figure
from .diagram import Diagram

FOLDER = "assets/generated/diagrams"  # the standalone files, relative to the docs root


def figures(diagrams: list[Diagram], site, depth: int) -> str:
    """The figures' HTML; ``depth``: how many folders below the docs root the page sits."""
    out = []
    for d in diagrams:
        site.add_asset(f"{FOLDER}/{d.filename}", d.standalone)
        link = "../" * depth + f"{FOLDER}/{d.filename}"
        out.append(figure(d.id, d.svg, d.caption, d.title, link))
    return "\n".join(out)


def stage_section(stage, mine: list[Diagram], site) -> str:
    """The body of ## Diagrams: a placeholder for the figures, which are spliced in after Markdown."""
    if not mine:
        return "This stage has no diagrams.\n"
    # stage pages are docs/stages/NN-slug.md, served as /stages/NN-slug/: two levels down
    return site.add_fragment(f"diagrams-{stage.name}", figures(mine, site, depth=2))
