"""Helpers shared by the concept diagrams."""

from __future__ import annotations

from ..diagram import Diagram
from ..svg import Canvas, content_bottom

W = 860


def canvas(slug: str, height: int, title: str, desc: str) -> Canvas:
    c = Canvas(f"c-{slug}", W, height, title, desc)
    c.heading(title)
    return c


def _trimmed(c: Canvas) -> str:
    """The SVG, its canvas cut 14 px below the lowest thing drawn (no empty band at the bottom)."""
    svg = c.tostring()
    bottom = int(content_bottom(svg) + 14.999)
    if bottom < c.height:
        c.height = bottom
        svg = c.tostring()
    return svg


def done(c: Canvas, stage, caption: str) -> Diagram:
    """A concept that a stage introduces (shown on its page)."""
    svg = _trimmed(c)
    return Diagram(c.did, c.title, "concept", stage.number, svg, caption, c.width, c.height)


def done_doc(c: Canvas, caption: str) -> Diagram:
    """A figure of a hand-written page (docs/), which belongs to no one stage."""
    svg = _trimmed(c)
    return Diagram(c.did, c.title, "concept", None, svg, caption, c.width, c.height)


def box(c, x, y, w, h, label, fill="panel", stroke="stroke", size=12, sub=None, opacity=None):
    c.rect(x, y, w, h, fill=fill, stroke=stroke, opacity=opacity, rx=4)
    if sub:
        c.text(x + w / 2, y + h / 2 - 2, label, size=size, anchor="middle", weight="600")
        c.text(x + w / 2, y + h / 2 + 13, sub, size=max(11, size - 1), anchor="middle", fill="muted")
    else:
        c.text(x + w / 2, y + h / 2 + size * 0.35, label, size=size, anchor="middle", weight="600")
