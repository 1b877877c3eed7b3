"""Parses the ``ptxas -v`` report that nvcc prints with ``-Xptxas=-v``.

One nvcc call runs ptxas once per real architecture; each run prints its advisories (performance
notes such as "wgmma serialized" or "setmaxnreg ignored"), then one block per entry function:
registers, barriers, static shared memory, stack frame and spill bytes. The result is keyed by
(arch, mangled function name) so callers can pick the sm_90a code that actually runs on Hopper.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_FRAME_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED_RE = re.compile(r"Used (\d+) registers")
_BARRIERS_RE = re.compile(r"used (\d+) barriers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")
# Advisories: numbered infos ("(C7510) Potential Performance Loss: ...") and every warning.
_ADVISORY_RE = re.compile(r"^ptxas (?:info\s*:\s*(\(C\d+\).*|Potential Performance Loss.*)|warning\s*:\s*(.*))$")
# Line numbers of the generated PTX and function names vary with unrelated edits; drop them so an
# advisory reads (and compares) the same from one stage to the next.
_ADVISORY_NOISE = [(re.compile(r"\s*(?:in )?(?:around )?line \d+"), ""),
                   (re.compile(r"\s*in function '[^']*'"), "")]


@dataclass
class Resources:
    """What ptxas reports for one entry function on one architecture."""

    function: str
    arch: str
    registers: int = 0
    barriers: int = 0
    static_smem: int = 0
    stack_frame: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    advisories: list[str] = field(default_factory=list)


def clean_advisory(text: str) -> str:
    for pattern, repl in _ADVISORY_NOISE:
        text = pattern.sub(repl, text)
    return text.strip().rstrip(".") + "."


def parse_ptxas(log: str) -> dict[tuple[str, str], Resources]:
    """{(arch, function): Resources} for every entry function in the log."""
    out: dict[tuple[str, str], Resources] = {}
    pending: list[str] = []  # advisories printed before the next function of the same ptxas run
    current: Resources | None = None
    for line in log.splitlines():
        if m := _ENTRY_RE.search(line):
            function, arch = m.groups()
            current = out.setdefault((arch, function), Resources(function, arch))
            current.advisories.extend(pending)
            pending = []
        elif m := _ADVISORY_RE.match(line.strip()):
            pending.append(clean_advisory(m.group(1) or f"warning: {m.group(2)}"))
        elif current is not None and (m := _FRAME_RE.search(line)):
            current.stack_frame, current.spill_stores, current.spill_loads = map(int, m.groups())
        elif current is not None and (m := _USED_RE.search(line)):
            current.registers = int(m.group(1))
            if b := _BARRIERS_RE.search(line):
                current.barriers = int(b.group(1))
            if s := _SMEM_RE.search(line):
                current.static_smem = int(s.group(1))
    return out


def advisory_summary(advisories: list[str]) -> list[str]:
    """Distinct advisories in first-seen order, with a count when one repeats."""
    counts: dict[str, int] = {}
    for a in advisories:
        counts[a] = counts.get(a, 0) + 1
    return [a if n == 1 else f"{a} (×{n})" for a, n in counts.items()]
