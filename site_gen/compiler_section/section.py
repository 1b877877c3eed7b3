"""The #compiler section of a stage page, rendered from the committed compiler facts (the record
hopattn.records.compiler_facts defines; hopattn.compiler makes it).

Rendering never compiles: a stage whose facts are missing or stale gets a note saying so.
"""

from __future__ import annotations

import html

from hopattn import lineage
from hopattn.records.compiler_facts import GROUP_LABELS, GROUP_ORDER, group_of

from . import changes
from .changes import signed, size, smem_bytes, spill_bytes

REFRESH = "python -m hopattn.compiler"


def _admonition(kind: str, title: str, text: str) -> str:
    return f'!!! {kind} "{title}"\n    {text}\n'


def _resources_table(cur: dict, prev: dict | None, prev_label: str) -> str:
    rows = [
        ("registers per thread", cur["registers"], prev and prev["registers"], str),
        ("spill stores / loads", (cur["spill_stores"], cur["spill_loads"]),
         prev and (prev["spill_stores"], prev["spill_loads"]), lambda v: f"{v[0]} B / {v[1]} B"),
        ("stack frame", cur["stack_frame"], prev and prev["stack_frame"], size),
        ("static shared memory", cur["static_smem"], prev and prev["static_smem"], size),
        ("dynamic shared memory", cur.get("dynamic_smem"), prev and prev.get("dynamic_smem"),
         lambda v: "unknown" if v is None else size(v)),
        ("named barriers", cur["barriers"], prev and prev["barriers"], str),
        ("SASS instructions", cur["instructions"], prev and prev["instructions"], lambda v: f"{v:,}"),
    ]
    head = f"| | this stage | {prev_label} | change |\n|---|---:|---:|---:|\n" if prev else \
        "| | this stage |\n|---|---:|\n"
    lines = []
    for label, a, b, fmt in rows:
        if prev is None:
            lines.append(f"| {label} | {fmt(a)} |")
            continue
        if isinstance(a, tuple):
            change = "" if a == b else f"{signed(sum(a) - sum(b))} B"
        elif a is None or b is None:
            change = ""
        else:
            change = "" if a == b else signed(a - b)
        lines.append(f"| {label} | {fmt(a)} | {fmt(b)} | {change} |")
    return head + "\n".join(lines) + "\n"


