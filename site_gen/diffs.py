"""Source diffs as HTML: unified and side-by-side views with syntax and intra-line highlights.

Both files are highlighted whole (lexer.highlight_lines) before they are compared line by line, so
a line inside a block comment is still a comment in the diff. Long unchanged runs fold into a
<details> element that keeps a few lines of context on each side. Line numbers and +/- signs are
drawn from data attributes by CSS, so copying code out of the page copies only code.
"""

from __future__ import annotations

import difflib
import html
import itertools
import re
from dataclasses import dataclass

from .lexer import Line, highlight_lines

CONTEXT = 3  # unchanged lines kept visible around each change
MIN_FOLD = 4  # fold an unchanged run only when it hides at least this many lines
PAIR_RATIO = 0.5  # below this token similarity a replaced line is shown as wholly new, no marks
_TOKEN_RE = re.compile(r"\w+|\s+|[^\w\s]")


@dataclass(frozen=True)
class Row:
    """One line of the diff: tag is 'eq', 'del' or 'add'; marks are changed character spans."""

    tag: str
    old_no: int | None
    new_no: int | None
    runs: Line
    marks: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Block:
    """A run of rows: 'eq' (unchanged, foldable) or 'chg' (deleted rows then added rows)."""

    kind: str
    old: tuple[Row, ...]
    new: tuple[Row, ...]


@dataclass(frozen=True)
class FileDiff:
    label: str  # path shown to the reader, e.g. "kernel.cu" or "common/tma.cuh"
    status: str  # modified | added | removed | unchanged
    added: int
    removed: int
    blocks: tuple[Block, ...]


def split_lines(text: str) -> list[str]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _token_marks(a: str, b: str) -> tuple[tuple, tuple] | None:
    """Character spans that differ between two lines, compared token by token; None if too different."""
    ta, tb = _TOKEN_RE.findall(a), _TOKEN_RE.findall(b)
    # Judge similarity on the words and symbols only: shared spaces make any two lines look alike.
    words = difflib.SequenceMatcher(None, [t for t in ta if not t.isspace()],
                                    [t for t in tb if not t.isspace()], autojunk=False)
    if words.ratio() < PAIR_RATIO:
        return None
    sm = difflib.SequenceMatcher(None, ta, tb, autojunk=False)
    offs_a = [0]
    for t in ta:
        offs_a.append(offs_a[-1] + len(t))
    offs_b = [0]
    for t in tb:
        offs_b.append(offs_b[-1] + len(t))
    ma, mb = [], []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            continue
        # Re-indentation alone is not worth a mark: skip runs that are only whitespace.
        if i2 > i1 and "".join(ta[i1:i2]).strip():
            ma.append((offs_a[i1], offs_a[i2]))
        if j2 > j1 and "".join(tb[j1:j2]).strip():
            mb.append((offs_b[j1], offs_b[j2]))
    return tuple(ma), tuple(mb)


def diff_texts(label: str, old: str | None, new: str | None) -> FileDiff:
    """Compare two versions of a file (None = absent) into blocks of highlighted rows."""
    old_lines, new_lines = split_lines(old or ""), split_lines(new or "")
    old_hl, new_hl = highlight_lines(old or ""), highlight_lines(new or "")
    sm = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    blocks: list[Block] = []
    added = removed = 0
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            rows = tuple(Row("eq", i + 1, j + 1, new_hl[j]) for i, j in zip(range(i1, i2), range(j1, j2)))
            blocks.append(Block("eq", rows, rows))
            continue
        marks_old: dict[int, tuple] = {}
        marks_new: dict[int, tuple] = {}
        if tag == "replace":
            # Pair the k-th removed line with the k-th added one; similar pairs get token marks.
            for k in range(min(i2 - i1, j2 - j1)):
                m = _token_marks(old_lines[i1 + k], new_lines[j1 + k])
                if m is not None:
                    marks_old[i1 + k], marks_new[j1 + k] = m
        dels = tuple(Row("del", i + 1, None, old_hl[i], marks_old.get(i, ())) for i in range(i1, i2))
        adds = tuple(Row("add", None, j + 1, new_hl[j], marks_new.get(j, ())) for j in range(j1, j2))
        removed += len(dels)
        added += len(adds)
        blocks.append(Block("chg", dels, adds))
    if old is None:
        status = "added"
    elif new is None:
        status = "removed"
    else:
        status = "modified" if added or removed else "unchanged"
    return FileDiff(label, status, added, removed, tuple(blocks))


# --- HTML -----------------------------------------------------------------------------------------


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
