"""The kernel's code by role (stage 23 on): which role calls which function, in order, and the
state each takes, read out of the stage's kernel.cu (code_parse.py), against the one function
with capturing lambdas the stages before it were (counted in the last such stage's kernel.cu).

A box per role: the setup every thread runs, the producer (Producer::run), the tile scheduler both
roles call, the consumers' loop over output tiles, the mainloop's mma side, the epilogue and the
softmax; in each, the functions it runs in call order (the ones they call indented), with their
parameters: a struct of the kernel by its type, ``Type&`` in the accent colour where the function
changes it (a non-const reference: the state that goes in and comes back out), a scalar or a
register array by its name. The arrows between the boxes carry the state one role hands the
other. Every name in the picture is one the parse found; a kernel.cu without that structure raises
code_parse.StructureError.
"""

from __future__ import annotations

from .code_parse import Call, Function, KernelStructure, StructureError, lambdas, parse
from .diagram import Diagram
from .svg import MONO_EM, Canvas, content_bottom, text_width, wrap

FIRST = 23  # the stage whose kernel.cu is organised by role; every later forward stage is drawn too
W = 860
X0, X1 = 12, 848
FN = 12  # the font of the function lines (mono)
LINE = 17
PAD = 10
KIND = "structure"


def applies(stage) -> bool:
    """Whether the stage's page has the figure: forward stages from FIRST on."""
    return not getattr(stage, "backward", False) and stage.number >= FIRST


def _mono_w(s: str, size: float = FN) -> float:
    return len(s) * size * MONO_EM


def _param_parts(fn: Function) -> list[tuple[str, str]]:
    """(text, colour) of each parameter: a struct by its type, '&' and the accent colour where changed."""
    out = []
    for p in fn.params:
        if p.struct:
            out.append((p.struct + ("&" if p.mutable else ""), "accent" if p.mutable else "fg"))
        else:
            out.append((p.name + ("&" if p.mutable else ""), "accent" if p.mutable else "muted"))
    return out


def _segments(head: str, fn: Function, tail: str = "") -> list[tuple[str, str]]:
    parts = [(head + "(", "fg")]
    for i, (t, col) in enumerate(_param_parts(fn)):
        parts.append((t, col))
        if i + 1 < len(fn.params):
            parts.append((", ", "fg"))
    parts.append((")" + tail, "fg"))
    return parts


def _lines(segments: list[tuple[str, str]], width: float, indent: str = "    ") -> list[list[tuple[str, str]]]:
    """The segments broken after a ', ' into lines no wider than ``width`` (mono)."""
    lines, cur, used = [], [], 0.0
    for t, col in segments:
        w = _mono_w(t)
        if cur and used + w > width and t != ", ":
            lines.append(cur)
            cur, used = [(indent, "fg")], _mono_w(indent)
        cur.append((t, col))
        used += w
    if cur:
        lines.append(cur)
    return lines


def _draw_segments(c: Canvas, x: float, y: float, segs, bold_first: bool = False):
    for i, (t, col) in enumerate(segs):
        if t.strip():
            c.text(x, y, t, size=FN, mono=True, fill=col, weight="600" if bold_first and i == 0 else None)
        x += _mono_w(t)


