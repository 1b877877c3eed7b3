"""SVG primitives and the colour theme shared by every diagram.

Why not plain svgwrite calls everywhere: svgwrite numbers ids from a process-wide counter and
writes raw float reprs, so the same picture would differ between builds and ids would collide
when several diagrams are inlined on one page. ``Canvas`` gives every id the diagram's prefix,
rounds every coordinate to 0.1 and writes colours as CSS variables with light-theme fallbacks
(the variables are defined for both Material schemes in docs/assets/stylesheets/diagrams.css).
"""

from __future__ import annotations

import functools
import re
import xml.etree.ElementTree as ET
import zlib

import svgwrite
from svgwrite.base import Desc, Title

# Theme key -> light fallback. The CSS file defines --hd-<key> for "default" and "slate"; the pairs
# that must read (text 4.5:1, graphics 3:1, in both themes) are contrast_pairs() below, checked by
# tests/test_palette_contrast.py against the CSS.
PALETTE = {
    "bg": "#ffffff", "panel": "#f4f6fa", "panel2": "#e9edf5", "fg": "#1f2430", "muted": "#535b6a",
    "stroke": "#7b8495", "grid": "#d9dee7",
    "q": "#2a5fc8", "k": "#a84f00", "v": "#1a7048", "s": "#7544c4", "p": "#ad3580", "o": "#0a6e7a",
    "load": "#a84f00", "tensor": "#2a5fc8", "softmax": "#ad3580", "epilogue": "#0a6e7a",
    "bar": "#b02f2f", "accent": "#845d00", "ok": "#1a7048", "skip": "#d3d7df", "mask": "#845d00",
    "warp": "#58657f",
    "store": "#4d7000",  # the TMA store of O (stage 15 on): apart from the epilogue's red and the operands
    # warp roles: muted tones, apart from the saturated operand colours above
    "producer": "#5f6b12", "consumer": "#4a5d7e", "consumer2": "#865741",
    # what changed against the previous stage: a highlighter behind the item (a pale fill that text
    # reads on, outlined in hlline so the mark itself stands out), a tag beside it
    "hl": "#fff0a6", "hlfg": "#5c4400", "hlline": "#9a7300",
    # the ink of a label drawn on a strong fill (a bar, a box in an operand's colour): Canvas.text
    # draws fill="bg" text in it (white in the light theme, near-black in the dark one)
    "on": "#ffffff",
}
# The colours drawn as bars, boxes, arrows and coloured text: each must read as text on the surfaces
# (4.5:1), as a graphic (3:1), and carry an "on" label at the lowest opacity a labelled fill is
# drawn with (LABEL_OPACITY); see contrast_pairs().
STRONG = ("q", "k", "v", "s", "p", "o", "load", "tensor", "softmax", "epilogue", "bar", "accent", "ok", "mask",
          "warp", "store", "producer", "consumer", "consumer2")
LABEL_OPACITY = 0.9  # the faintest fill a label sits on (the model timeline's odd iterations)


def contrast_pairs() -> list[tuple[str, str, str, float]]:
    """(what, ink, surface, minimum ratio) for every pair the figures draw; a surface is a key or
    "key@alpha" (that colour at that opacity over bg) or "key@alpha/under@alpha" (over a highlight)."""
    out = []
    for k in STRONG:
        out += [("text", k, s, 4.5) for s in ("bg", "panel")]
        out += [("graphic", k, s, 3.0) for s in ("bg", "panel", "panel2")]
        out += [("graphic", f"{k}@0.75", s, 3.0) for s in ("bg", "panel")]  # a wgmma in flight, at 0.75
        out += [("label", "on", f"{k}@{LABEL_OPACITY}", 4.5), ("label", "on", k, 4.5)]
        # the text of a box tinted in its operand's colour, and of one on a highlight
        out += [("text", ink, f"{k}@0.2", 4.5) for ink in ("fg", "muted")]
        out += [("text", ink, f"{k}@0.2/hl@0.6", 4.5) for ink in ("fg", "muted")]
    for ink in ("fg", "muted"):
        out += [("text", ink, s, 4.5) for s in ("bg", "panel", "panel2", "skip", "hl", "hl@0.45", "hl@0.6")]
    out += [("text", "hlfg", "hl", 4.5)]
    out += [("graphic", "stroke", s, 3.0) for s in ("bg", "panel", "panel2")]
    out += [("graphic", "hlline", s, 3.0) for s in ("bg", "panel")]
    return out


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


