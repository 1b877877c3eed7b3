"""Small HTML/Markdown building blocks shared by the page and section builders.

Generated HTML goes into pages as raw HTML blocks (a block-level tag at the start of a line after a
blank line), which Python-Markdown passes through untouched; inside Markdown constructs such as
pymdownx.tabbed it would be run through the inline parser, and `__global__` would turn bold. So the
diff tabs are written directly in the markup that pymdownx.tabbed (alternate_style) produces, which
Material's CSS and JavaScript then drive like any other content tabs.
"""

from __future__ import annotations

import html

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


def figure(fig_id: str, svg: str, caption: str, title: str, full_size: str | None = None, *,
           kind: str = "", stage: int | None = None) -> str:
    """An inline SVG with its caption; inline so the diagram follows the theme's CSS variables.
    ``full_size``: URL of the standalone file. The full-screen button is wired by
    docs/assets/javascripts/figures.js (it opens the figure at a size its text can be read at)."""
    cap = inline_markdown(caption) if caption.strip() else ""
    links = '<button class="hd-zoom" type="button" title="Show at full size, pan and zoom">Full screen</button>'
    if full_size:
        links += f' · <a href="{esc(full_size)}" target="_blank" rel="noopener">SVG file</a>'
    cap += f'<p class="hd-figure-links">{links}</p>'
    data = f' data-kind="{esc(kind)}"' if kind else ""
    if stage is not None:
        data += f' data-stage="{stage:02d}"'
    return (f'<figure class="hd-figure" id="fig-{esc(fig_id)}"{data} aria-label="{esc(title)}">\n'
            f'<div class="hd-figure-svg">{svg.strip()}</div>\n<figcaption>{cap}</figcaption>\n</figure>')


def note(kind: str, title: str, body: str) -> str:
    """An admonition (Markdown)."""
    inner = "\n".join("    " + line if line else "" for line in body.strip().splitlines())
    return f'!!! {kind} "{title}"\n\n{inner}\n'
