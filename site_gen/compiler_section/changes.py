"""What changed in the compiled code from one stage to the next: resource numbers as "a → b" and
opcode counts as signed deltas ("HGMMA +64, HMMA −512"), in a stable order."""

from __future__ import annotations

from hopattn.records.compiler_facts import GROUP_ORDER, group_of

MINUS = "\u2212"  # a real minus sign reads better than a hyphen in "HMMA −512"


def signed(n: int) -> str:
    return f"+{n:,}" if n > 0 else f"{MINUS}{-n:,}" if n < 0 else "0"


def spill_bytes(facts: dict) -> int:
    return facts["spill_stores"] + facts["spill_loads"]


def smem_bytes(facts: dict) -> int:
    return facts["static_smem"] + (facts.get("dynamic_smem") or 0)


def size(n: int) -> str:
    """Whole KiB, and the bytes past them (the mbarriers next to a stage's tiles): "96 KiB + 24 B", so
    every size of a table is written the same way."""
    if n >= 1024:
        kib, rest = divmod(n, 1024)
        return f"{kib} KiB" + (f" + {rest} B" if rest else "")
    return f"{n} B"


def opcode_deltas(prev: dict, cur: dict, section: str | None = None) -> list[tuple[str, int]]:
    """(opcode key, change) for every opcode whose count changed, by group order, then size of change.
    ``section`` "loop" compares the main loops instead of the whole kernels."""
    a = (prev.get(section) or {}).get("opcodes", {}) if section else prev["opcodes"]
    b = (cur.get(section) or {}).get("opcodes", {}) if section else cur["opcodes"]
    deltas = [(k, b.get(k, 0) - a.get(k, 0)) for k in sorted(set(a) | set(b))]
    order = {g: i for i, g in enumerate(GROUP_ORDER)}
    deltas = [(k, d) for k, d in deltas if d]
    return sorted(deltas, key=lambda kd: (order[group_of(kd[0])], -abs(kd[1]), kd[0]))


def headline(prev: dict, cur: dict, limit: int = 8) -> str:
    """One line: registers, spills and shared memory as a → b, then the opcode changes that matter
    (integer and control instructions are left to the full table)."""
    parts = [f"registers {prev['registers']} → {cur['registers']}",
             f"spills {spill_bytes(prev)} → {spill_bytes(cur)} B",
             f"shared memory {size(smem_bytes(prev))} → {size(smem_bytes(cur))}"]
    deltas = [(k, d) for k, d in opcode_deltas(prev, cur) if group_of(k) != "other"]
    if deltas:
        shown = ", ".join(f"{k} {signed(d)}" for k, d in deltas[:limit])
        parts.append(shown + (", …" if len(deltas) > limit else ""))
    else:
        parts.append("same tensor, memory, softmax and sync instruction counts")
    return " · ".join(parts)
