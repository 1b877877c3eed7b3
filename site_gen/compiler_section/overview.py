"""The overview's "Compiler at a glance" table: registers, spills, shared memory and the
instruction counts that matter, one row per stage."""

from __future__ import annotations

from hopattn import lineage

from .changes import size, smem_bytes, spill_bytes
from .section import REFRESH


def overview_table(stages: list[lineage.Stage], facts_of, folder: str = "stages") -> str:
    """One row per stage, linked to its #compiler section; ``facts_of`` as in section.py; ``folder``:
    where the stages' pages are (stages/, or backward/ for Act V)."""
    lines = ["| stage | registers | spills | shared memory | tensor instr | HMMA | HGMMA | LDSM | MUFU |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    stale = False
    for stage in stages:
        facts, problem = facts_of(stage)
        name = f"[{stage.id} {stage.title.split(':')[0]}]({folder}/{stage.name}.md#compiler)"
        if facts is None:
            lines.append(f"| {name} | — | — | — | — | — | — | — | — |")
            continue
        mark = " †" if problem else ""
        stale = stale or bool(problem)
        ops = facts["opcodes"]
        mufu = sum(v for k, v in ops.items() if k.startswith("MUFU"))
        lines.append(f"| {name}{mark} | {facts['registers']} | {spill_bytes(facts)} B | {size(smem_bytes(facts))} "
                     f"| {facts['groups'].get('tensor', 0):,} | {ops.get('HMMA', 0):,} | {ops.get('HGMMA', 0):,} "
                     f"| {ops.get('LDSM', 0):,} | {mufu:,} |")
    notes = ["", ("Static counts of sm_90a SASS instructions in the whole kernel; registers per thread; "
                  "spills are ptxas' spill stores + loads; shared memory is static + dynamic.")]
    if stale:
        notes.append(f"† facts made from an earlier version of the stage: run `{REFRESH}`.")
    if any(facts_of(s)[0] is None for s in stages):
        notes.append(f"— no compiler facts yet: run `{REFRESH}`.")
    return ("\n".join(lines) + "\n" + "\n\n".join(notes)).strip() + "\n"