class _Box:
    def __init__(self, title: str, sub: str, x: float, w: float, fill: str, new: set[str] = frozenset()):
        self.title, self.sub, self.x, self.w, self.fill = title, sub, x, w, fill
        self.rows: list[tuple[float, list, bool, bool]] = []  # (indent px, segments, first line, new)
        self.notes: list[str] = []
        self.new = new  # function keys the previous stage's kernel does not have

    def add(self, level: int, head: str, fn: Function, tail: str = ""):
        inner = self.w - 2 * PAD - 16 * level - 40
        for i, ln in enumerate(_lines(_segments(head, fn, tail), inner)):
            self.rows.append((16 * level, ln, i == 0, fn.key in self.new))

    def note(self, text: str):
        self.notes += wrap(text, self.w - 2 * PAD, 12)

    @property
    def height(self) -> float:
        return 30 + len(self.rows) * LINE + (len(self.notes) * 16 + 2 if self.notes else 0) + 4

    def draw(self, c: Canvas, y: float):
        c.rect(self.x, y, self.w, self.height, fill=self.fill, stroke=self.fill, opacity=0.12, rx=6)
        c.rect(self.x, y, self.w, self.height, fill="none", stroke=self.fill, rx=6, sw=1.5)
        c.text(self.x + PAD, y + 19, self.title, size=13, weight="600")
        if self.sub:
            c.text(self.x + PAD + text_width(self.title, 13, bold=True) + 10, y + 19, self.sub, size=12, mono=True,
                   fill="muted")
        yy = y + 30 + 12
        for indent, segs, first, new in self.rows:
            if new:
                w = sum(_mono_w(t) for t, _col in segs)
                c.rect(self.x + PAD + indent - 3, yy - 12, w + 6, 16, fill="hl", rx=2)
                if first:
                    c.text(self.x + PAD + indent + w + 8, yy, "new", size=12, weight="600", fill="hlfg")
            _draw_segments(c, self.x + PAD + indent, yy, segs, bold_first=first and indent == 0)
            yy += LINE
        yy += 2
        for line in self.notes:
            c.text(self.x + PAD, yy, line, size=12, fill="muted")
            yy += 16


def _head(call: Call) -> str:
    return f"{call.via}.{call.function.name}" if call.via else call.function.name


def _tail(fn: Function) -> str:
    r = fn.returns.replace("static", "").replace("inline", "").strip()
    return f" → {r}" if r and r not in ("void",) and not r.startswith("template") else ""


def _state_note(ks: KernelStructure, struct: str, name: str | None = None) -> str:
    members = [n for _t, n in ks.structs[struct].members]
    if not members:
        raise StructureError(f"{ks.path}: struct {struct} has no data members")
    return f"state: {struct}{' ' + name if name else ''} = {', '.join(members)}"


def _owned_state(ks: KernelStructure, fns: list[Function]) -> list[str]:
    """Structs of plain state (no methods) the functions change (non-const references), in order."""
    out = []
    for fn in fns:
        for p in fn.params:
            if p.struct and p.mutable and not ks.structs[p.struct].methods and p.struct not in out:
                out.append(p.struct)
    return out


def _handed(fns: list[Function]) -> str:
    """The state a call hands over: the struct parameters of ``fns`` (changed ones with '&'), and the
    register arrays they change, in order, each once."""
    seen, parts = set(), []
    for fn in fns:
        for p in fn.params:
            label = (p.struct or p.name) + ("&" if p.mutable else "")
            if (p.struct or (p.array and p.mutable)) and label not in seen:
                seen.add(label)
                parts.append(label)
    return " · ".join(parts)


def _of(ks: KernelStructure, calls: list[Call], owner: str) -> list[Call]:
    return [c for c in calls if c.function.owner == owner]


def structure_facts(ks: KernelStructure) -> dict:
    """What the figure draws, as plain data (the picture's signature, and what the tests read)."""
    prod_roots = [c.function for c in ks.producer if c.function.owner]
    run = prod_roots[0]
    mma_calls = [c for c in ks.consumer if c.function.owner and ks.structs[c.function.owner].methods]
    return {
        "entry": (ks.entry.name, ks.entry.lines),
        "setup": [c.function.name for c in ks.setup],
        "producer": [(lvl, c.function.key) for lvl, c in ks.tree(ks.calls(run))],
        "consumer": [c.function.key for c in ks.consumer],
        "mainloop": {c.function.key: [(lvl, x.function.key) for lvl, x in ks.tree(ks.calls(c.function), 3)]
                     for c in mma_calls},
        "structs": {s.name: ([n for _t, n in s.members], s.methods) for s in ks.structs.values()},
    }


