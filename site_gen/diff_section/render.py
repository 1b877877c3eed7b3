"""Source diffs as HTML: unified and side-by-side views with syntax and intra-line highlights.

Long unchanged runs fold into a <details> element that keeps a few lines of context on each side.
Line numbers and +/- signs are drawn from data attributes by CSS, so copying code out of the page
copies only code.
"""

from __future__ import annotations

import html
import itertools

from .compare import Block, FileDiff, Row
from .lexer import Line

CONTEXT = 3  # unchanged lines kept visible around each change
MIN_FOLD = 4  # fold an unchanged run only when it hides at least this many lines


def _esc(text: str) -> str:
    return html.escape(text, quote=False)


def render_runs(runs: Line, marks: tuple[tuple[int, int], ...] = ()) -> str:
    """Token runs as spans of Pygments classes; characters inside ``marks`` also get ``hd-x``."""
    out = []
    pos = 0
    for cls, text in runs:
        end = pos + len(text)
        # Cut this run at every mark boundary that falls inside it.
        cuts = sorted({pos, end, *(c for a, b in marks for c in (a, b) if pos < c < end)})
        for a, b in itertools.pairwise(cuts):
            piece = _esc(text[a - pos:b - pos])
            changed = any(ma <= a and b <= mb for ma, mb in marks)
            classes = " ".join(c for c in (cls, "hd-x" if changed else "") if c)
            out.append(f'<span class="{classes}">{piece}</span>' if classes else piece)
        pos = end
    return "".join(out)


def _no(n: int | None) -> str:
    return f'<span class="hd-no" data-n="{n}"></span>' if n is not None else '<span class="hd-no"></span>'


def _unified_row(row: Row) -> str:
    return (f'<div class="hd-row hd-{row.tag}">{_no(row.old_no)}{_no(row.new_no)}'
            f'<span class="hd-sign"></span><code>{render_runs(row.runs, row.marks)}</code></div>')


def _side(row: Row | None, number: int | None) -> str:
    if row is None:
        return '<span class="hd-no"></span><code class="hd-none"></code>'
    cls = "" if row.tag == "eq" else f' class="hd-{row.tag}"'
    return f'{_no(number)}<code{cls}>{render_runs(row.runs, row.marks)}</code>'


def _split_row(old: Row | None, new: Row | None) -> str:
    tag = "eq" if old is not None and old.tag == "eq" else "chg"
    return (f'<div class="hd-row hd-{tag}">{_side(old, old.old_no if old else None)}'
            f'{_side(new, new.new_no if new else None)}</div>')


def _fold_ranges(diff: FileDiff) -> list[tuple[str, Block, int, int]]:
    """(mode, block, start, stop) pieces: mode 'show' or 'fold' over each block's row indices."""
    pieces = []
    last = len(diff.blocks) - 1
    for b, block in enumerate(diff.blocks):
        n = len(block.new)
        if block.kind != "eq":
            pieces.append(("show", block, 0, n))
            continue
        head = 0 if b == 0 else CONTEXT  # no leading context before the first change ...
        tail = 0 if b == last else CONTEXT  # ... and no trailing context after the last one
        if n - head - tail < MIN_FOLD:
            pieces.append(("show", block, 0, n))
            continue
        if head:
            pieces.append(("show", block, 0, head))
        pieces.append(("fold", block, head, n - tail))
        if tail:
            pieces.append(("show", block, n - tail, n))
    return pieces


def _fold(rows_html: str, block: Block, start: int, stop: int) -> str:
    first, last = block.new[start], block.new[stop - 1]
    where = (f"lines {first.new_no}–{last.new_no}" if first.old_no == first.new_no
             else f"old {first.old_no}–{last.old_no}, new {first.new_no}–{last.new_no}")
    return (f'<details class="hd-fold"><summary>{stop - start} unchanged lines ({where})</summary>'
            f'{rows_html}</details>')


def render_unified(diff: FileDiff) -> str:
    parts = []
    for mode, block, start, stop in _fold_ranges(diff):
        if block.kind == "chg":
            rows = "\n".join(_unified_row(r) for r in block.old + block.new)
        else:
            rows = "\n".join(_unified_row(r) for r in block.new[start:stop])
        parts.append(_fold(rows, block, start, stop) if mode == "fold" else rows)
    return f'<div class="hd-diff hd-unified highlight"><div class="hd-lines">\n{chr(10).join(parts)}\n</div></div>'


def render_split(diff: FileDiff) -> str:
    parts = []
    for mode, block, start, stop in _fold_ranges(diff):
        if block.kind == "chg":
            n = max(len(block.old), len(block.new))
            pad_old = block.old + (None,) * (n - len(block.old))
            pad_new = block.new + (None,) * (n - len(block.new))
            rows = "\n".join(_split_row(o, w) for o, w in zip(pad_old, pad_new))
        else:
            rows = "\n".join(_split_row(r, r) for r in block.new[start:stop])
        parts.append(_fold(rows, block, start, stop) if mode == "fold" else rows)
    return f'<div class="hd-diff hd-split highlight"><div class="hd-lines">\n{chr(10).join(parts)}\n</div></div>'
