"""The site navigation: overview, hand-written pages, the stages, the backward's stages (Act V),
Part II's overview and stages (the memory-bound kernels), the gallery.

Built from the hand-written pages on disk and the generated ones in memory, so a page added by the
docs writers shows up without editing mkdocs.yml, and a missing one never breaks a strict build.
"""

from __future__ import annotations

from pathlib import Path

ACT_V = "Act V — the backward pass"
PART_II = "Part II — memory-bound kernels"
PART_II_MORE = ("rmsnorm_backward", "softmax", "softmax_backward", "cross_entropy")  # after the RMSNorm forward's pages
PREFERRED = ["introduction.md", "background.md", "method.md", "reading-guide.md", "reading_guide.md"]


def nav(docs_dir: Path, generated: list[str]) -> list:
    """``generated``: the paths of the generated pages (index.md, gallery.md, stages/NN-slug.md,
    backward/NN-slug.md, rmsnorm/index.md, rmsnorm/NN-slug.md and PART_II_MORE's <folder>/NN-slug.md)."""
    hand = sorted(p.name for p in Path(docs_dir).glob("*.md") if p.name not in generated)
    ordered = [n for n in PREFERRED if n in hand] + [n for n in hand if n not in PREFERRED]
    stages = sorted(p for p in generated if p.startswith("stages/"))
    out: list = [{"Overview": "index.md"}, *ordered]
    if "models.md" in generated:
        out.append("models.md")
    if stages:
        out.append({"Stages": stages})
    backward = sorted(p for p in generated if p.startswith("backward/"))
    if backward:
        out.append({ACT_V: backward})
    part_ii = sorted(p for p in generated if p.startswith("rmsnorm/"))
    part_ii.sort(key=lambda p: p != "rmsnorm/index.md")  # the part's overview first
    for folder in PART_II_MORE:  # then the other lineages, each after the one it follows
        part_ii += sorted(p for p in generated if p.startswith(f"{folder}/"))
    if part_ii:
        out.append({PART_II: part_ii})
    if "gallery.md" in generated:
        out.append("gallery.md")
    return out
