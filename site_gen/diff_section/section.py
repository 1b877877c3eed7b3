"""The #diff section of a stage page: kernel.cu and the project headers, against the previous stage.

Headers are keyed by where they live: a header in kernels/attention/common/ is the same file for
every stage that includes it, so it is shown when a stage starts including it; a header in the
stage's own folder is compared with the previous stage's header of the same name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..cache import DiskCache
from ..html import esc, tabbed
from . import compare, render

CODE = Path(__file__).resolve().parent  # this folder renders the cached diffs

FOLD_NEW_FILE = 60  # a newly shown file longer than this starts collapsed


@dataclass(frozen=True)
class Source:
    key: str  # identity across stages: "kernel.cu", "common/x.cuh", "local/x.cuh"
    label: str  # what the reader sees
    text: str


def stage_sources(stage) -> dict[str, Source]:
    """kernel.cu and every project header it includes, keyed for comparison across stages."""
    root = stage.dir.parent.resolve()
    out: dict[str, Source] = {}
    for path in stage.source_files():
        path = Path(path).resolve()
        if path == stage.kernel_path.resolve():
            key = label = "kernel.cu"
        elif path.parent == stage.dir.resolve():
            key, label = f"local/{path.name}", f"{stage.dir.name}/{path.name}"
        else:
            key = label = os.path.relpath(path, root).replace(os.sep, "/")
        out[key] = Source(key, label, path.read_text())
    return out


def _render(cache: DiskCache, label: str, old: str | None, new: str | None) -> dict:
    def make():
        d = compare.diff_texts(label, old, new)
        return {"status": d.status, "added": d.added, "removed": d.removed,
                "unified": render.render_unified(d) if d.status != "unchanged" else "",
                "split": render.render_split(d) if d.status == "modified" else ""}

    return cache.get("diff", [label, old, new], make, code=[CODE], libraries=["pygments"])


def diff_section(stage, prev, cache: DiskCache) -> str:
    """Markdown + raw HTML for the body of ## Diff (the heading is the caller's)."""
    cur = stage_sources(stage)
    old = stage_sources(prev) if prev is not None else {}
    keys = ["kernel.cu"] + sorted(k for k in cur if k != "kernel.cu")
    rendered = []
    for key in keys:
        before = old.get(key)
        r = _render(cache, cur[key].label, before.text if before else None, cur[key].text)
        rendered.append((cur[key], r))
    dropped = sorted(old[k].label for k in old if k not in cur)

    changed = [(src, r) for src, r in rendered if r["status"] != "unchanged"]
    added = sum(r["added"] for _, r in rendered)
    removed = sum(r["removed"] for _, r in rendered)
    headers = [src for src, r in changed if src.key != "kernel.cu"]
    out = []
    if prev is None:
        out.append("The first stage: there is nothing to compare against, so here is its whole source "
                   f"({added} lines in kernel.cu and {len(headers)} project header"
                   f"{'s' if len(headers) != 1 else ''}).\n")
    else:
        where = []
        if any(src.key == "kernel.cu" for src, _ in changed):
            where.append("kernel.cu")
        if headers:
            where.append(f"{len(headers)} header{'s' if len(headers) > 1 else ''}")
        what = f"**+{added} / −{removed} lines** in {' and '.join(where)}" if where else "**no source changes**"
        out.append(f'<p class="hd-diff-summary">Against <a href="../{prev.name}/">{esc(prev.id)} · '
                   f"{esc(prev.title)}</a>: {_md_to_html(what)}.</p>\n")
    if dropped:
        out.append('<p class="hd-diff-note">No longer included: '
                   + ", ".join(f"<code>{esc(d)}</code>" for d in dropped) + ".</p>\n")
    for n, (src, r) in enumerate(rendered, start=1):
        if r["status"] == "unchanged":
            if src.key == "kernel.cu":
                out.append('<p class="hd-diff-note"><code>kernel.cu</code> is unchanged.</p>\n')
            continue
        out.append(_file_block(src, r, f"hd_diff_{n}", first=prev is None))
    return "\n".join(out)


def _md_to_html(text: str) -> str:
    # The summary sits in a raw HTML paragraph: turn its **bold** into <strong> by hand.
    parts = text.split("**")
    return "".join(f"<strong>{esc(p)}</strong>" if i % 2 else esc(p) for i, p in enumerate(parts))


def _file_block(src: Source, r: dict, group: str, first: bool) -> str:
    stat = f'<span class="hd-stat"><span class="hd-plus">+{r["added"]}</span> <span class="hd-minus">−{r["removed"]}</span></span>'
    if r["status"] == "added":
        what = "" if first else ' <span class="hd-badge">new</span>'
        head = f'<code>{esc(src.label)}</code>{what} {stat}'
        lines = r["added"]
        opened = " open" if lines <= FOLD_NEW_FILE or src.key == "kernel.cu" else ""
        return (f'<details class="hd-file"{opened}><summary>{head}</summary>\n{r["unified"]}\n</details>\n')
    head = f'<p class="hd-file-head"><code>{esc(src.label)}</code> {stat}</p>'
    return f'<div class="hd-file">\n{head}\n' + tabbed(
        group, [("Unified", r["unified"]), ("Side by side", r["split"])]) + "\n</div>\n"
