"""The identity of C/C++/CUDA sources: a hash of their token stream, not of their bytes.

A stage's records (its benchmark numbers, its traces, its compiler facts) are stamped with the
hash of the sources they were made from; a record whose stamp differs from the sources of today is
stale. Hashing tokens instead of bytes lets a comment or the layout of the code change without
making any number stale, while any change the compiler could see changes the hash:

- comments (``//`` to the end of the line, ``/* ... */``) and whitespace are left out;
- every other token is kept as written: identifiers and keywords, numbers (``0x1'000``, ``1.5e-3f``),
  string and character literals whole (prefixes, escapes and raw strings included), punctuators by
  maximal munch (``a + + b`` is not ``a ++ b``);
- a preprocessor directive's end is a token too (``#define A 1`` then ``int x;`` is not
  ``#define A 1 int x;``), a function-like macro's name is marked (``#define F(x)`` is not
  ``#define F (x)``), and ``#include <...>`` keeps its header name whole;
- a backslash-newline splices lines first, as the compiler does.

This is a tokenizer, not a compiler: where it errs it errs towards a different hash (``A<B<C>>``
and ``A<B<C> >`` differ), never towards the same hash for code that means something else (short of
whitespace inside a macro that is stringized). It imports only the standard library.

``digest(files, lines=True)`` also hashes each token's line: what ``-lineinfo`` records in a build
and what the compiler facts show (hopattn.records.compiler_facts), so a comment that moves lines
changes that hash and not the other.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from functools import lru_cache
from pathlib import Path
from typing import Iterable

# Longest first: the tokenizer takes the longest punctuator that matches (maximal munch).
_PUNCTUATORS = sorted("""
    %:%: ... <<= >>= <=> ->* :: .* -> ++ -- << >> <= >= == != && || *= /= %= += -= &= ^= |= ## <: :>
    <% %> %:
""".split(), key=len, reverse=True)
_IDENT_RE = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
# A pp-number: a digit (or a dot and a digit), then digits, letters, dots, exponent signs and C++14
# digit separators (a ' followed by a digit or letter).
_NUMBER_RE = re.compile(r"\.?[0-9](?:[eEpP][+-]|'[0-9A-Za-z_]|[0-9A-Za-z_.])*")
_PREFIX_RE = re.compile(r"(?:u8|u|U|L)?R?(?=[\"'])")
_RAW_OPEN_RE = re.compile(r'"([^ ()\\\t\v\f\n]{0,16})\(')
_WHITESPACE = " \t\n\r\f\v"
_SPACE_RE = re.compile(r"[ \t\r\f\v]+")

EOL = "<eol>"  # the end of a preprocessor directive
FUNCTION_MACRO = "<(>"  # a '(' right after a #define's name: a function-like macro


def _splice(text: str) -> tuple[str, list[int], list[int]]:
    """The text with its backslash-newlines removed, and a map back to lines: (spliced text,
    offsets in it where a new original line starts, those lines' numbers)."""
    text = text.replace("\r\n", "\n")
    out, starts, numbers, pos = [], [], [], 0
    for number, line in enumerate(text.split("\n"), start=1):
        starts.append(pos)
        numbers.append(number)
        if line.endswith("\\"):
            line = line[:-1]
        else:
            line += "\n"
        out.append(line)
        pos += len(line)
    return "".join(out), starts, numbers


@lru_cache(maxsize=512)
def tokens(text: str) -> tuple[tuple[int, str], ...]:
    """(line, token) for every token of ``text``: comments and whitespace left out, directive ends
    as EOL. Never fails: what does not tokenize (an unterminated comment or literal, which the
    compiler rejects anyway) is kept whole as one token, so it still counts."""
    src, starts, numbers = _splice(text)

    def line_of(i: int) -> int:
        return numbers[bisect.bisect_right(starts, i) - 1]

    out: list[tuple[int, str]] = []
    n, i = len(src), 0
    line_start = True  # no token yet on this line: a '#' here begins a directive
    directive: list[str] | None = None  # the tokens of the directive being read

    def emit(start: int, tok: str) -> None:
        nonlocal line_start
        out.append((line_of(start), tok))
        line_start = False
        if directive is not None:
            directive.append(tok)

    while i < n:
        c = src[i]
        if c == "\n":
            if directive is not None:
                out.append((line_of(i), EOL))
                directive = None
            line_start = True
            i += 1
        elif c in _WHITESPACE:
            i = _SPACE_RE.match(src, i).end()
        elif src.startswith("//", i):
            end = src.find("\n", i)
            i = n if end < 0 else end
        elif src.startswith("/*", i):
            end = src.find("*/", i + 2)
            if end < 0:  # unterminated: the rest is kept as a token
                emit(i, src[i:])
                i = n
            else:
                i = end + 2
        elif c == "#" and line_start and directive is None:
            directive = []
            emit(i, "#")
            i += 1
        elif directive is not None and directive[1:] == ["include"] and c == "<":
            end, eol = src.find(">", i), src.find("\n", i)
            if end < 0 or 0 <= eol < end:  # unterminated: up to the end of the line
                end = n if eol < 0 else eol
            else:
                end += 1
            emit(i, src[i:end])
            i = end
        elif (m := _PREFIX_RE.match(src, i)) and (c in "\"'" or m.end() > i):
            i = _literal(src, i, m.end(), emit)
        elif m := _NUMBER_RE.match(src, i):
            emit(i, m.group())
            i = m.end()
        elif m := _IDENT_RE.match(src, i):
            emit(i, m.group())
            i = m.end()
            if directive is not None and directive[1:] == ["define", m.group()] and src.startswith("(", i):
                emit(i, FUNCTION_MACRO)
        else:
            tok = next((p for p in _PUNCTUATORS if src.startswith(p, i)), c)
            emit(i, tok)
            i += len(tok)
    if directive is not None:
        out.append((line_of(n - 1 if n else 0), EOL))
    return tuple(out)


def _literal(src: str, start: int, quote: int, emit) -> int:
    """Emit the string or character literal beginning at ``start`` (its prefix) whose quote is at
    ``quote``; return where it ends. An unterminated one ends at the end of its line (a raw string:
    of the text)."""
    m = _RAW_OPEN_RE.match(src, quote) if src[start:quote].endswith("R") else None
    if m:
        close = f"){m.group(1)}\""
        end = src.find(close, m.end())
        end = len(src) if end < 0 else end + len(close)
    else:
        q, j, n = src[quote], quote + 1, len(src)
        while j < n and src[j] != "\n" and src[j] != q:
            j += 2 if src[j] == "\\" and j + 1 < n and src[j + 1] != "\n" else 1
        end = j + 1 if j < n and src[j] == q else j
    emit(start, src[start:end])
    return end


@lru_cache(maxsize=512)
def _stream(text: str, lines: bool) -> bytes:
    """The hashed form of one text's tokens: each length-prefixed (after its line, when ``lines``)."""
    toks = tokens(text)
    parts = [f"{len(toks)}\0"]
    for line, tok in toks:
        parts.append(f"{line} {len(tok)}:{tok}\0" if lines else f"{len(tok)}:{tok}\0")
    return "".join(parts).encode("utf-8", "surrogateescape")


def digest(files: Iterable[tuple[str, str]], lines: bool = False) -> str:
    """16 hex digits of sha256 over (name, text) pairs: each name, then the text's tokens (each
    with its line, when ``lines``), length-prefixed so that no two streams run together."""
    h = hashlib.sha256()
    for name, text in files:
        h.update(f"{len(name)}:{name}\0".encode("utf-8", "surrogateescape"))
        h.update(_stream(text, lines))
    return h.hexdigest()[:16]


def read(path: Path) -> str:
    """A source file as text (bytes that are not UTF-8 kept as escapes: they still count)."""
    return Path(path).read_bytes().decode("utf-8", "surrogateescape")
