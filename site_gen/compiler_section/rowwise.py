"""Part II's compiler facts by template instance: a rowwise stage compiles one instance of each kernel
per dtype and launch configuration, and a row held in registers fits only where its instance does
not spill. The table lists every instance the facts record (hopattn.compiler --lineage rmsnorm):
registers and spilled bytes for bf16, fp16 and fp32, the configuration's row lengths the figures
draw beside the instance that runs them; and the overview's table, a row per stage."""

from __future__ import annotations

import re

from hopattn.compiler.facts import instance_dtype
from hopattn.rowwise import Config

from ..diagrams import h200
from ..diagrams.rowwise import model
from .changes import spill_bytes

DTYPES = ("bf16", "fp16", "fp32")
_SIG_RE = re.compile(r"^(?:void )?(\w+)(?:<(.*)>)?\(")


ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
VECTOR = "16 B"  # a streamed kernel's kVec, as bytes: 8 bf16 or 4 fp32 elements make one 16-byte access


def _instance(fn: dict) -> tuple[str, tuple, str | None]:
    """(kernel, its integer template arguments, dtype) of a function of the facts; a streamed kernel's
    one argument, its elements per access, as the bytes of an access ("16 B", "2 B"), which is the
    same configuration for every dtype."""
    m = _SIG_RE.match(fn["signature"])
    name = m.group(1) if m else fn["function"]
    args = [a.strip() for a in (m.group(2) or "").split(",")] if m and m.group(2) else []
    ints = tuple(int(a) for a in args if a.isdigit())
    dtype = instance_dtype(fn["function"])
    if len(ints) == 1 and dtype in ELEMENT_BYTES:
        ints = ("16 B" if ints[0] * ELEMENT_BYTES[dtype] == 16 else "1 element",)
    return name, ints, dtype


def runs(config: Config, name: str, ints: tuple[int, ...]) -> bool:
    """Whether the bf16 instance (name, ints) is what ``config`` launches for aligned rows: a held
    configuration by its threads per row, vectors, rows per CTA (and cluster); a streamed one by its
    kernel, with 16-byte accesses (8 bf16 a vector)."""
    if name != config.kernel:
        return False
    if config.vectors:
        held = (config.threads_per_row, config.vectors, config.rows_per_cta)
        return ints in (held, held + (config.cluster,)) and (len(ints) == 4 or config.cluster == 1)
    return not ints or ints[0] == VECTOR


def instance_rows(stage, facts: dict) -> list[dict]:
    """One row per kernel instance (kernel and template integers), in the facts' order: per dtype its
    registers and spilled bytes, and the row lengths (of the figures') that it runs in bf16."""
    rows: dict[tuple, dict] = {}
    for fn in [facts, *facts.get("other_functions", [])]:
        name, ints, dtype = _instance(fn)
        row = rows.setdefault((name, ints), {"kernel": name, "ints": ints, "dtypes": {}, "lengths": []})
        row["dtypes"][dtype] = (fn["registers"], spill_bytes(fn))
    for lay in model.layouts(stage):
        for (name, ints), row in rows.items():
            if runs(lay.config, name, ints):
                row["lengths"].append(lay.label)
                break
    return list(rows.values())


def instances_section(stage, facts: dict | None) -> str:
    """Markdown: the table of instances and what it says about the longest rows (``facts`` None: "")."""
    if facts is None:
        return ""
    rows = instance_rows(stage, facts)
    cap = h200.REGISTERS // 1024
    lines = ["| Kernel and configuration | runs, bf16 | " + " | ".join(DTYPES) + " |",
             "|---|---|" + "---:|" * len(DTYPES)]
    for row in rows:
        ints = row["ints"]
        if ints and isinstance(ints[0], str):
            label = f"`{row['kernel']}`, {ints[0]} a load"
        else:
            label = f"`{row['kernel']}<T{''.join(f', {n}' for n in ints)}>`"
        if row is rows[0]:
            label += " (the main one)"
        cells = []
        for dtype in DTYPES:
            if dtype not in row["dtypes"]:
                cells.append("–")
                continue
            regs, spilled = row["dtypes"][dtype]
            cells.append(f"{regs}" + (f" · **{spilled} B spilled**" if spilled else ""))
        lines.append(f"| {label} | {', '.join(row['lengths']) or ''} | " + " | ".join(cells) + " |")
    spilled = [r for r in rows for d, (_reg, s) in r["dtypes"].items() if s]
    count = sum(len(r["dtypes"]) for r in rows)
    lead = (f"**Every template instance** ({count} of them: {len(rows)} configuration{'s' if len(rows) != 1 else ''}, "
            "each compiled for the dtypes it serves; T is the dtype), registers per thread as ptxas reports them; "
            + ("**none spills**." if not spilled else f"**{len(spilled)} spill** (in bold).")
            + " A row held in registers stays there only while its instance does not spill: a spilled "
            "register goes to local memory, through L1 and L2, and its bytes cross the memory system again "
            "— the traffic this stage's figures count would grow.")
    if any(c.cta_threads == 1024 for c in stage.spec.config):
        lead += (f" A CTA of 1024 threads can have at most {cap} registers a thread ({h200.REGISTERS:,} an SM), "
                 "which `__launch_bounds__` tells ptxas.")
    held = [lay for lay in model.layouts(stage) if lay.held]
    longest = max(held, key=lambda lay: lay.cols) if held else None
    tail = ""
    if longest is not None:
        main = next((r for r in rows if longest.label in r["lengths"]), None)
        if main is not None and "bf16" in main["dtypes"]:
            regs, spilled_b = main["dtypes"]["bf16"]
            tail = (f"\nThe longest row this stage holds of the four drawn ({longest.label}, "
                    f"{model.fmt(longest.row_bytes)}) runs `{main['kernel']}<bf16, "
                    f"{', '.join(map(str, main['ints']))}>`: {longest.registers} of its {regs} registers hold the "
                    f"row, {spilled_b} B spilled.\n")
    return "\n".join([lead, "", *lines, "", "The *runs* column: the row lengths of the figures (4k, 16k, 64k, "
                      "256k bf16, rows aligned to 16 bytes) that the launcher gives to that instance.", tail])


def overview_table(stages, facts_of) -> str:
    """A row per stage: its main instance, the fewest and most registers of its instances, spills."""
    out = ["| Stage | main kernel instance | registers (instances) | spilled | instances |", "|---|---|---:|---:|---:|"]
    for s in stages:
        facts, problem = facts_of(s)
        link = f"[{s.id} · {s.title.split(':')[0]}]({s.name}.md#compiler)"
        if facts is None:
            out.append(f"| {link} | — | — | — | — |")
            continue
        fns = [facts, *facts.get("other_functions", [])]
        regs = sorted(f["registers"] for f in fns)
        spilled = sum(spill_bytes(f) for f in fns)
        mark = " †" if problem else ""
        out.append(f"| {link}{mark} | `{facts['signature'].removeprefix('void ').split('(')[0]}` | "
                   f"{regs[0]}–{regs[-1]} | {spilled} B | {len(fns)} |")
    notes = ["Registers per thread of the sm_90a code, the fewest and most over every template instance "
             "(dtype and configuration); spilled: ptxas' spill stores + loads over all of them."]
    if any(facts_of(s)[1] for s in stages if facts_of(s)[0] is not None):
        notes.append("† facts made from an earlier version of the stage: run "
                     "`python -m hopattn.compiler --lineage rmsnorm`.")
    return "\n".join(out) + "\n\n" + "\n\n".join(notes) + "\n"
