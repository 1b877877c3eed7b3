"""SVG primitives and the colour theme shared by every diagram.

Why not plain svgwrite calls everywhere: svgwrite numbers ids from a process-wide counter and
writes raw float reprs, so the same picture would differ between builds and ids would collide
when several diagrams are inlined on one page. ``Canvas`` gives every id the diagram's prefix,
rounds every coordinate to 0.1 and writes colours as CSS variables with light-theme fallbacks
(the variables are defined for both Material schemes in docs/assets/stylesheets/diagrams.css).
"""

from __future__ import annotations

import svgwrite
from svgwrite.base import Desc, Title

# Theme key -> light fallback. The CSS file defines --hd-<key> for "default" and "slate".
PALETTE = {
    "bg": "#ffffff", "panel": "#f4f6fa", "panel2": "#e9edf5", "fg": "#1f2430", "muted": "#5b6372",
    "stroke": "#9aa3b2", "grid": "#d9dee7",
    "q": "#3b6fd6", "k": "#d9822b", "v": "#2e9e6a", "s": "#8a5cd1", "p": "#c2418f", "o": "#0f8b9c",
    "load": "#d9822b", "tensor": "#3b6fd6", "softmax": "#c2418f", "epilogue": "#0f8b9c",
    "bar": "#b23b3b", "accent": "#e0a100", "ok": "#2e9e6a", "skip": "#c9ced8", "mask": "#e0a100",
    "warp": "#6b7a99",
}
FONT = "Roboto, 'Helvetica Neue', Arial, sans-serif"
MONO = "'Roboto Mono', 'SFMono-Regular', Menlo, Consolas, monospace"


def color(key: str) -> str:
    """A theme colour as a CSS variable with its fallback (plain colours pass through)."""
    if key in PALETTE:
        return f"var(--hd-{key}, {PALETTE[key]})"
    return key


def num(v: float) -> float | int:
    """Round to 0.1 and drop '.0' so the same geometry always prints the same characters."""
    r = round(float(v), 1)
    return int(r) if r == int(r) else r


def text_width(s: str, size: float = 12) -> float:
    """Rough width of sans-serif text; good enough to size boxes and avoid overlaps."""
    return len(s) * size * 0.56


def fmt_bytes(n: int) -> str:
    if n >= 1024 * 1024 and n % (1024 * 1024) == 0:
        return f"{n // (1024 * 1024)} MiB"
    if n >= 1024:
        k = n / 1024
        return f"{k:g} KiB" if k == int(k) else f"{k:.1f} KiB"
    return f"{n} B"


def fmt_us(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:.2f} µs" if us < 10 else f"{us:.1f} µs"


