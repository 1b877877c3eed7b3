"""Compiler facts of a stage: one small JSON per stage under site_gen/data/compiler/, made from the
stage's own build (same nvcc flags as hopattn.build, so the facts describe the code that runs) and
stamped with the source hash it was made from.

Making facts needs nvcc and cuobjdump but no GPU. Reading them (the site) needs neither: a stage
whose facts are missing or were made from other sources is reported, never recompiled, there.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hopattn import build, lineage

from . import (
    compiler_lines,
    compiler_ptxas,
    compiler_sass,
    compiler_source,
    compiler_tools,
)

SCHEMA_VERSION = 1
ARCH = "sm_90a"  # the code Hopper runs; sm_80 stages embed sm_80 code too, which is ignored
FACTS_DIR = Path(__file__).resolve().parent / "data" / "compiler"


def facts_path(stage: lineage.Stage, facts_dir: Path | None = None) -> Path:
    # FACTS_DIR is read at call time so that tests can point it elsewhere.
    return Path(facts_dir or FACTS_DIR) / f"{stage.name}.json"


def flags_text(stage: lineage.Stage) -> str:
    return " ".join(build.nvcc_flags(stage))


def toolchain() -> dict[str, str]:
    return {"nvcc": compiler_tools.tool_version(build.nvcc()),
            "cuobjdump": compiler_tools.tool_version(compiler_tools.cuobjdump()),
            "nvdisasm": compiler_tools.tool_version(compiler_tools.nvdisasm())}


def _matches_kernel(mangled: str, name: str) -> bool:
    # Itanium mangling spells a plain name as <length><name>; extern "C" kernels are not mangled.
    return mangled == name or (mangled.startswith("_Z") and f"{len(name)}{name}" in mangled)


def _pick_primary(stage: lineage.Stage, functions: list[str], sass: dict) -> str:
    named = sorted(f for f in functions if _matches_kernel(f, stage.kernel))
    if named:
        return named[0]
    return max(sorted(functions), key=lambda f: len(sass.get(f, [])))


def make_facts(stage: lineage.Stage, ptxas_log: str, sass_dump: str, tools: dict[str, str],
               line_texts: list[str] = ()) -> dict:
    """The facts dict from a stage's ptxas report, SASS dump and ``nvdisasm -gi`` texts (pure: no
    compiler runs here)."""
    resources = {fn: r for (arch, fn), r in compiler_ptxas.parse_ptxas(ptxas_log).items() if arch == ARCH}
    sass = compiler_sass.parse_sass(sass_dump, ARCH)
    functions = sorted(set(resources) | set(sass))
    if not functions:
        raise compiler_tools.ToolError(f"stage {stage.name}: no {ARCH} entry function in the build output")
    primary = _pick_primary(stage, functions, sass)
    names = compiler_tools.demangle(functions)
    source = stage.kernel_path.read_text()
    dyn, dyn_expr = compiler_source.dynamic_smem(source)

    def summary(fn: str) -> dict:
        r = resources.get(fn) or compiler_ptxas.Resources(fn, ARCH)
        instrs = sass.get(fn, [])
        hist = compiler_sass.histogram(instrs)
        return {"function": fn, "signature": names[fn], "registers": r.registers, "barriers": r.barriers,
                "static_smem": r.static_smem, "stack_frame": r.stack_frame, "spill_stores": r.spill_stores,
                "spill_loads": r.spill_loads, "instructions": sum(hist.values()),
                "advisories": compiler_ptxas.advisory_summary(r.advisories)}

    instrs = sass.get(primary, [])
    hist = compiler_sass.histogram(instrs)
    loop = compiler_sass.main_loop(instrs)
    lines = compiler_lines.line_maps(list(line_texts), sass).get(primary, {})
    facts = {
        "schema_version": SCHEMA_VERSION,
        "stage": stage.name,
        "source_hash": stage.source_hash(),
        "nvcc_flags": flags_text(stage),
        "toolchain": dict(sorted(tools.items())),
        "arch": ARCH,
        **summary(primary),
        "dynamic_smem": dyn,
        "dynamic_smem_expr": dyn_expr,
        "opcodes": hist,
        "groups": compiler_sass.group_counts(hist),
        "tensor_shapes": compiler_sass.tensor_shapes(instrs),
        "setmaxnreg": compiler_sass.register_budgets(instrs),
        "loop": None,
        "other_functions": [summary(fn) for fn in functions if fn != primary],
    }
    if loop is not None:
        loop_hist = compiler_sass.histogram(list(loop.body))
        facts["loop"] = {"start": f"0x{loop.start:04x}", "end": f"0x{loop.end:04x}",
                         "instructions": sum(loop_hist.values()), "opcodes": loop_hist,
                         "groups": compiler_sass.group_counts(loop_hist),
                         "source_lines": compiler_lines.span([i.addr for i in loop.body], lines),
                         "listing": compiler_sass.listing(
                             loop.body, {a: compiler_lines.label(w) for a, w in lines.items()})}
    return facts


def collect(stage: lineage.Stage, tools: dict[str, str] | None = None) -> dict:
    """Compile (or reuse the build cache) and disassemble one stage."""
    result = build.compile_stage(stage)
    return make_facts(stage, result.ptxas_log, compiler_tools.dump_sass(result.library, ARCH),
                      tools or toolchain(), compiler_lines.disassemble_with_lines(result.library, ARCH))


# --- files ---------------------------------------------------------------------------------------


def dumps(facts: dict) -> str:
    return json.dumps(facts, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def write_if_changed(path: Path, text: str) -> bool:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file() and path.read_text() == text:
        return False
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


def load(stage: lineage.Stage, facts_dir: Path | None = None) -> dict | None:
    path = facts_path(stage, facts_dir)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def problem(stage: lineage.Stage, facts: dict | None) -> str | None:
    """Why the facts cannot be trusted for the stage as it is now (None: they are current)."""
    if facts is None:
        return "missing"
    if facts.get("schema_version") != SCHEMA_VERSION:
        return "made by another version of the facts generator"
    if facts.get("source_hash") != stage.source_hash():
        return f"stale: made from sources {facts.get('source_hash')}, the stage is now {stage.source_hash()}"
    if facts.get("nvcc_flags") != flags_text(stage):
        return "stale: made with other nvcc flags"
    return None


def refresh(stages: list[lineage.Stage], jobs: int = 2, force: bool = False,
            facts_dir: Path | None = None, log=print) -> dict[str, str]:
    """Bring every stage's facts file up to date; returns {stage name: 'kept'|'written'|'unchanged'}."""
    tools = toolchain()
    todo, status = [], {}
    for stage in stages:
        old = load(stage, facts_dir)
        if not force and problem(stage, old) is None and old.get("toolchain") == tools:
            status[stage.name] = "kept"
        else:
            todo.append(stage)

    def one(stage):
        start = time.perf_counter()
        facts = collect(stage, tools)
        changed = write_if_changed(facts_path(stage, facts_dir), dumps(facts))
        return stage, changed, time.perf_counter() - start

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for stage, changed, seconds in pool.map(one, todo):
            status[stage.name] = "written" if changed else "unchanged"
            log(f"  {stage.name}: {status[stage.name]} ({seconds:.1f} s)")
    return dict(sorted(status.items()))
