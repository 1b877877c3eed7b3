"""Heavy HTML kept out of Markdown: pages hold a slot, the built page gets the fragment.

A stage's diff is some ten thousand elements and a page of inline SVG diagrams is thousands more.
Passed through Python-Markdown (which re-parses every raw HTML tag) and the search indexer, they
made a full build of an 18-stage site take most of a minute. So the generator writes such HTML
to docs/assets/generated/slots/<name>.html and puts a placeholder in the page; the MkDocs hook
(on_post_page) swaps each placeholder for its fragment in the final HTML. Code in the diffs is
also kept out of the search index that way, which is where it would only be noise.
"""

from __future__ import annotations

import re
from pathlib import Path

SLOT_DIR = "assets/generated/slots"
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_SLOT_RE = re.compile(r'<div class="hd-slot" data-slot="([a-z0-9][a-z0-9_.-]*)"></div>')


class SlotError(RuntimeError):
    """A page refers to a fragment that the generator did not write."""


def placeholder(name: str) -> str:
    if not _NAME_RE.match(name):
        raise ValueError(f"slot names are lower-case letters, digits, '.', '_' and '-': {name!r}")
    return f'<div class="hd-slot" data-slot="{name}"></div>'


def slot_path(docs_dir: Path, name: str) -> Path:
    return Path(docs_dir) / SLOT_DIR / f"{name}.html"


def fill(html: str, docs_dir: Path) -> str:
    """Replace every placeholder in ``html`` with its fragment's content."""

    def one(match: re.Match) -> str:
        path = slot_path(docs_dir, match.group(1))
        try:
            return path.read_text()
        except FileNotFoundError:
            raise SlotError(f"{path}: missing fragment for slot '{match.group(1)}' (run python -m site_gen)") from None

    return _SLOT_RE.sub(one, html)