class Canvas:
    """One diagram's drawing surface: every element it creates carries the diagram's id prefix."""

    def __init__(self, did: str, width: int, height: int, title: str, desc: str):
        self.did, self.width, self.height = did, int(width), int(height)
        self.title, self.desc = title, desc
        self.d = svgwrite.Drawing(size=None, profile="full", debug=False)
        self._markers: set[str] = set()
        self.body = self.d.g(id=self.id("body"))

    def id(self, local: str) -> str:
        return f"{self.did}-{local}"

    # --- primitives ---------------------------------------------------------------------------
    def rect(self, x, y, w, h, fill="panel", stroke="stroke", rx=4, sw=1, opacity=None, dash=None,
             parent=None, cls=None):
        kw = {"fill": color(fill), "stroke": color(stroke) if stroke else "none"}
        if stroke:
            kw["stroke-width"] = num(sw)
        if opacity is not None:
            kw["fill-opacity"] = round(float(opacity), 2)
        if dash:
            kw["stroke-dasharray"] = dash
        if cls:
            kw["class"] = cls
        el = self.d.rect((num(x), num(y)), (num(max(w, 0)), num(max(h, 0))), rx=num(rx), **kw)
        (parent or self.body).add(el)
        return el

    def text(self, x, y, s, size=12, anchor="start", fill="fg", weight=None, mono=False, italic=False,
             parent=None, cls="hd-text"):
        kw = {"font-size": num(size), "fill": color(fill), "class": cls}
        if anchor != "start":
            kw["text-anchor"] = anchor
        if weight:
            kw["font-weight"] = weight
        if mono:
            kw["font-family"] = MONO
            kw["class"] = "hd-mono"
        if italic:
            kw["font-style"] = "italic"
        el = self.d.text(str(s), insert=(num(x), num(y)), **kw)
        (parent or self.body).add(el)
        return el

    def lines(self, x, y, rows, size=12, leading=1.3, **kw):
        """Several lines of text, top line's baseline at y; returns the y after the last line."""
        for i, s in enumerate(rows):
            self.text(x, y + i * size * leading, s, size=size, **kw)
        return y + len(rows) * size * leading

    def line(self, x1, y1, x2, y2, stroke="stroke", sw=1, dash=None, arrow=False, parent=None):
        kw = {"stroke": color(stroke), "stroke-width": num(sw)}
        if dash:
            kw["stroke-dasharray"] = dash
        if arrow:
            kw["marker-end"] = f"url(#{self.marker(stroke)})"
        el = self.d.line((num(x1), num(y1)), (num(x2), num(y2)), **kw)
        (parent or self.body).add(el)
        return el

    def path(self, points, stroke="stroke", sw=1, fill="none", arrow=False, dash=None, closed=False,
             parent=None):
        d = "M" + " L".join(f"{num(x)} {num(y)}" for x, y in points) + (" Z" if closed else "")
        kw = {"d": d, "stroke": color(stroke) if stroke else "none", "stroke-width": num(sw),
              "fill": color(fill) if fill != "none" else "none"}
        if dash:
            kw["stroke-dasharray"] = dash
        if arrow:
            kw["marker-end"] = f"url(#{self.marker(stroke)})"
        el = self.d.path(**kw)
        (parent or self.body).add(el)
        return el

    def circle(self, cx, cy, r, fill="panel", stroke="stroke", sw=1, parent=None):
        el = self.d.circle((num(cx), num(cy)), num(r), fill=color(fill),
                           stroke=color(stroke) if stroke else "none", **{"stroke-width": num(sw)})
        (parent or self.body).add(el)
        return el

    def group(self, local_id: str | None = None, **attrs):
        kw = {"id": self.id(local_id)} if local_id else {}
        kw.update(attrs)
        g = self.d.g(**kw)
        self.body.add(g)
        return g

    def marker(self, key: str) -> str:
        """An arrow head in one colour; defined once per diagram, id prefixed."""
        mid = self.id(f"arrow-{key}")
        if mid not in self._markers:
            self._markers.add(mid)
            m = self.d.marker(id=mid, insert=(8, 4), size=(8, 8), orient="auto",
                              markerUnits="userSpaceOnUse")
            m.add(self.d.path(d="M0 0 L8 4 L0 8 Z", fill=color(key)))
            self.d.defs.add(m)
        return mid

    def legend(self, x, y, items, size=11, gap=16):
        """A row of colour swatches with labels; returns the x after the last item."""
        for key, label in items:
            self.rect(x, y - size + 1, size, size, fill=key, stroke=None, rx=2)
            self.text(x + size + 4, y, label, size=size, fill="muted")
            x += size + 4 + text_width(label, size) + gap
        return x

    # --- output -------------------------------------------------------------------------------
    def tostring(self) -> str:
        d = self.d
        a = d.attribs
        a["viewBox"] = f"0 0 {self.width} {self.height}"
        a["role"] = "img"
        a["aria-labelledby"] = f"{self.id('title')} {self.id('desc')}"
        a["id"] = self.did
        a["class"] = "hd-diagram"
        a["font-family"] = FONT
        a["preserveAspectRatio"] = "xMidYMin meet"
        # title/desc must be the first children for assistive technology.
        title, desc = Title(self.title), Desc(self.desc)
        title.xml.set("id", self.id("title"))
        desc.xml.set("id", self.id("desc"))
        d.elements = [title, desc, d.defs, self.body]
        return d.tostring()


def standalone(svg: str, width: int, height: int) -> str:
    """The same picture as a file for <img>/zoom: explicit size and an opaque background."""
    head, rest = svg.split(">", 1)
    head += f' width="{width}" height="{height}"'
    bg = f'<rect fill="{color("bg")}" height="{height}" width="{width}" x="0" y="0" />'
    # After <title><desc>: keep those first for accessibility.
    marker = "</desc>"
    i = rest.index(marker) + len(marker)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + head + ">" + rest[:i] + bg + rest[i:] + "\n"
