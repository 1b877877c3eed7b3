"""Source lines of SASS instructions, from the line table that ``-lineinfo`` puts in the cubin.

cuobjdump cannot print it; nvdisasm can (``-gi``), but only reads a bare cubin, so the sm_90a ELF is
first extracted from the stage library with ``cuobjdump -xelf``. A library may hold more than one
ELF of that name (the tool then overwrites one with the other), so a line map is only kept for a
function whose instructions match, address by address, what ``cuobjdump -sass`` printed.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

from .. import cuda_tools
from . import sass

_SECTION_RE = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")
_FILE_RE = re.compile(r'"([^"]+)", line (\d+)')
_INSTR_RE = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+([^;]*?)\s*;")

Location = tuple[str, int]  # (short file name, line)


def short_path(path: str) -> str:
    """kernels/attention/NN_x/kernel.cu -> kernel.cu, .../common/tma.cuh -> common/tma.cuh (as for
    kernels/rmsnorm/common/), anything else (CUDA headers, fixtures) -> its file name."""
    parts = Path(os.path.normpath(path)).parts
    for lineage_dir in ("attention", "rmsnorm"):
        if lineage_dir in parts:
            rest = parts[len(parts) - parts[::-1].index(lineage_dir):]
            if rest and rest[0] == "common":
                return "/".join(rest)
    return Path(path).name


def parse_line_info(text: str) -> dict[str, dict[int, tuple[Location, ...]]]:
    """{function: {address: (innermost location, ..., outermost call site)}} from ``nvdisasm -gi``."""
    out: dict[str, dict[int, tuple[Location, ...]]] = {}
    function: str | None = None
    where: tuple[Location, ...] = ()
    after_comment = False  # nvdisasm may stack two comments: inlined chain, then the call site alone
    for line in text.splitlines():
        if m := _SECTION_RE.match(line):
            function, where, after_comment = m.group(1), (), False
            out.setdefault(function, {})
        elif "//## File" in line:
            chain = tuple((short_path(f), int(n)) for f, n in _FILE_RE.findall(line))
            if not after_comment or len(chain) > len(where):
                where = chain
            after_comment = True
        elif function is not None and (m := _INSTR_RE.match(line)):
            after_comment = False
            if where:
                out[function][int(m.group(1), 16)] = where
    return out


def opcodes_by_address(text: str) -> dict[str, dict[int, str]]:
    out: dict[str, dict[int, str]] = {}
    function = None
    for line in text.splitlines():
        if m := _SECTION_RE.match(line):
            function = m.group(1)
            out.setdefault(function, {})
        elif function is not None and (m := _INSTR_RE.match(line)):
            out[function][int(m.group(1), 16)] = sass.parse_instruction(m.group(2), 0).opcode
    return out


def disassemble_with_lines(library: Path, arch: str = "sm_90a") -> list[str]:
    """``nvdisasm -c -gi`` of every ``arch`` cubin in the library (one text per extracted file)."""
    nvdisasm = cuda_tools.require("nvdisasm")
    texts = []
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([cuda_tools.require("cuobjdump"), "-xelf", arch, str(Path(library).resolve())],
                              cwd=tmp, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise cuda_tools.ToolError(f"cuobjdump -xelf failed on {library}: {proc.stderr.strip()}")
        for cubin in sorted(Path(tmp).glob("*.cubin")):
            run = subprocess.run([nvdisasm, "-c", "-gi", str(cubin)], capture_output=True, text=True, check=False)
            if run.returncode == 0:
                texts.append(run.stdout)
    return texts


def line_maps(texts: list[str], instructions: dict[str, list[sass.Instr]]) -> dict[str, dict[int, tuple[Location, ...]]]:
    """Line maps of the functions whose disassembly agrees with cuobjdump's."""
    out: dict[str, dict[int, tuple[Location, ...]]] = {}
    for text in texts:
        opcodes = opcodes_by_address(text)
        for function, lines in parse_line_info(text).items():
            instrs = instructions.get(function)
            if instrs and opcodes.get(function) == {i.addr: i.opcode for i in instrs}:
                out[function] = lines
    return out


def label(where: tuple[Location, ...]) -> str:
    """'kernel.cu:76', or 'common/mma_sm80.cuh:18 < kernel.cu:76' for code inlined from a helper."""
    if not where:
        return ""
    # The innermost line of the project's own sources (not of a CUDA header it went through).
    own = [w for w in where if w[0] == "kernel.cu" or w[0].startswith("common/")]
    inner, outer = (own or where)[0], where[-1]
    text = f"{inner[0]}:{inner[1]}"
    return text if inner == outer else f"{text} < {outer[0]}:{outer[1]}"


def span(addresses: list[int], lines: dict[int, tuple[Location, ...]], file: str = "kernel.cu") -> list[int] | None:
    """[first, last] line of ``file`` that the given instructions come from (call sites count)."""
    found = [where[-1][1] for a in addresses if (where := lines.get(a)) and where[-1][0] == file]
    return [min(found), max(found)] if found else None
