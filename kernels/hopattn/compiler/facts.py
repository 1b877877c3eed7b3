"""Makes a stage's compiler facts from its own build (same nvcc flags as hopattn.build, so the
facts describe the code that runs): ptxas' report, the sm_90a SASS and its source lines.

Making facts needs nvcc, cuobjdump and nvdisasm but no GPU; the result goes to the record that
hopattn.records.compiler_facts defines, which is all the site reads.
"""

from __future__ import annotations

import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from .. import build, cpp, cuda_tools, lineage, rowwise
from ..records import compiler_facts as record
from . import line_info, ptxas, sass

ARCH = record.ARCH


def toolchain() -> dict[str, str]:
    return {tool: cuda_tools.version(cuda_tools.require(tool)) for tool in ("nvcc", "cuobjdump", "nvdisasm")}


_INFO_SMEM_RE = re.compile(r"\binfo->dynamic_smem\s*=\s*([^;]+);")


def dynamic_smem(source: str) -> tuple[int | None, str]:
    """(bytes, the expression as written) of the dynamic shared memory the stage launches with:
    the third argument of the ABI's ``describe_kernel(kernel, threads, dynamic_smem, ...)``, which
    ptxas cannot see (it only reports static ``__shared__`` arrays); a rowwise stage's
    (kernels/rmsnorm/common/abi_rmsnorm.h) sets ``info->dynamic_smem`` for each configuration
    instead, known when every one sets the same."""
    args = cpp.call_arguments(source, "describe_kernel")
    if not args or len(args) < 3:
        exprs = sorted({" ".join(e.split()) for e in _INFO_SMEM_RE.findall(source)})
        if len(exprs) == 1:
            return cpp.evaluate(exprs[0], cpp.constants(source)), exprs[0]
        return None, ""
    expr = " ".join(args[2].split())
    return cpp.evaluate(expr, cpp.constants(source)), expr


def demangle(names: list[str]) -> dict[str, str]:
    """Mangled -> readable names; names stay as they are where c++filt is missing."""
    path = cuda_tools.find("c++filt")
    if not names or path is None:
        return {n: n for n in names}
    out = subprocess.run([path, *names], capture_output=True, text=True, check=False).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def _matches_kernel(mangled: str, name: str) -> bool:
    # Itanium mangling spells a plain name as <length><name>; extern "C" kernels are not mangled.
    return mangled == name or (mangled.startswith("_Z") and f"{len(name)}{name}" in mangled)


# Template arguments as Itanium mangling writes them: _Z<length><name>I<arguments>E..., an integer
# as Li<n>E, a type by its length-prefixed name (13__nv_bfloat16, 6__half) or its letter (f: float).
_MANGLED_RE = re.compile(r"_Z(\d+)")
_INT_ARG_RE = re.compile(r"Li(\d+)E")
DTYPE_CODES = (("13__nv_bfloat16", "bf16"), ("6__half", "fp16"), ("f", "fp32"))


def instance_dtype(mangled: str) -> str | None:
    """bf16, fp16 or fp32: the element type (the first template argument) a rowwise kernel instance
    is compiled for; None for a function that is no template of one."""
    m = _MANGLED_RE.match(mangled)
    if not m:
        return None
    args = mangled[m.end() + int(m.group(1)):]
    if not args.startswith("I"):
        return None
    return next((name for code, name in DTYPE_CODES if args[1:].startswith(code)), None)


def _instance_key(stage, mangled: str) -> tuple:
    """A rowwise instance's place in its record: the spec's kernel first, the others by name; then
    bf16, fp16, fp32 (the benchmark measures bf16); then its integer template arguments, largest
    first (the instance that holds the longest rows, with the widest accesses); then the name."""
    dtypes = [name for _code, name in DTYPE_CODES]
    dtype = instance_dtype(mangled)
    ints = tuple(-int(n) for n in _INT_ARG_RE.findall(mangled))
    m = _MANGLED_RE.match(mangled)
    name = mangled[m.end():m.end() + int(m.group(1))] if m else mangled
    return (not _matches_kernel(mangled, stage.kernel), name, dtypes.index(dtype) if dtype else len(dtypes), ints,
            mangled)


def _pick_primary(stage: lineage.Stage, functions: list[str], instructions: dict) -> str:
    if isinstance(stage, rowwise.RowStage):  # many template instances: the bf16 one of the longest rows
        return min(functions, key=lambda f: _instance_key(stage, f))
    named = sorted(f for f in functions if _matches_kernel(f, stage.kernel))
    if named:
        return named[0]
    return max(sorted(functions), key=lambda f: len(instructions.get(f, [])))


def _others(stage, functions: list[str], primary: str) -> list[str]:
    """Every other entry function, in the record's order: a rowwise stage's instances as _instance_key
    orders them, the attention stages' by name."""
    rest = [f for f in functions if f != primary]
    return sorted(rest, key=lambda f: _instance_key(stage, f)) if isinstance(stage, rowwise.RowStage) else rest


