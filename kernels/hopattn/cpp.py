"""Integer constants read out of C++ source: the ``constexpr`` integers of a kernel and the
arguments of a call, evaluated as the compiler would (integer arithmetic over earlier constants,
``sizeof`` of the scalar types, literal suffixes, ``static_cast``).

The stage specs are checked against these numbers (hopattn.lineage) and the compiler facts take
the dynamic shared memory of a launch from them (hopattn.compiler); both read them here.
"""

from __future__ import annotations

import ast
import operator
import re

_CONSTEXPR_RE = re.compile(
    r"\b(?:static\s+)?constexpr\s+(?:static\s+)?(?:int|unsigned|uint32_t|int64_t|uint64_t|size_t|auto|long)\s+"
    r"([A-Za-z_]\w*)\s*=\s*([^;{}]+);")
_SIZEOF = {"bf16": 2, "__nv_bfloat16": 2, "half": 2, "__half": 2, "float": 4, "int": 4,
           "uint32_t": 4, "uint64_t": 8, "int64_t": 8, "double": 8}
_COMMENT_RE = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_SIZEOF_RE = re.compile(r"sizeof\s*\(\s*([A-Za-z_]\w*)\s*\)")
_SUFFIX_RE = re.compile(r"\b(\d+)(?:[uU][lL]{0,2}|[lL]{1,2}[uU]?)\b")
_CAST_RE = re.compile(r"static_cast\s*<\s*\w+\s*>")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.LShift: operator.lshift,
        ast.RShift: operator.rshift, ast.BitOr: operator.or_, ast.BitAnd: operator.and_}


def evaluate(expr: str, env: dict[str, int]) -> int | None:
    """An integer C expression over known constants, or None when it is anything else. It may span
    lines (a constexpr broken after an operator), its comments left out."""
    expr = " ".join(_COMMENT_RE.sub(" ", expr).split())
    text = _SIZEOF_RE.sub(lambda m: str(_SIZEOF.get(m.group(1), "?")), expr)
    text = _CAST_RE.sub("", _SUFFIX_RE.sub(r"\1", text))
    # C integer division truncates; all of these are non-negative, where floor division agrees.
    text = re.sub(r"(?<![/])/(?![/])", "//", text)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return None

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return env.get(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            v = walk(node.operand)
            return None if v is None else -v
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = walk(node.left), walk(node.right)
            if a is None or b is None or (isinstance(node.op, (ast.FloorDiv, ast.Mod)) and b == 0):
                return None
            return _OPS[type(node.op)](a, b)
        return None

    return walk(tree)


def constants(source: str, seed: dict[str, int] | None = None) -> dict[str, int]:
    """Every ``constexpr`` integer of the file that evaluates, in order of definition (the first
    definition of a name wins). ``seed``: names known beforehand, which win over the file's (the
    numbers of one specialisation of a template, see specializations)."""
    env: dict[str, int] = dict(seed or {})
    for name, expr in _CONSTEXPR_RE.findall(source):
        value = evaluate(expr, env)
        if value is not None:
            env.setdefault(name, value)
    return env


_SPECIALIZATION_RE = re.compile(r"\btemplate\s*<\s*>\s*struct\s+(\w+)\s*<([^<>{};]*)>\s*\{")


def specializations(source: str, template: str) -> dict[str, dict[str, int]]:
    """The ``constexpr`` integers of each full specialisation ``template <> struct template<ARGS> {...}``
    of the file, keyed by its argument text ('128'): a kernel templated on a tile states there the
    numbers of each (stage 24's HeadDimTile<HEAD_DIM>)."""
    out: dict[str, dict[str, int]] = {}
    for m in _SPECIALIZATION_RE.finditer(source):
        if m.group(1) != template:
            continue
        depth, end = 1, m.end()
        while depth and end < len(source):
            depth += {"{": 1, "}": -1}.get(source[end], 0)
            end += 1
        out[" ".join(m.group(2).split())] = constants(source[m.end():end - 1])
    return out


def call_arguments(source: str, function: str) -> list[str] | None:
    """The top-level arguments of the first call of ``function`` (text), or None."""
    m = re.search(rf"\b{re.escape(function)}\s*\(", source)
    if not m:
        return None
    args, depth, start = [], 0, m.end()
    for i in range(m.end(), len(source)):
        c = source[i]
        if c in "(<[{":
            depth += 1
        elif c in ")>]}":
            if depth == 0:
                args.append(source[start:i].strip())
                return args
            depth -= 1
        elif c == "," and depth == 0:
            args.append(source[start:i].strip())
            start = i + 1
    return None
