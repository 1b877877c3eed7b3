"""Comparing two versions of a source file: blocks of highlighted rows with intra-line marks.

Both files are highlighted whole (lexer.highlight_lines) before they are compared line by line, so
a line inside a block comment is still a comment in the diff. render.py turns the result into HTML.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from .lexer import Line, highlight_lines

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