def make_facts(stage: lineage.Stage, ptxas_log: str, sass_dump: str, tools: dict[str, str],
               line_texts: list[str] = ()) -> dict:
    """The facts dict from a stage's ptxas report, SASS dump and ``nvdisasm -gi`` texts (pure: no
    compiler runs here)."""
    resources = {fn: r for (arch, fn), r in ptxas.parse_ptxas(ptxas_log).items() if arch == ARCH}
    instructions = sass.parse_sass(sass_dump, ARCH)
    functions = sorted(set(resources) | set(instructions))
    if not functions:
        raise cuda_tools.ToolError(f"stage {stage.name}: no {ARCH} entry function in the build output")
    primary = _pick_primary(stage, functions, instructions)
    names = demangle(functions)
    source = stage.kernel_path.read_text()
    dyn, dyn_expr = dynamic_smem(source)

    def summary(fn: str) -> dict:
        r = resources.get(fn) or ptxas.Resources(fn, ARCH)
        hist = sass.histogram(instructions.get(fn, []))
        return {"function": fn, "signature": names[fn], "registers": r.registers, "barriers": r.barriers,
                "static_smem": r.static_smem, "stack_frame": r.stack_frame, "spill_stores": r.spill_stores,
                "spill_loads": r.spill_loads, "instructions": sum(hist.values()),
                "advisories": ptxas.advisory_summary(r.advisories)}

    instrs = instructions.get(primary, [])
    hist = sass.histogram(instrs)
    # a memory-bound kernel's main loop is the one that streams the row (no tensor core there)
    loop = sass.memory_loop(instrs) if isinstance(stage, rowwise.RowStage) else sass.main_loop(instrs)
    lines = line_info.line_maps(list(line_texts), instructions).get(primary, {})
    facts = {
        "schema_version": record.SCHEMA_VERSION,
        "stage": stage.name,
        "source_hash": stage.source_hash(),
        "source_lines_hash": stage.source_lines_hash(),  # the line numbers below are of these lines
        "nvcc_flags": record.flags_text(stage),
        "toolchain": dict(sorted(tools.items())),
        "arch": ARCH,
        **summary(primary),
        "dynamic_smem": dyn,
        "dynamic_smem_expr": dyn_expr,
        "opcodes": hist,
        "groups": sass.group_counts(hist),
        "tensor_shapes": sass.tensor_shapes(instrs),
        "setmaxnreg": sass.register_budgets(instrs),
        "loop": None,
        "other_functions": [summary(fn) for fn in _others(stage, functions, primary)],
    }
    if loop is not None:
        loop_hist = sass.histogram(list(loop.body))
        facts["loop"] = {"start": f"0x{loop.start:04x}", "end": f"0x{loop.end:04x}",
                         "instructions": sum(loop_hist.values()), "opcodes": loop_hist,
                         "groups": sass.group_counts(loop_hist),
                         "source_lines": line_info.span([i.addr for i in loop.body], lines),
                         "listing": sass.listing(
                             loop.body, {a: line_info.label(w) for a, w in lines.items()})}
    return facts


def collect(stage: lineage.Stage, tools: dict[str, str] | None = None) -> dict:
    """Compile (or reuse the build cache) and disassemble one stage."""
    result = build.compile_stage(stage)
    return make_facts(stage, result.ptxas_log, sass.dump_sass(result.library, ARCH),
                      tools or toolchain(), line_info.disassemble_with_lines(result.library, ARCH))


def status_key(stage: lineage.Stage) -> str:
    """A stage's key in refresh's report: its name, the backward's (Act V) as "backward NN-slug",
    Part II's as "rmsnorm NN-slug" (the lineages number alike: two have a 01-baseline)."""
    if isinstance(stage, rowwise.RowStage):
        return f"{stage.lineage} {stage.name}"
    return f"backward {stage.name}" if stage.backward else stage.name


def refresh(stages: list[lineage.Stage], jobs: int = 2, force: bool = False, log=print) -> dict[str, str]:
    """Bring every stage's facts file up to date; returns {status_key(stage): 'kept'|'written'|'unchanged'}."""
    tools = toolchain()
    todo, status = [], {}
    for stage in stages:
        old = record.load(stage)
        if not force and record.problem(stage, old) is None and old.get("toolchain") == tools:
            status[status_key(stage)] = "kept"
        else:
            todo.append(stage)

    def one(stage):
        start = time.perf_counter()
        facts = collect(stage, tools)
        changed = record.write(stage, facts)
        return stage, changed, time.perf_counter() - start

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for stage, changed, seconds in pool.map(one, todo):
            status[status_key(stage)] = "written" if changed else "unchanged"
            log(f"  {status_key(stage)}: {status[status_key(stage)]} ({seconds:.1f} s)")
    return dict(sorted(status.items()))