# Advance widths (1/1000 em) of Arial / Helvetica, the fonts the site's SVG text falls back to
# (Material without web fonts: Helvetica, Arial, sans-serif; Liberation Sans has Arial's metrics).
# Characters Arial lacks (ᵀ, ⊕, subscripts) take DejaVu Sans' widths, the usual fallback.
_GLYPHS = (' !"#$%&\'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~'
           '×·–—→←↓↑↔≤≥ᵀµ⊕′…₋₀₁₂₃√∑Σαβτℓ≈⌈⌉÷±°²³¹⁴ⁿ✓✗▶◀▲▼●○■□‹›«»“”‘’')
_REGULAR = (278, 278, 355, 556, 556, 889, 667, 191, 333, 333, 389, 584, 278, 333, 278, 278, 556, 556, 556, 556,
            556, 556, 556, 556, 556, 556, 278, 278, 584, 584, 584, 556, 1015, 667, 667, 722, 722, 667, 611, 778,
            722, 278, 500, 667, 556, 833, 722, 778, 667, 778, 722, 667, 611, 722, 667, 944, 667, 667, 611, 278,
            278, 278, 469, 556, 333, 556, 556, 500, 556, 556, 278, 556, 556, 222, 222, 500, 222, 833, 556, 556,
            556, 556, 333, 500, 278, 556, 500, 722, 500, 500, 500, 334, 260, 334, 584, 584, 278, 556, 1000, 1000,
            1000, 500, 500, 1000, 549, 549, 385, 576, 838, 188, 1000, 528, 401, 401, 401, 401, 549, 713, 618, 578,
            575, 395, 323, 549, 390, 390, 549, 549, 400, 333, 333, 333, 401, 365, 838, 838, 769, 769, 990, 990,
            604, 604, 604, 604, 333, 333, 556, 556, 333, 333, 222, 222)
_BOLD = (278, 333, 474, 556, 556, 889, 722, 238, 333, 333, 389, 584, 278, 333, 278, 278, 556, 556, 556, 556, 556,
         556, 556, 556, 556, 556, 333, 333, 584, 584, 584, 611, 975, 722, 722, 722, 722, 667, 611, 778, 722, 278,
         556, 722, 611, 833, 722, 778, 667, 778, 722, 667, 611, 722, 667, 944, 667, 667, 611, 333, 278, 333, 584,
         556, 333, 556, 611, 556, 611, 556, 333, 611, 611, 278, 278, 556, 278, 889, 611, 611, 611, 611, 389, 556,
         333, 611, 556, 778, 556, 556, 500, 389, 280, 389, 584, 584, 278, 556, 1000, 1000, 1000, 500, 500, 1000,
         549, 549, 430, 576, 838, 240, 1000, 528, 438, 438, 438, 438, 549, 713, 600, 615, 610, 446, 489, 549,
         457, 457, 549, 549, 400, 333, 333, 333, 438, 396, 838, 838, 769, 769, 990, 990, 604, 604, 604, 604, 333,
         333, 556, 556, 500, 500, 278, 278)
_WIDTH = {False: dict(zip(_GLYPHS, _REGULAR)), True: dict(zip(_GLYPHS, _BOLD))}
MONO_EM = 0.602  # every glyph of DejaVu Sans Mono / Liberation Mono
SAFETY = 1.04  # other sans-serif fonts (Helvetica, Roboto) run up to a few per cent wider


