"""Small HTML/Markdown building blocks shared by the page and section builders.

Generated HTML goes into pages as raw HTML blocks (a block-level tag at the start of a line after a
blank line), which Python-Markdown passes through untouched; inside Markdown constructs such as
pymdownx.tabbed it would be run through the inline parser, and `__global__` would turn bold. So the
diff tabs are written directly in the markup that pymdownx.tabbed (alternate_style) produces, which
Material's CSS and JavaScript then drive like any other content tabs.
"""

from __future__ import annotations

import html
import math
import re

import markdown


def esc(text: str) -> str:
    return html.escape(text, quote=True)


def tabbed(group: str, tabs: list[tuple[str, str]]) -> str:
    """Content tabs (label, inner HTML) in pymdownx.tabbed's alternate-style markup; ``group`` must
    be unique on the page (it names the radio inputs)."""
    inputs = "".join(
        f'<input{" checked" if i == 0 else ""} id="{group}_{i + 1}" name="{group}" type="radio">'
        for i in range(len(tabs)))
    labels = "".join(f'<label for="{group}_{i + 1}">{esc(label)}</label>' for i, (label, _) in enumerate(tabs))
    blocks = "\n".join(f'<div class="tabbed-block">\n{body}\n</div>' for _, body in tabs)
    return (f'<div class="tabbed-set tabbed-alternate" data-tabs="{group}:{len(tabs)}">{inputs}'
            f'<div class="tabbed-labels">{labels}</div>\n<div class="tabbed-content">\n{blocks}\n</div>\n</div>')


def inline_markdown(text: str) -> str:
    """Markdown (a caption, a short note) to HTML for use inside a raw HTML block."""
    return markdown.markdown(text, extensions=["attr_list"], output_format="html")


MIN_TEXT_PX = 11  # the smallest text a figure may show on screen: inline where it scrolls, else full screen
_FONT_RE = re.compile(r'font-size="([\d.]+)"')
_VIEWBOX_RE = re.compile(r'viewBox="[-\d.]+ [-\d.]+ ([\d.]+) ([\d.]+)"')


def legible_width(svg: str) -> int:
    """The width (px) at which the picture's smallest text is MIN_TEXT_PX on screen (0: no viewBox)."""
    box = _VIEWBOX_RE.search(svg)
    if not box:
        return 0
    sizes = [float(x) for x in _FONT_RE.findall(svg)] or [12.0]
    return math.ceil(float(box.group(1)) * MIN_TEXT_PX / min(sizes)) + 1


def figure(fig_id: str, svg: str, caption: str, title: str, full_size: str | None = None, *,
           kind: str = "", stage: int | None = None, scroll: bool | int = False, defer: bool = False,
           compact: bool = True, lead: bool = False) -> str:
    """An inline SVG with its caption; inline so the diagram follows the theme's CSS variables, in its
    compact form (site_gen/diagrams/svg.py: the same drawing in fewer bytes). ``full_size``: URL of
    the standalone file. The full-screen button is wired by docs/assets/javascripts/figures.js (it
    opens the figure at a size its text can be read at, on any screen).

    ``scroll``: the picture never shrinks below the width at which its smallest text reads at
    MIN_TEXT_PX (or below ``scroll`` px when a number): on a narrow screen it scrolls sideways, with
    a hint, instead of shrinking to an illegible overview. A stage's lead figure is shown so: on a
    phone it is read in place, at its full scale, and the sideways scroll keeps every label where the
    drawing put it (a second, phone-only layout of every figure would double what the generator
    draws and checks). ``defer``: the picture is not in the page; figures.js loads its file
    (``full_size``) when it comes into view (for the heavy ones in a closed <details>). ``lead``: the
    figure a stage page opens with (class hd-figure-lead)."""
    cap = inline_markdown(caption) if caption.strip() else ""
    links = '<button class="hd-zoom" type="button" title="Show at full size, pan and zoom">Full screen</button>'
    if full_size:
        links += f' · <a href="{esc(full_size)}" target="_blank" rel="noopener">SVG file</a>'
    cap += f'<p class="hd-figure-links">{links}</p>'
    data = f' data-kind="{esc(kind)}"' if kind else ""
    if stage is not None:
        data += f' data-stage="{stage:02d}"'
    svg = svg.strip()
    width = (scroll if scroll is not True else 0) or legible_width(svg)
    if defer:
        if not full_size:
            raise ValueError(f"figure {fig_id}: a deferred figure needs its file (full_size)")
        box = _VIEWBOX_RE.search(svg)
        ratio = f' style="aspect-ratio: {box.group(1)} / {box.group(2)}"' if box else ""
        sid = re.search(r'<svg[^>]* id="([^"]+)"', svg)  # the placeholder stands for the picture until loaded
        ident = f' id="{esc(sid.group(1))}"' if sid else ""
        pic = (f'<div class="hd-deferred" data-src="{esc(full_size)}"{ident}{ratio}>'
               f'<p>Loading the figure… (<a href="{esc(full_size)}">its SVG file</a>)</p></div>')
    else:
        pic = _compact(svg) if compact else svg
    cls = "hd-figure hd-figure-lead" if lead else "hd-figure"
    if scroll and width:
        cls += " hd-figure-scroll"
        pic = (f'<p class="hd-scroll-hint" aria-hidden="true">Wider than the screen: scroll it sideways, or open '
               f'it full screen.</p><div class="hd-figure-svg"><div class="hd-figure-wide" '
               f'style="min-width: {width}px">{pic}</div></div>')
    else:
        pic = f'<div class="hd-figure-svg">{pic}</div>'
    return (f'<figure class="{cls}" id="fig-{esc(fig_id)}"{data} aria-label="{esc(title)}">\n'
            f'{pic}\n<figcaption>{cap}</figcaption>\n</figure>')


def _compact(svg: str) -> str:
    from .diagrams.svg import compact  # the diagrams package imports this module's helpers

    try:
        return compact(svg)
    except Exception as err:  # noqa: BLE001 - name the picture
        raise ValueError(f"an SVG that does not parse: {svg[:80]!r}: {err}") from err


def note(kind: str, title: str, body: str) -> str:
    """An admonition (Markdown)."""
    inner = "\n".join("    " + line if line else "" for line in body.strip().splitlines())
    return f'!!! {kind} "{title}"\n\n{inner}\n'