def _top(opcodes: dict[str, int], group: str, n: int = 5) -> str:
    items = sorted(((k, v) for k, v in opcodes.items() if group_of(k) == group),
                   key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{k} {v:,}" for k, v in items[:n])
    return text + (", …" if len(items) > n else "")


# A memory-bound kernel has no softmax: the group's FFMA, FMUL, SHFL and MUFU are its sum of squares,
# its shuffles and its rsqrt.
MEMORY_BOUND_LABELS = {"softmax": "float arithmetic, shuffles, MUFU"}


def _mix_table(cur: dict, prev: dict | None, labels: dict | None = None) -> str:
    labels = GROUP_LABELS | (labels or {})
    loop = cur.get("loop") or {}
    deltas = dict(changes.opcode_deltas(prev, cur)) if prev else {}
    head = "| instructions | whole kernel | main loop | most frequent |" + (" change |" if prev else "")
    rule = "|---|---:|---:|---|" + ("---|" if prev else "")
    lines = [head, rule]
    for group in GROUP_ORDER:
        total = cur["groups"].get(group, 0)
        in_loop = loop.get("groups", {}).get(group, 0) if loop else 0
        row = f"| {labels[group]} | {total:,} | {in_loop:,} | {_top(cur['opcodes'], group)} |"
        if prev:
            changed = [(k, d) for k, d in deltas.items() if group_of(k) == group]
            text = ", ".join(f"{k} {signed(d)}" for k, d in changed[:5]) + (", …" if len(changed) > 5 else "")
            row += f" {text} |"
        lines.append(row)
    return "\n".join(lines) + "\n"


def _loop_details(cur: dict, memory_bound: bool = False) -> str:
    """The main loop's listing; ``memory_bound``: a Part II kernel, whose main loop is the one that
    streams the row (hopattn.compiler.sass.memory_loop)."""
    loop = cur.get("loop")
    if not loop:
        if memory_bound:
            return ("No loop of the main kernel loads from global memory: it is unrolled whole, every load of its "
                    "share of the row issued before the first is used.\n")
        return "No loop with tensor-core instructions was found in the SASS.\n"
    lines = loop.get("source_lines")
    source = f", code from kernel.cu lines {lines[0]}–{lines[1]}" if lines else ""
    what = (f"{loop['opcodes'].get('LDG', 0):,} global loads" if memory_bound else
            f"{loop['groups'].get('tensor', 0):,} on the tensor cores")
    summary = (f"SASS of the main loop ({loop['start']}–{loop['end']}{source}: {loop['instructions']:,} "
               f"instructions, {what})")
    body = html.escape("\n".join(loop["listing"]))
    return (f'<details class="hd-sass" markdown="0">\n<summary>{html.escape(summary)}</summary>\n'
            f'<pre><code>{body}</code></pre>\n</details>\n')


def _stage_name(stage: lineage.Stage) -> str:
    return f"stage {stage.id}"


def compiler_section(stage: lineage.Stage, prev_stage: lineage.Stage | None, facts_of, name=_stage_name, *,
                     memory_bound: bool = False) -> str:
    """Markdown for the #compiler section of a stage page (no heading: the page owns it).
    ``facts_of(stage)`` gives (usable facts or None, why they are not current or None); ``name(stage)``
    how the text names a stage ("stage 07"; the backward's pages say "backward stage 01").
    ``memory_bound``: a Part II stage (hopattn.rowwise), whose many template instances its page lists in
    a table of their own (compiler_section/rowwise.py) rather than a line each here."""
    cur, problem = facts_of(stage)
    refresh = REFRESH + (f" --lineage {stage.lineage}" if memory_bound else "")
    if cur is None:
        return _admonition("note", "No compiler facts yet",
                           f"This stage has no compiler facts ({problem}); run `{refresh}` on a machine with nvcc.")
    prev = None
    if prev_stage is not None:
        prev, _ = facts_of(prev_stage)
    out = []
    if problem:
        out.append(_admonition("warning", "Stale compiler facts",
                               f"These facts were made from an earlier version of this stage ({problem}); "
                               f"run `{refresh}` to refresh them."))
    tools = cur.get("toolchain", {})
    out.append(f"Kernel `{cur['signature']}`, {cur['arch']} code built with nvcc {tools.get('nvcc', '?')} "
               f"(`{cur['nvcc_flags']}`), disassembled with cuobjdump {tools.get('cuobjdump', '?')} "
               f"(source lines: nvdisasm {tools.get('nvdisasm', '?')}).\n")
    prev_label = name(prev_stage) if prev_stage is not None else ""
    if prev is not None:
        out.append(f"**Against {prev_label}:** {changes.headline(prev, cur)}\n")
    elif prev_stage is not None:
        out.append(f"{prev_label[0].upper()}{prev_label[1:]} has no compiler facts to compare with.\n")
    out.append(_resources_table(cur, prev, prev_label))
    if cur.get("dynamic_smem_expr") and cur.get("dynamic_smem") is None:
        out.append(f"The dynamic shared memory is `{cur['dynamic_smem_expr']}`, which could not be evaluated.\n")
    planned_smem = getattr(stage, "smem_bytes", 0)  # a rowwise stage's spec lists no buffers
    if planned_smem and planned_smem != smem_bytes(cur):
        out.append(f"stage.toml lists {size(planned_smem)} of shared-memory buffers; the kernel "
                   f"reserves {size(smem_bytes(cur))} (static + dynamic, including alignment and barriers).\n")
    out.append(_mix_table(cur, prev, MEMORY_BOUND_LABELS if memory_bound else None))
    out.append("Counts are static: instructions in the code, not instructions executed (a loop body "
               "runs once per iteration).\n")
    if cur.get("tensor_shapes"):
        shapes = ", ".join(f"`{k}` × {v:,}" for k, v in cur["tensor_shapes"].items())
        out.append(f"Tensor-core instructions: {shapes}.\n")
    budgets = cur.get("setmaxnreg") or {}
    if budgets:
        compiled = "; ".join(f"{kind} to {', '.join(map(str, regs))}" for kind, regs in sorted(budgets.items()))
        planned = ", ".join(f"{r.name} {r.registers}" for r in getattr(stage, "roles", ()) if r.registers)
        out.append(f"setmaxnreg in the SASS: {compiled} registers per thread"
                   + (f" (stage.toml roles: {planned})." if planned else ".") + "\n")
    if cur.get("advisories"):
        out.append("ptxas notes:\n\n" + "\n".join(f"- {a}" for a in cur["advisories"]) + "\n")
    for other in [] if memory_bound else cur.get("other_functions", []):
        out.append(f"Also compiled: `{other['signature']}` ({other['registers']} registers, "
                   f"{spill_bytes(other)} B spilled, {other['instructions']:,} instructions).\n")
    out.append(_loop_details(cur, memory_bound))
    return "\n".join(out).strip() + "\n"