def structure_diagram(stage, stages) -> Diagram:
    """The kernel's code by role, from the stage's kernel.cu."""
    ks = parse(stage.kernel_path)
    before = [s for s in stages if s.number < FIRST and not getattr(s, "backward", False)]
    if not before:
        raise StructureError(f"no stage before {FIRST} to compare {stage.kernel_path} with")
    old_stage = max(before, key=lambda s: s.number)
    old = lambdas(old_stage.kernel_path)
    if not old.names:
        raise StructureError(f"{old_stage.kernel_path}: its __global__ {old.kernel} has no [&] lambdas to count")

    # The roles' own entry points.
    prod_methods = [c for c in ks.producer if c.function.owner]
    run = prod_methods[0].function  # Producer::run
    run_tree = ks.tree(ks.calls(run))
    sched_calls_p = [c for _l, c in run_tree if c.function.owner not in (None, run.owner)]
    schedulers = {c.function.owner for c in sched_calls_p} & {c.function.owner for c in ks.consumer if c.function.owner}
    if len(schedulers) != 1:
        raise StructureError(f"{ks.path}: no one struct (the tile scheduler) whose methods both the producer "
                             f"({run.key}) and the consumers call (found {sorted(schedulers) or 'none'})")
    sched = schedulers.pop()
    cons_methods = [c for c in ks.consumer if c.function.owner and c.function.owner != sched]
    owners = []
    for c in cons_methods:
        if c.function.owner not in owners:
            owners.append(c.function.owner)
    if len(owners) < 2:
        raise StructureError(f"{ks.path}: the consumers' loop calls the methods of {owners or 'no struct'}; "
                             "expected a mainloop and an epilogue")
    main_owner, epi_owner = owners[0], owners[1]
    main_roots = [c for c in cons_methods if c.function.owner == main_owner]
    main_tree = []
    seen = set()
    for c in main_roots:
        for lvl, x in ks.tree(ks.calls(c.function), 3):
            if x.function.owner == main_owner and x.function.key not in seen:
                seen.add(x.function.key)
                main_tree.append((lvl, x))
    soft_calls = []
    for fn in [c.function for c in main_roots] + [x.function for _l, x in main_tree]:
        for x in ks.calls(fn):
            if x.function.owner not in (None, main_owner) and x.function.key not in {y.function.key for y in soft_calls}:
                soft_calls.append(x)
    soft_owners = []
    for x in soft_calls:
        if x.function.owner not in soft_owners:
            soft_owners.append(x.function.owner)
    if not soft_owners:
        raise StructureError(f"{ks.path}: {main_owner}'s functions call no other struct's methods (the softmax)")
    soft_owner = soft_owners[0]

    prev = [s for s in stages if s.number == stage.number - 1 and applies(s)]
    new = set()
    if prev:
        before_keys = set(parse(prev[0].kernel_path).functions)
        new = {k for k in ks.functions if k not in before_keys}
    inner_w = X1 - X0
    setup_objects = [f"{t} {n}" for n, t in ks.objects.items() if t == sched]
    setup = _Box("Setup, every thread", f"{ks.entry.name}: {ks.entry.lines} lines", X0, inner_w, "stroke", new=new)
    for c in ks.setup:
        setup.add(0, _head(c), c.function, _tail(c.function))
    setup.note(f"then {' and '.join(setup_objects)}; warpgroup 0 takes the producer's branch, the others the "
               "consumers' (setmaxnreg_dec, setmaxnreg_inc)")

    prod = _Box(f"Producer: {prod_methods[0].via}.{run.name}", f"{run.owner}, one thread of warp 0", X0, inner_w,
                "producer", new=new)
    for lvl, c in run_tree:
        prod.add(lvl, _head(c), c.function, _tail(c.function))
    for st in _owned_state(ks, [run] + [c.function for _l, c in run_tree]):
        prod.note(_state_note(ks, st, _local_name(run, st)))

    sch = _Box("Tile scheduler", sched, X0, inner_w, "accent", new=new)
    p_keys = {c.function.key for c in sched_calls_p}
    c_keys = {c.function.key for c in ks.consumer if c.function.owner == sched}
    for name in ks.structs[sched].methods:
        fn = ks.functions[f"{sched}::{name}"]
        who = " and ".join(r for r, keys in (("producer", p_keys), ("consumers", c_keys)) if fn.key in keys)
        sch.add(0, name, fn, _tail(fn) + (f"   ({who})" if who else ""))

    cons = _Box("Consumer warpgroups: the loop over output tiles", f"{ks.entry.name}", X0, inner_w, "consumer", new=new)
    for c in ks.consumer:
        cons.add(0, _head(c), c.function, _tail(c.function))

    half = (inner_w - 20) * 0.64
    main = _Box("Mainloop, mma side", main_owner, X0, half, "tensor", new=new)
    for c in main_roots:
        main.add(0, _head(c), c.function)
    for lvl, x in main_tree:
        main.add(lvl + 1, x.function.name, x.function)
    for st in _owned_state(ks, [c.function for c in main_roots] + [x.function for _l, x in main_tree]):
        main.note(_state_note(ks, st))

    epi_x = X0 + half + 20
    epi = _Box("Epilogue", epi_owner, epi_x, X1 - epi_x, "epilogue", new=new)
    for lvl, c in ks.tree([c for c in cons_methods if c.function.owner == epi_owner]):
        epi.add(lvl, c.function.name, c.function)

    soft = _Box("Softmax", soft_owner, X0, half, "softmax", new=new)
    for name in ks.structs[soft_owner].methods:
        fn = ks.functions[f"{soft_owner}::{name}"]
        soft.add(0, name, fn, _tail(fn))
    soft.note(_state_note(ks, soft_owner) + " (its members: the rows' running state)")

    # Vertical layout: the boxes, the arrows' labels in the gaps between them.
    n_fns = len(ks.functions)
    n_structs = sum(1 for s in ks.structs.values() if s.methods)
    did = f"s{stage.id}-structure"
    title = f"Stage {stage.id}'s kernel by role: who calls what, with which state"
    desc = (f"Read out of kernel.cu: {ks.entry.name} is {ks.entry.lines} lines, the setup, the producer's call of "
            f"{run.key} and the consumers' loop over output tiles, which calls {', '.join(c.function.key for c in ks.consumer)}. "
            f"{n_fns} functions, {n_structs} structs with methods. Stage {old_stage.id}'s kernel was one __global__ "
            f"{old.kernel} of {old.lines} lines with {len(old.names)} lambdas capturing by reference.")
    c = Canvas(did, W, 2000, title, desc)
    c.heading(title)
    c.text(X0, 42, f"kernels/attention/{stage.kernel_path.parent.name}/kernel.cu, parsed: each function in the order its role calls it; "
                   "the ones it calls indented", size=12, fill="muted")
    y = 54
    gap_label = 12

    def arrow_down(x, y0, y1, label, anchor_left=True):
        c.line(x, y0, x, y1 - 1, stroke="stroke", sw=1.5, arrow=True)
        if label:
            c.text(x + 8, (y0 + y1) / 2 + 4, label, size=gap_label, fill="fg")

    def arrow_up(x, y0, y1, label):
        c.line(x, y0, x, y1 + 1, stroke="stroke", sw=1.5, arrow=True)
        if label:
            c.text(x + 8, (y0 + y1) / 2 + 4, label, size=gap_label, fill="fg")

    setup.draw(c, y)
    y += setup.height
    gap = 30
    arrow_down(60, y, y + gap, "warpgroup 0")
    y += gap
    prod.draw(c, y)
    y += prod.height
    p_label = "calls " + ", ".join(f"{c2.function.name}()" for c2 in sched_calls_p) + ": the tile ids it loads"
    arrow_down(60, y, y + gap, p_label)
    y += gap
    sch.draw(c, y)
    y_sched_bottom = y + sch.height
    y = y_sched_bottom + gap
    c_label = "calls " + ", ".join(f"{c2.function.name}()" for c2 in ks.consumer if c2.function.owner == sched) + \
              ": the next tile id, -1 at the end"
    arrow_up(60, y, y_sched_bottom, c_label)
    cons.draw(c, y)
    c.text(X1 - PAD, y + 19, "warpgroups 1 and up", size=12, fill="muted", anchor="end")
    y += cons.height
    main_label = _handed([c2.function for c2 in main_roots])
    epi_label = _handed([c2.function for c2 in cons_methods if c2.function.owner == epi_owner])
    main_lines = wrap(main_label, half - 40, gap_label)
    epi_lines = wrap(epi_label, X1 - epi_x - 30, gap_label)
    g2 = 14 + 15 * max(len(main_lines), len(epi_lines))
    c.line(X0 + 48, y, X0 + 48, y + g2 - 1, stroke="stroke", sw=1.5, arrow=True)
    c.lines(X0 + 56, y + 16, main_lines, size=gap_label, leading=1.25)
    c.line(epi_x + 24, y, epi_x + 24, y + g2 - 1, stroke="stroke", sw=1.5, arrow=True)
    c.lines(epi_x + 32, y + 16, epi_lines, size=gap_label, leading=1.25)
    y += g2
    main.draw(c, y)
    epi.draw(c, y)
    epi_bottom = y + epi.height
    y += main.height
    handed = [p.struct + ("&" if p.mutable else "") for c2 in main_roots for p in c2.function.params
              if p.struct == soft_owner][:1]
    if not handed:
        raise StructureError(f"{ks.path}: {main_owner}'s entry takes no {soft_owner}: the softmax's state")
    soft_label = (f"{handed[0]}: calls "
                  + ", ".join(f"{x.function.name}()" for x in soft_calls if x.function.owner == soft_owner))
    soft_lines = wrap(soft_label, half - 40, gap_label)
    g3 = 14 + 15 * len(soft_lines)
    c.line(X0 + 48, y, X0 + 48, y + g3 - 1, stroke="stroke", sw=1.5, arrow=True)
    c.lines(X0 + 56, y + 16, soft_lines, size=gap_label, leading=1.25)
    y += g3
    soft.draw(c, y)
    y = max(y + soft.height, epi_bottom) + 16

    # The legend and the stage before.
    x = X0
    for text, col in (("Type&", "accent"), (": state the function changes (a non-const reference) · ", "muted"),
                      ("Type", "fg"), (": a struct it reads · ", "muted"), ("name", "muted"),
                      (": a scalar or register array", "muted")):
        if col == "muted" and text.startswith(":"):
            c.text(x, y + 4, text, size=12, fill="muted")
            x += text_width(text, 12)
        else:
            c.text(x, y + 4, text, size=FN, mono=True, fill=col)
            x += _mono_w(text)
    if new:
        y += 20
        c.rect(X0 - 3, y - 8, 40, 16, fill="hl", rx=2)
        c.text(X0, y + 4, "new", size=12, weight="600", fill="hlfg")
        c.text(X0 + 44, y + 4, f"not in stage {prev[0].id}'s kernel.cu: " + ", ".join(sorted(new)), size=12,
               fill="muted")
    y += 18
    was = (f"Stage {old_stage.id} ({old_stage.kernel_path.parent.name}/kernel.cu): one __global__ {old.kernel} of {old.lines} lines; "
           f"the producer and the consumers two branches of it, their pieces {len(old.names)} lambdas capturing "
           f"everything by reference ([&]): {', '.join(old.names)}. What each reads and writes is in none of "
           "their signatures.")
    y0 = y
    rows = wrap(was, inner_w - 2 * PAD, 12)
    c.rect(X0, y0, inner_w, 12 + 16 * len(rows), fill="panel", stroke="stroke", rx=6, dash="4 3")
    c.lines(X0 + PAD, y0 + 18, rows, size=12, leading=16 / 12)
    svg = c.tostring()
    c.height = int(content_bottom(svg) + 14.999)
    svg = c.tostring()
    caption = (f"The code of stage {stage.id}'s kernel by role, read out of its kernel.cu: the setup, the producer "
               f"({run.key}), the tile scheduler ({sched}) both roles call, the consumers' loop with its "
               f"mainloop ({main_owner}), epilogue ({epi_owner}) and softmax ({soft_owner}). Each function's "
               "parameters are its state: what it changes is marked `&`. Stage "
               f"{old_stage.id}'s kernel was one function of {old.lines} lines with {len(old.names)} lambdas "
               "that captured it all.")
    facts = structure_facts(ks)
    signature = repr(sorted((k, repr(v)) for k, v in facts.items() if k != "entry"))
    return Diagram(did, title, KIND, stage.number, svg, caption, c.width, c.height, signature=signature)


def _local_name(fn: Function, struct: str) -> str | None:
    import re

    m = re.search(rf"\b{struct}\s+(\w+)\s*[;{{=]", fn.body)
    return m.group(1) if m else None
