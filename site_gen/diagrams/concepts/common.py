"""Helpers shared by the concept diagrams."""

from __future__ import annotations

from ..diagram import Diagram
from ..svg import Canvas

W = 860


def canvas(slug: str, height: int, title: str, desc: str) -> Canvas:
    c = Canvas(f"c-{slug}", W, height, title, desc)
    c.text(12, 22, title, size=14, weight="600")
    return c


def done(c: Canvas, stage, caption: str) -> Diagram:
    return Diagram(c.did, c.title, "concept", stage.number, c.tostring(), caption, c.width, c.height)


def box(c, x, y, w, h, label, fill="panel", stroke="stroke", size=11.5, sub=None, opacity=None):
    c.rect(x, y, w, h, fill=fill, stroke=stroke, opacity=opacity, rx=4)
    if sub:
        c.text(x + w / 2, y + h / 2 - 2, label, size=size, anchor="middle", weight="600")
        c.text(x + w / 2, y + h / 2 + 12, sub, size=size - 1.5, anchor="middle", fill="muted")
    else:
        c.text(x + w / 2, y + h / 2 + size * 0.35, label, size=size, anchor="middle", weight="600")