def text_width(s: str, size: float = 12, bold: bool = False, mono: bool = False) -> float:
    """Width of ``s`` in px at font size ``size``, from Arial's advance widths (a few per cent of
    margin for other sans-serif fonts); what boxes are sized by and overlaps are checked with."""
    if mono:
        return len(s) * size * MONO_EM
    table = _WIDTH[bool(bold)]
    return sum(table.get(ch, 600) for ch in str(s)) * size / 1000 * SAFETY


def wrap(s: str, width: float, size: float = 12, bold: bool = False) -> list[str]:
    """``s`` broken at spaces into lines no wider than ``width`` px (a long word stays whole)."""
    out, cur = [], ""
    for word in s.split():
        trial = f"{cur} {word}".strip()
        if cur and text_width(trial, size, bold=bold) > width:
            out.append(cur)
            cur = word
        else:
            cur = trial
    return out + [cur] if cur else out


def fmt_bytes(n: int) -> str:
    """Whole MiB or KiB, and the bytes past them: "64 KiB", "96 KiB + 24 B" (the site's one way)."""
    n = int(n)
    if n >= 1024 * 1024 and n % (1024 * 1024) == 0:
        return f"{n // (1024 * 1024)} MiB"
    if n >= 1024:
        kib, rest = divmod(n, 1024)
        return f"{kib} KiB" + (f" + {rest} B" if rest else "")
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
        if fill == "hl":  # a highlight is outlined: its pale fill alone does not stand out (3:1)
            stroke, sw = "hlline", max(sw, 1.5)
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
             parent=None, cls="hd-text", rotate=None):
        if fill == "bg":  # text in the background's colour is a label on a strong fill
            fill = "on"
        kw = {"font-size": num(size), "fill": color(fill), "class": cls}
        if anchor != "start":
            kw["text-anchor"] = anchor
        if weight:
            kw["font-weight"] = weight
        if mono:
            kw["font-family"] = MONO
            kw["class"] = "hd-mono"
        if fill == "on":  # no halo (see compact): the label's own fill is what it reads on
            kw["class"] += " hd-on"
        if italic:
            kw["font-style"] = "italic"
        if rotate:
            kw["transform"] = f"rotate({num(rotate)} {num(x)} {num(y)})"
        el = self.d.text(str(s), insert=(num(x), num(y)), **kw)
        (parent or self.body).add(el)
        return el

    def heading(self, main: str, more: str = "", x: float = 12, y: float = 22, size: float = 14):
        """The figure's title line: ``main``, then ``more`` if the two fit the width."""
        full = f"{main}{more}"
        text = full if text_width(full, size, bold=True) <= self.width - 2 * x else main
        while text_width(text, size, bold=True) > self.width - 2 * x and size > 12:
            size -= 0.5
        return self.text(x, y, text, size=size, weight="600")

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


# --- the page's form of a picture ---------------------------------------------------------------
SVG_NS = "http://www.w3.org/2000/svg"
# Presentation attributes that move into a class of the picture's own <style> (font-size stays an
# attribute: the full-screen view reads it); rx stays too (not a CSS property in every browser).
_STYLED = ("fill", "stroke", "stroke-width", "fill-opacity", "stroke-opacity", "opacity", "stroke-dasharray",
           "text-anchor", "font-weight", "font-style")
_KEEP_CLASSES = ("hd-mono", "hd-halo", "hd-on")  # styled by the site's stylesheet or the picture's <style>
# Every text but a label on a strong fill gets a halo of the background (paint-order: stroke): where
# it crosses a tinted box, a line or a hatch, its glyphs still sit on the background's colour, so its
# contrast is that of its ink on bg (the pairs tests/test_palette_contrast.py checks), whatever the
# tint under it (the figures tint boxes up to 0.6 of an operand's colour). On the site the rule is
# docs/assets/stylesheets/diagrams.css's (once per page); a standalone file carries its own.
_HALO = "{{paint-order:stroke;stroke:var(--hd-bg,{bg});stroke-width:3px;stroke-linejoin:round}}"
_DROP_ROOT = ("baseProfile", "version")


