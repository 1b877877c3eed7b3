"""Reads SASS as ``cuobjdump -sass`` prints it: instructions per function for one architecture,
an opcode histogram grouped by what the instructions are for, and the main (KV) loop.

A stage library built for sm_80 also embeds sm_80 code; only the sm_90a part is what Hopper runs,
so parsing keeps the ELF sections of the requested architecture and ignores the rest.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .. import cuda_tools
from ..records.compiler_facts import GROUP_ORDER, group_of

_ARCH_RE = re.compile(r"^\s*arch = (\S+)")
_FUNCTION_RE = re.compile(r"^\s*Function : (\S+)")
# "/*0290*/   @!P0 BRA 0x5c80 ;   /* 0x0000... */": address, then the instruction up to its ';'.
_INSTR_RE = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+([^;]*?)\s*;")
_HEX_TARGET_RE = re.compile(r"^0x([0-9a-f]+)$")

SOURCE_COLUMN = 72  # where the "// kernel.cu:76" source comment of a listing line starts
LISTING_MAX = 180  # a loop up to this long is shown whole; a longer one as windows around landmarks
# (first instruction index relative to the landmark, last): the loop's top, its first tensor-core
# instructions, its first exponentials, and the back edge.
WINDOW_TOP = (0, 30)
WINDOW_TENSOR = (-10, 50)
WINDOW_MUFU = (-10, 30)
WINDOW_END = (-25, 0)


@dataclass(frozen=True)
class Instr:
    addr: int
    pred: str  # "" or "@P0", "@!UP1", ...
    opcode: str  # with modifiers: "HMMA.16816.F32.BF16"
    operands: str

    @property
    def key(self) -> str:
        return opcode_key(self.opcode)

    def text(self, where: str = "") -> str:
        line = f"/*{self.addr:04x}*/ {self.pred:>6} {self.opcode} {self.operands}".rstrip()
        return f"{line:<{SOURCE_COLUMN}} // {where}" if where else line


def opcode_key(opcode: str) -> str:
    parts = opcode.split(".")
    if parts[0] == "MUFU" and len(parts) > 1:
        return f"MUFU.{parts[1]}"
    return parts[0]


def parse_instruction(text: str, addr: int) -> Instr:
    tokens = text.split(None, 1)
    pred = ""
    if tokens and tokens[0].startswith("@"):
        pred = tokens[0]
        tokens = tokens[1].split(None, 1) if len(tokens) > 1 else []
    opcode = tokens[0] if tokens else ""
    operands = tokens[1].strip() if len(tokens) > 1 else ""
    return Instr(addr, pred, opcode, operands)


def dump_sass(library: Path, arch: str = "sm_90a") -> str:
    """``cuobjdump -sass`` of one architecture's code in a library (other archs are not disassembled)."""
    proc = subprocess.run([cuda_tools.require("cuobjdump"), "-sass", "-arch", arch, str(library)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise cuda_tools.ToolError(f"cuobjdump failed on {library}: {proc.stderr.strip()}")
    return proc.stdout


def parse_sass(dump: str, arch: str = "sm_90a") -> dict[str, list[Instr]]:
    """{mangled function name: instructions} of the ELF sections built for ``arch``."""
    functions: dict[str, list[Instr]] = {}
    current_arch: str | None = None
    current: list[Instr] | None = None
    for line in dump.splitlines():
        if line.startswith("Fatbin"):
            current_arch, current = None, None
        elif m := _ARCH_RE.match(line):
            current_arch, current = m.group(1), None
        elif m := _FUNCTION_RE.match(line):
            current = functions.setdefault(m.group(1), []) if current_arch == arch else None
        elif current is not None and (m := _INSTR_RE.match(line)):
            current.append(parse_instruction(m.group(2), int(m.group(1), 16)))
    return functions


def histogram(instrs: list[Instr]) -> dict[str, int]:
    """Opcode key -> count; NOP padding after the last EXIT is not code and is left out."""
    counts: dict[str, int] = {}
    for ins in instrs:
        if ins.opcode == "NOP":
            continue
        counts[ins.key] = counts.get(ins.key, 0) + 1
    return dict(sorted(counts.items()))


def group_counts(hist: dict[str, int]) -> dict[str, int]:
    out = dict.fromkeys(GROUP_ORDER, 0)
    for key, n in hist.items():
        out[group_of(key)] += n
    return out


def tensor_shapes(instrs: list[Instr]) -> dict[str, int]:
    """Full tensor-core opcodes (shape and types), e.g. HGMMA.64x128x16.F32.BF16."""
    counts: dict[str, int] = {}
    for ins in instrs:
        if group_of(ins.key) == "tensor":
            counts[ins.opcode] = counts.get(ins.opcode, 0) + 1
    return dict(sorted(counts.items()))


def register_budgets(instrs: list[Instr]) -> dict[str, list[int]]:
    """setmaxnreg as compiled: {"alloc": [...], "dealloc": [...]} registers per thread, sorted.
    (USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8 is setmaxnreg.inc 232; .DEALLOC is setmaxnreg.dec.)"""
    out: dict[str, set[int]] = {"alloc": set(), "dealloc": set()}
    for ins in instrs:
        if ins.key != "USETMAXREG":
            continue
        kind = "dealloc" if ".DEALLOC" in ins.opcode else "alloc"
        value = ins.operands.split(",")[-1].strip().rstrip(";")
        try:
            out[kind].add(int(value, 0))
        except ValueError:
            continue
    return {k: sorted(v) for k, v in out.items() if v}


# --- the main loop -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Loop:
    start: int  # address of the backward branch's target
    end: int  # address of the backward branch
    body: tuple[Instr, ...]

    @property
    def tensor(self) -> int:
        return sum(1 for i in self.body if group_of(i.key) == "tensor")

    def contains(self, other: Loop) -> bool:
        return self != other and self.start <= other.start and other.end <= self.end


def branch_target(ins: Instr) -> int | None:
    if not ins.opcode.startswith("BRA"):
        return None
    m = _HEX_TARGET_RE.match(ins.operands.split(",")[-1].strip())
    return int(m.group(1), 16) if m else None


def loops(instrs: list[Instr]) -> list[Loop]:
    """Every span closed by a backward branch, except jumps back from out-of-line code: a span that
    holds an unconditional EXIT or RET is no loop body (e.g. a barrier-retry block placed after the
    kernel's end, jumping back into the loop it came from)."""
    found = []
    for ins in instrs:
        target = branch_target(ins)
        if target is None or target > ins.addr:
            continue
        body = tuple(i for i in instrs if target <= i.addr <= ins.addr)
        if any(i.opcode.split(".")[0] in ("EXIT", "RET") and not i.pred for i in body):
            continue
        found.append(Loop(target, ins.addr, body))
    return found


def main_loop(instrs: list[Instr]) -> Loop | None:
    """The KV loop: a loop that holds both tensor-core instructions and exponentials (MUFU), so a
    k-step loop inside it that only runs the GEMM does not count; the innermost such loop, so a
    persistent kernel's tile loop around it does not either; of several (an unrolled copy and its
    remainder), the one with the most tensor-core instructions. Kernels without MUFU in any loop
    fall back to the innermost loop with tensor-core instructions."""
    tensor_loops = [lp for lp in loops(instrs) if lp.tensor]
    with_softmax = [lp for lp in tensor_loops if any(i.key.startswith("MUFU") for i in lp.body)]
    pool = with_softmax or tensor_loops
    innermost = [lp for lp in pool if not any(lp.contains(o) for o in pool)]
    if not innermost:
        return None
    return min(innermost, key=lambda lp: (-lp.tensor, lp.start, lp.end))


def memory_loop(instrs: list[Instr]) -> Loop | None:
    """A memory-bound kernel's main loop (Part II's rowwise stages): the innermost loop that loads
    from global memory; of several (the sum's walk and the output's, an unrolled copy and its
    remainder), the one with the most global loads, the first of equals. None: no loop loads (a
    kernel unrolled whole, its row held in registers)."""
    def loads(lp: Loop) -> int:
        return sum(1 for i in lp.body if i.key in ("LDG", "LD"))

    pool = [lp for lp in loops(instrs) if loads(lp)]
    innermost = [lp for lp in pool if not any(lp.contains(o) for o in pool)]
    if not innermost:
        return None
    return min(innermost, key=lambda lp: (-loads(lp), lp.start, lp.end))


def _gap(hidden: list[Instr]) -> str:
    top = sorted(histogram(hidden).items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    what = ", ".join(f"{k} {n}" for k, n in top)
    return f"        ... {len(hidden)} instructions not shown: {what}{', ...' if len(histogram(hidden)) > 5 else ''}"


def listing(body: tuple[Instr, ...] | list[Instr], where: dict[int, str] | None = None) -> list[str]:
    """The loop's SASS, bounded: whole when short, otherwise windows around the landmarks a reader
    looks for, with a one-line summary of each gap. ``where`` adds source lines by address."""
    where = where or {}
    body = list(body)
    n = len(body)
    if n <= LISTING_MAX:
        return [i.text(where.get(i.addr, "")) for i in body]
    anchors = [(0, WINDOW_TOP), (n - 1, WINDOW_END)]
    first_tensor = next((k for k, i in enumerate(body) if group_of(i.key) == "tensor"), None)
    first_mufu = next((k for k, i in enumerate(body) if i.key.startswith("MUFU")), None)
    if first_tensor is not None:
        anchors.append((first_tensor, WINDOW_TENSOR))
    if first_mufu is not None:
        anchors.append((first_mufu, WINDOW_MUFU))
    keep = set()
    for at, (lo, hi) in anchors:
        keep.update(range(max(0, at + lo), min(n, at + hi + 1)))
    lines, hidden = [], []
    for k, ins in enumerate(body):
        if k in keep:
            if hidden:
                lines.append(_gap(hidden))
                hidden = []
            lines.append(ins.text(where.get(ins.addr, "")))
        else:
            hidden.append(ins)
    return lines
