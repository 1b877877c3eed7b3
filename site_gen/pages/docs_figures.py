"""Figures of the hand-written pages (docs/introduction.md, docs/hopper.md).

A page refers to a generated figure as an ordinary Markdown image of its standalone file,
``![Online softmax](assets/generated/diagrams/c-online-softmax.svg)``, which any Markdown viewer
shows; the built page gets the inline figure instead (site_gen/fragments.py swaps it in), so it
follows the theme and has its caption and full-screen view.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..diagrams.section import figures

DOC_PAGES = (("introduction.md", "introduction"), ("hopper.md", "Hopper machine model"))


def fragment_name(diagram_id: str) -> str:
    return f"docfig-{diagram_id}"


def add(diagrams, site) -> None:
    """Every hand-written page's figure as a fragment (the pages sit one folder below the root)."""
    for d in diagrams:
        site.add_fragment(fragment_name(d.id), figures([d], site, depth=1))


_REF_RE = re.compile(r"assets/generated/diagrams/([a-z0-9-]+)\.svg")


def referenced(docs_dir: Path) -> list[str]:
    """The ids of the generated figures the hand-written pages show, in page order."""
    out: list[str] = []
    for page in sorted(Path(docs_dir).glob("*.md")):
        for fid in _REF_RE.findall(page.read_text()):
            if fid not in out:
                out.append(fid)
    return out