def _class_name(i: int, token: str = "") -> str:
    """The i-th class of a picture: its token (two letters from its id), then a, b, ..., z, aa, ...
    The token keeps pictures' classes apart: a browser files rules by their class, and a page of 80
    pictures that all called their classes a, b, c would make it test every element of every picture
    against 80 rules each (the gallery took three times as long to style)."""
    name = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        name = chr(97 + r) + name
    return token + name


def _token(did: str) -> str:
    h = zlib.crc32(did.encode())
    return chr(97 + h % 26) + chr(97 + h // 26 % 26)


def _css_value(v: str) -> str:
    return v.replace(", #", ",#")


@functools.lru_cache(maxsize=512)
def compact(svg: str) -> str:
    """The picture as the page and its file carry it: the same drawing in a third to a half of the
    bytes. Each distinct set of presentation attributes (fill, stroke, widths, anchor, weight) becomes
    one short class of a <style> scoped by the picture's id, colours still theme variables with their
    light fallbacks (so the file works alone); ids nothing refers to, classes no stylesheet uses and
    svgwrite's unused namespaces go. (An event's group of one shape and its tooltip stays a group: a
    <title> inside a <rect> made Chromium restyle a page of traces three times slower.)
    Deterministic: classes are named in document order. ``svg`` without an id is returned as it is."""
    root = ET.fromstring(svg)
    did = root.get("id")
    if not did:
        return svg
    referenced = {did, *re.findall(r"url\(#([^)]+)\)", svg), *re.findall(r'href="#([^"]+)"', svg)}
    referenced.update((root.get("aria-labelledby") or "").split())
    for a in _DROP_ROOT:
        root.attrib.pop(a, None)
    classes: dict[tuple, str] = {}
    token = _token(did)

    def restyle(el):
        for child in list(el):
            tag = child.tag.rsplit("}", 1)[-1]
            if tag in ("title", "desc", "style"):
                continue
            restyle(child)
        if el is root:
            return
        cid = el.get("id")
        if cid and cid not in referenced:
            del el.attrib["id"]
        keep = [c for c in (el.get("class") or "").split() if c in _KEEP_CLASSES]
        styled = tuple((a, el.attrib.pop(a)) for a in _STYLED if a in el.attrib)
        if styled:
            keep.insert(0, classes.setdefault(styled, _class_name(len(classes), token)))
        if keep:
            el.set("class", " ".join(keep))
        else:
            el.attrib.pop("class", None)

    restyle(root)
    for defs in root.findall(f"{{{SVG_NS}}}defs"):
        if not len(defs):
            root.remove(defs)
    if classes:
        style = ET.Element(f"{{{SVG_NS}}}style")
        style.text = "".join(f"#{did} .{name}{{" + ";".join(f"{a}:{_css_value(v)}" for a, v in styled) + "}"
                             for styled, name in classes.items())
        at = 2 if len(root) >= 2 and root[1].tag == f"{{{SVG_NS}}}desc" else 0  # after <title><desc>
        root.insert(at, style)
    out = ET.tostring(root, encoding="unicode")
    return out.replace(" />", "/>")


ET.register_namespace("", SVG_NS)


def standalone(svg: str, width: int, height: int) -> str:
    """The same picture as a file for <img>/zoom: the page's form (compact), an explicit size and an
    opaque background. Its colours are the theme variables' light fallbacks; inlined into a page
    (figures.js loads some on demand), the site's variables take over."""
    small = compact(svg)
    found = re.search(r'<svg[^>]* id="([^"]+)"', small)
    if found and "<style>" in small:  # the halo the site's stylesheet gives its pictures (_HALO)
        did = found.group(1)
        halo = f"#{did} text" + _HALO.format(bg=PALETTE["bg"]) + f"#{did} .hd-on{{stroke:none}}"
        small = small.replace("<style>", f"<style>{halo}", 1)
    head, rest = small.split(">", 1)
    head += f' width="{width}" height="{height}"'
    bg = f'<rect class="hd-file-bg" fill="{color("bg")}" height="{height}" width="{width}" x="0" y="0"/>'
    # After <title><desc>: keep those first for accessibility.
    marker = "</desc>"
    i = rest.index(marker) + len(marker) if marker in rest else 0
    return '<?xml version="1.0" encoding="utf-8"?>\n' + head + ">" + rest[:i] + bg + rest[i:] + "\n"


def _texts(svg: str) -> list[tuple[list[tuple[float, float]], float, str]]:
    """(corners, rotation in degrees, text) of every <text>, in viewBox units, by text_width."""
    import math
    import re
    import xml.etree.ElementTree as ET

    ns = "{http://www.w3.org/2000/svg}"
    out = []
    for el in ET.fromstring(svg).iter(ns + "text"):
        s = "".join(el.itertext())
        x, y, size = float(el.get("x", 0)), float(el.get("y", 0)), float(el.get("font-size", 12))
        bold = el.get("font-weight") in ("600", "700", "bold")
        w = text_width(s, size, bold=bold, mono=el.get("class") == "hd-mono")
        x0 = x - {"start": 0, "middle": w / 2, "end": w}[el.get("text-anchor", "start")]
        top, bottom = y - 0.86 * size, y + 0.26 * size  # the line box a browser reports (ascent, descent)
        corners = [(x0, top), (x0 + w, top), (x0, bottom), (x0 + w, bottom)]
        angle = 0.0
        rot = re.match(r"rotate\((-?[\d.]+) (-?[\d.]+) (-?[\d.]+)\)", el.get("transform", ""))
        if rot:
            angle, cx, cy = (float(v) for v in rot.groups())
            a = math.radians(angle)
            corners = [(cx + (px - cx) * math.cos(a) - (py - cy) * math.sin(a),
                        cy + (px - cx) * math.sin(a) + (py - cy) * math.cos(a)) for px, py in corners]
        out.append((corners, angle, s))
    return out


def _aabb(corners, angle=0.0):
    """The box around ``corners`` in a frame turned by ``angle`` degrees (0: the page's)."""
    import math

    a = math.radians(-angle)
    pts = [(px * math.cos(a) - py * math.sin(a), px * math.sin(a) + py * math.cos(a)) for px, py in corners]
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    return min(xs), min(ys), max(xs), max(ys)


def text_boxes(svg: str) -> list[tuple[float, float, float, float, str]]:
    """(x0, y0, x1, y1, text) of every <text> of an SVG string, in viewBox units: where it lands by
    text_width, for the checks that no text is clipped by the viewBox or overlaps another."""
    return [(*_aabb(corners), s) for corners, _angle, s in _texts(svg)]


def text_problems(svg: str, width: float, height: float, slack: float = 1.0) -> list[str]:
    """Texts that run past the canvas or overlap another text (by their estimated boxes; two texts
    turned by the same angle are compared in their own frame)."""
    items = _texts(svg)
    out = []
    for corners, _angle, s in items:
        b = _aabb(corners)
        if b[0] < -slack or b[1] < -slack or b[2] > width + slack or b[3] > height + slack:
            out.append(f"clipped: {s!r}")
    for i, (ca, aa, sa) in enumerate(items):
        for cb, ab, sb in items[i + 1:]:
            frame = aa if aa == ab else 0.0
            a, b = _aabb(ca, frame), _aabb(cb, frame)
            if a[0] < b[2] - slack and b[0] < a[2] - slack and a[1] < b[3] - slack and b[1] < a[3] - slack:
                out.append(f"overlap: {sa!r} / {sb!r}")
    return out


def content_bottom(svg: str) -> float:
    """The lowest point anything of the picture reaches (text by its estimated box)."""
    import xml.etree.ElementTree as ET

    ns = "{http://www.w3.org/2000/svg}"
    bottom = max((b[3] for b in text_boxes(svg)), default=0.0)
    for el in ET.fromstring(svg).iter():
        if el.tag == ns + "rect" and el.get("y") is not None:
            bottom = max(bottom, float(el.get("y")) + float(el.get("height", 0)))
        elif el.tag == ns + "line":
            bottom = max(bottom, float(el.get("y1", 0)), float(el.get("y2", 0)))
    return bottom
