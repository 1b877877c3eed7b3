"""The structure of a kernel.cu by role, read out of the source: its ``__global__`` function (or the
one function that function calls, stage 24's ``Attention<D>::kernel_main``), the producer's and
the consumers' branches of it, the functions each calls in order, the structs whose methods those
are, and the struct-typed state each function takes. Stage 23 and later organise the kernel so
(stage 23's notes.md, "What moved where"); stage 22 and before are one function with lambdas,
which ``lambdas`` counts.

No compiler: comments and string literals are blanked, then braces and parentheses are matched.
What the parse relies on is checked, and a source without it raises StructureError naming the
file and what is missing, so the figure never silently draws something else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path


class StructureError(ValueError):
    """kernel.cu no longer has the structure the role figure parses."""


_COMMENT_OR_STRING = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])\'', re.S)
_STRUCT_RE = re.compile(r"\bstruct\s+(\w+)\s*(?::\s*([^{;]+?))?\s*\{")
_DEVICE_FN_RE = re.compile(r"__device__\s+__forceinline__\s+([^;{}()]*?)\b(\w+)\s*\(")
_GLOBAL_RE = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*)?")
_CALL_RE = re.compile(r"(?<![\w.])(?:(\w+)\s*\.\s*)?(?:template\s+)?(\w+)\s*(?:<[^<>;(){}]*>)?\s*\(")
_IDENT_RE = re.compile(r"[A-Za-z_]\w*")
_NOT_CALLS = {"if", "for", "while", "switch", "return", "sizeof", "static_assert", "min", "max"}


def blank(text: str) -> str:
    """The source with comments and string literals turned into spaces (newlines kept: line numbers
    stay), and preprocessor lines blanked (both branches of an #ifdef stay)."""
    out = _COMMENT_OR_STRING.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    return re.sub(r"(?m)^[ \t]*#[^\n]*", lambda m: " " * len(m.group(0)), out)


def _match(text: str, start: int, open_ch: str, close_ch: str) -> int:
    """The index just past the bracket that closes the one at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
    raise StructureError(f"unbalanced {open_ch}{close_ch} from offset {start}")


def _split_top(text: str, sep: str = ",") -> list[str]:
    out, depth, cur = [], 0, ""
    for c in text:
        if c in "(<[{":
            depth += 1
        elif c in ")>]}":
            depth -= 1
        if c == sep and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += c
    if cur.strip():
        out.append(cur.strip())
    return out


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # the declared type, spaces normalised ("const OutTile&", "float (&)[S_REGS]")
    struct: str | None  # the kernel's own struct it is, if any ("OutTile")
    mutable: bool  # a non-const reference: state that goes in and comes back out

    @property
    def array(self) -> bool:
        return "[" in self.type


@dataclass
class Function:
    name: str
    owner: str | None  # the struct it is a member of (None: a free function)
    returns: str
    params: list[Param]
    body: str
    line: int  # of the definition
    lines: int  # its length in lines, signature to closing brace

    @property
    def key(self) -> str:
        return f"{self.owner}::{self.name}" if self.owner else self.name


@dataclass(frozen=True)
class Call:
    function: Function
    via: str | None  # the object it is called on ("sched"), None for a free function or this


@dataclass
class Struct:
    name: str
    span: tuple[int, int]
    members: list[tuple[str, str]] = field(default_factory=list)  # (type, name) of its data members
    methods: list[str] = field(default_factory=list)  # in declaration order


def _param(text: str, structs: set[str]) -> Param | None:
    text = " ".join(text.split("=")[0].split())
    if not text or text == "void":
        return None
    m = re.match(r"(.*?)\(\s*&\s*(\w+)\s*\)\s*(\[.*\])$", text)  # float (&s)[S_REGS]
    if m:
        typ, name = f"{m.group(1).strip()} (&){m.group(3)}", m.group(2)
    else:
        m = re.match(r"(.*?[\s&*>])(\w+)$", text)
        if not m:
            return None
        typ, name = m.group(1).strip(), m.group(2)
    words = set(_IDENT_RE.findall(typ))
    struct = next((w for w in _IDENT_RE.findall(typ) if w in structs), None)
    return Param(name, typ, struct, "&" in typ and "const" not in words)


@dataclass
class KernelStructure:
    path: Path
    entry: Function  # the function that holds the setup and the roles' branches
    kernel: Function  # the __global__ function
    structs: dict[str, Struct]
    functions: dict[str, Function]  # by key
    setup: list[Call]  # the kernel's calls before the producer's branch
    producer: list[Call]  # the producer branch's calls, in order
    consumer: list[Call]  # the consumers' part, in order
    objects: dict[str, str]  # the entry's objects (and parameters) of the kernel's own structs: name -> struct

    def calls(self, fn: Function) -> list[Call]:
        """The kernel's own functions that ``fn`` calls, in source order, each once."""
        return _calls(fn.body, fn, self)

    def tree(self, calls: list[Call], depth: int = 2) -> list[tuple[int, Call]]:
        """(level, call) of ``calls`` and, ``depth`` levels down, what each calls (methods of the same
        struct and free functions the kernel defines), each function once, in source order."""
        out, seen = [], set()

        def walk(cs, level):
            for c in cs:
                if c.function.key in seen:
                    continue
                seen.add(c.function.key)
                out.append((level, c))
                if level + 1 < depth:
                    walk([x for x in self.calls(c.function) if x.function.owner == c.function.owner
                          and c.function.owner is not None], level + 1)

        walk(calls, 0)
        return out


def _locals(body: str, structs: set[str]) -> dict[str, str]:
    """Objects of the kernel's structs declared in a body: name -> struct."""
    out = {}
    for m in re.finditer(r"\b(?:const\s+)?(\w+)\s*(?:<[^<>;{}()]*>)?\s+(\w+)\s*(?=[{;=(])", body):
        if m.group(1) in structs and m.group(2) not in out:
            out[m.group(2)] = m.group(1)
    return out


def _calls(body: str, fn: Function | None, ks: "KernelStructure | _Partial") -> list[Call]:
    scope = {p.name: p.struct for p in (fn.params if fn else []) if p.struct}
    if fn is not None and fn.owner:
        scope.update({n: t for t, n in ks.structs[fn.owner].members if t in ks.structs})
    scope.update(_locals(body, set(ks.structs)))
    scope.update({k: v for k, v in getattr(ks, "objects", {}).items() if k not in scope})
    out, seen = [], set()
    for m in _CALL_RE.finditer(body):
        obj, name = m.group(1), m.group(2)
        if name in _NOT_CALLS:
            continue
        target = None
        if obj is not None:
            owner = scope.get(obj)
            if owner is not None:
                target = ks.functions.get(f"{owner}::{name}")
        else:
            if fn is not None and fn.owner:
                target = ks.functions.get(f"{fn.owner}::{name}")
            target = target or ks.functions.get(name)
        if target is None or target is fn or target.key in seen:
            continue
        seen.add(target.key)
        out.append(Call(target, obj))
    return out


@dataclass
class _Partial:
    structs: dict[str, Struct]
    functions: dict[str, Function]
    objects: dict[str, str] = field(default_factory=dict)


def parse(path: Path) -> KernelStructure:
    """The role structure of a kernel.cu; StructureError when it has none."""
    path = Path(path)
    raw = path.read_text()
    text = blank(raw)
    line_of = lambda i: text.count("\n", 0, i) + 1  # noqa: E731

    structs: dict[str, Struct] = {}
    for m in _STRUCT_RE.finditer(text):
        end = _match(text, m.end() - 1, "{", "}")
        if m.group(1) == "TraceRefs":  # the tracing build's references: no role's state
            continue
        structs.setdefault(m.group(1), Struct(m.group(1), (m.start(), end)))

    def owner_at(i: int) -> str | None:
        inside = [s for s in structs.values() if s.span[0] < i < s.span[1]]
        return min(inside, key=lambda s: s.span[1] - s.span[0]).name if inside else None

    functions: dict[str, Function] = {}
    spans = []
    names = set(structs)
    for m in _DEVICE_FN_RE.finditer(text):
        close = _match(text, m.end() - 1, "(", ")")
        brace = re.match(r"\s*(?:const\s*)?\{", text[close:])
        if not brace:
            continue
        end = _match(text, close + brace.end() - 1, "{", "}")
        params = [p for p in (_param(x, names) for x in _split_top(text[m.end():close - 1])) if p]
        fn = Function(m.group(2), owner_at(m.start()), " ".join(m.group(1).split()), params,
                      text[close + brace.end():end - 1], line_of(m.start()), line_of(end) - line_of(m.start()) + 1)
        spans.append((m.start(), end, fn))
        functions.setdefault(fn.key, fn)

    kernel = None
    for m in _GLOBAL_RE.finditer(text):
        i = m.end()
        if text.startswith("(", i):  # __launch_bounds__(...)
            i = _match(text, i, "(", ")")
        nm = re.match(r"\s*(\w+)\s*\(", text[i:])
        if not nm:
            continue
        close = _match(text, i + nm.end() - 1, "(", ")")
        brace = re.match(r"\s*\{", text[close:])
        if not brace:
            continue  # a declaration
        end = _match(text, close + brace.end() - 1, "{", "}")
        params = [p for p in (_param(x, names) for x in _split_top(text[i + nm.end():close - 1])) if p]
        kernel = Function(nm.group(1), None, "void", params, text[close + brace.end():end - 1], line_of(m.start()),
                          line_of(end) - line_of(m.start()) + 1)
    if kernel is None:
        raise StructureError(f"{path}: no __global__ function with a body")

    # Structs that wrap the whole kernel (stage 24's Attention<D>): their functions are free ones.
    wrappers = {s.name for s in structs.values() if any(s.span[0] < a and b < s.span[1] and
                                                         (f.name == "kernel_main") for a, b, f in spans)}
    for key, fn in list(functions.items()):
        if fn.owner in wrappers:
            del functions[key]
            fn.owner = None
            functions.setdefault(fn.name, fn)
    for w in wrappers:
        del structs[w]
    for s in structs.values():  # data members and methods, at the struct's own depth
        inner = text[s.span[0]:s.span[1]]
        body = inner[inner.index("{") + 1:-1]
        depth, buf = 0, ""
        for c in body:
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    buf += ";"
                continue
            if depth == 0:
                buf += c
        for decl in buf.split(";"):
            decl = " ".join(decl.split())
            if not decl or "(" in decl or decl.startswith(("static", "using", "template", "friend", "public",
                                                              "private")):
                continue
            decl = re.sub(r"=[^,]*", "", decl)
            parts = _split_top(decl)
            m = re.match(r"((?:const\s+)?[\w:<>]+(?:\s*[*&])?)\s+(\w+)", parts[0])
            if not m:
                continue
            s.members.append((m.group(1), m.group(2)))
            for extra in parts[1:]:
                nm = re.match(r"[*&]?\s*(\w+)", extra)
                if nm:
                    s.members.append((m.group(1), nm.group(1)))
        s.methods = [f.name for f in functions.values() if f.owner == s.name]

    partial = _Partial(structs, functions)
    entry = kernel
    inner = _calls(kernel.body, kernel, partial)
    if "setmaxnreg_dec" not in kernel.body and len(inner) == 1 and inner[0].function.owner is None:
        entry = inner[0].function  # the __global__ is one call: Attention<D>::kernel_main
    body = entry.body
    dec = body.find("setmaxnreg_dec")
    inc = body.find("setmaxnreg_inc")
    if dec < 0 or inc < 0:
        raise StructureError(f"{path}: {entry.name} has no producer branch (setmaxnreg_dec) and consumers' part "
                             "(setmaxnreg_inc): not a warp-specialised kernel organised by role")
    branch = body.rfind("if", 0, dec)
    open_brace = body.find("{", branch)
    if branch < 0 or open_brace < 0 or open_brace > dec:
        raise StructureError(f"{path}: the producer's setmaxnreg_dec is not inside an if branch of {entry.name}")
    close = _match(body, open_brace, "{", "}")
    objects = {p.name: p.struct for p in entry.params if p.struct}
    objects.update(_locals(body, set(structs)))
    partial.objects = objects
    setup = _calls(body[:branch], entry, partial)
    producer = _calls(body[open_brace:close], entry, partial)
    consumer = _calls(body[close:], entry, partial)
    ks = KernelStructure(path, entry, kernel, structs, functions, setup, producer, consumer, objects)
    if not any(c.function.owner for c in producer):
        raise StructureError(f"{path}: the producer branch of {entry.name} calls no method of a struct")
    if not any(c.function.owner for c in consumer):
        raise StructureError(f"{path}: the consumers' part of {entry.name} calls no method of a struct")
    return ks


@dataclass(frozen=True)
class Lambdas:
    """A kernel of one function: its length and the lambdas that capture its state by reference."""

    kernel: str
    lines: int
    names: tuple[str, ...]


def lambdas(path: Path) -> Lambdas:
    """The __global__ function of ``path`` (the one with a body), its lines and its capturing lambdas."""
    text = blank(Path(path).read_text())
    found = None
    for m in _GLOBAL_RE.finditer(text):
        i = m.end()
        if text.startswith("(", i):
            i = _match(text, i, "(", ")")
        nm = re.match(r"\s*(\w+)\s*\(", text[i:])
        if not nm:
            continue
        close = _match(text, i + nm.end() - 1, "(", ")")
        brace = re.match(r"\s*\{", text[close:])
        if not brace:
            continue
        end = _match(text, close + brace.end() - 1, "{", "}")
        body = text[close + brace.end():end - 1]
        lines = text.count("\n", m.start(), end) + 1
        names = tuple(re.findall(r"\b(?:const\s+)?auto\s+(\w+)\s*=\s*\[&\]", body))
        found = Lambdas(nm.group(1), lines, names)
    if found is None:
        raise StructureError(f"{path}: no __global__ function with a body")
    return found
