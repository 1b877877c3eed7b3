"""Softmax forward stage 06, a lean element loop, drafted in research/softmax/drafts/ and, after its GPU
run (2026-12-03T0951), moved into kernels/softmax/06_lean-element-loop/: these checks of the draft stay.

Here it is assembled beside the lineage's headers and its stages up to 05, as it will be when it joins,
read as a stage (its stage.toml and [constants] checked as the lineage's are, its [[config]] against its
launcher), and compiled with the project's flags next to stage 05 (nvcc, no GPU): every instance as
stage 05's, no spills and no ptxas remark, the slices' and the 1024-thread CTAs' registers within 64, and
fewer SASS instructions an element on the path a thread of a whole row takes (counted as the draft's
notes count them: the path from the entry to an EXIT with the most 16-byte accesses, the fewest element
accesses and slow divisions, the most MUFU.EX2 and then the fewest instructions), with exp2f's range
check gone from the element loop and two exponentials an element."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import pytest
from hopattn import build, cuda_tools, lineage, softmax_lineage

pytestmark = pytest.mark.nvcc

ROOT = Path(__file__).resolve().parent.parent
DRAFTS = ROOT / "kernels" / "softmax"  # 06 moved in after its GPU run (2026-12-03T0951); compared with 05 still
DRAFT = "06_lean-element-loop"
PREVIOUS = "05_small-ctas-for-long-rows"
BF16_16K = "_Z12softmax_rowsI13__nv_bfloat16Li256ELi8ELi1ELi1EEv13SoftmaxParams"  # 256 threads x 8 vectors
REMARK = re.compile(r"ptxas (warning|error)|Potential Performance Loss|C75\d\d", re.I)


def _tool_or_skip(name: str) -> str:
    try:
        return cuda_tools.require(name)
    except cuda_tools.ToolError as err:
        pytest.skip(str(err))


def _up_to_05() -> list:
    """The lineage's stages the draft was drafted beside: 01 to 05 (so this test holds once 06 joins)."""
    return [s for s in softmax_lineage.discover() if s.number <= 5]


def _tree(root: Path) -> Path:
    """kernels/softmax as it will be: its common/, stages 01–05 and the draft; the RMSNorm headers it includes."""
    kernels = root / "kernels"
    shutil.copytree(softmax_lineage.SOFTMAX_DIR / "common", kernels / "softmax" / "common")
    shutil.copytree(lineage.RMSNORM_DIR / "common", kernels / "rmsnorm" / "common")
    for stage in _up_to_05():
        shutil.copytree(stage.dir, kernels / "softmax" / stage.dir.name)
    shutil.copytree(DRAFTS / DRAFT, kernels / "softmax" / DRAFT)
    return kernels / "softmax"


# ---- SASS: instructions, and the path a thread of a whole row takes --------------------------------

INSN = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;")
ELEMENT_ACCESS = re.compile(r"^(LDG|STG)\.E(\.U16|\.U8|\.S16)?$")  # one element's load or store, not 16 bytes


def _functions(dump: str) -> dict[str, list[str]]:
    out, name = {}, None
    for line in dump.splitlines():
        if m := re.search(r"Function : (\S+)", line):
            name = m.group(1)
            out[name] = []
        elif (m := INSN.match(line)) and name:
            out[name].append((int(m.group(1), 16), m.group(2)))
    return out


def _opcode(text: str) -> str:
    text = re.sub(r"^@!?U?P[T0-9]+\s+", "", text)
    return text.split()[0] if text else ""


def main_path(insns: list[tuple[int, str]]) -> list[str]:
    """The instructions on the path from the entry to an EXIT with the most 16-byte loads and stores,
    then the fewest element-wise accesses and slow-path calls, then the most MUFU.EX2, then the fewest
    instructions: what a thread whose vectors all lie inside the row issues (NOPs left out). The kernels
    are unrolled; a backward branch (a wait loop) is not followed."""
    index = {a: i for i, (a, _) in enumerate(insns)}
    ops = [_opcode(t) for _, t in insns]

    def successors(i):
        text, op = insns[i][1], ops[i]
        predicated = text.startswith("@")
        if op.startswith("BRA"):
            target = int(re.search(r"0x([0-9a-f]+)\s*$", text).group(1), 16)
            return [index[target]] + ([i + 1] if predicated else [])
        if op == "EXIT" or op.startswith("RET"):
            return [None] + ([i + 1] if predicated else [])
        return [i + 1] if i + 1 < len(insns) else [None]

    @lru_cache(maxsize=None)
    def best(i):
        if i is None:
            return (0, 0, 0, 0, ())
        op = ops[i]
        options = [best(j) for j in successors(i) if j is None or j > i]
        wide, narrow, ex2, length, path = max(options, key=lambda o: (o[0], -o[1], o[2], -o[3]))
        return (wide + (op in ("LDG.E.128", "STG.E.128")),
                narrow + bool(ELEMENT_ACCESS.match(op) or op.startswith("CALL")),
                ex2 + (op == "MUFU.EX2"), length + (op != "NOP"), (i, *path))

    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * len(insns) + 1000))
    try:
        path = best(0)[-1]
    finally:
        sys.setrecursionlimit(limit)
    return [insns[i][1] for i in path if ops[i] != "NOP"]


def phases(path: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(to the thread's pair, the merge, the output): cut at the first SHFL.BFLY and the last MUFU.RCP (1 / s)."""
    ops = [_opcode(t) for t in path]
    a = ops.index("SHFL.BFLY")
    b = max(i for i, o in enumerate(ops) if o == "MUFU.RCP")
    return path[:a], path[a:b], path[b:]


# ---- the compiles (module-scoped: two nvcc runs of about 15 s, in parallel) ----------------------------


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    _tool_or_skip("nvcc")
    cuobjdump = _tool_or_skip("cuobjdump")
    root = tmp_path_factory.mktemp("softmax-draft")
    folder = _tree(root)
    draft = softmax_lineage.load_stage(folder / DRAFT)
    previous = softmax_lineage.load_stage(folder / PREVIOUS)
    out = root / "build"
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda s: build.compile_stage(s, out_dir=out), (previous, draft)))
    facts = {}
    for stage, result in zip((previous, draft), results, strict=True):
        dump = subprocess.run([cuobjdump, "-sass", str(result.library)], check=True, capture_output=True,
                              text=True).stdout
        facts[stage.number] = (result.ptxas_log, _functions(dump))
    return folder, draft, facts


def _ptxas(log: str) -> dict[str, tuple[int, int, int, int]]:
    """function -> (registers, stack, spill stores, spill loads), sm_90a."""
    out = {}
    for m in re.finditer(r"Compiling entry function '(\S+)' for 'sm_90a'\n.*?(\d+) bytes stack frame, (\d+) bytes "
                         r"spill stores, (\d+) bytes spill loads\n.*?Used (\d+) registers", log, re.S):
        out[m.group(1)] = (int(m.group(5)), int(m.group(2)), int(m.group(3)), int(m.group(4)))
    return out


def test_the_draft_moved_in_once():
    """06 ran on the GPU and moved into kernels/softmax/: no copy of it is left among the drafts."""
    assert (DRAFTS / DRAFT / "kernel.cu").is_file()
    assert not (ROOT / "research" / "softmax" / "drafts" / DRAFT).exists()


def test_the_draft_reads_as_the_next_softmax_stage(tmp_path):
    folder = _tree(tmp_path)
    stages = softmax_lineage.discover(folder)
    draft, previous = stages[-1], stages[-2]
    assert draft.dir.name == DRAFT and draft.number == 6 and previous.dir.name == PREVIOUS
    assert softmax_lineage.constant_mismatches(draft) == []
    assert softmax_lineage.config_mismatches(draft) == []
    assert draft.spec.config == previous.spec.config  # stage 05's configurations and launch, kept
    assert draft.spec.launch == previous.spec.launch and draft.spec.row == previous.spec.row
    assert draft.spec.supports == previous.spec.supports and draft.spec.constants == previous.spec.constants
    source = draft.kernel_path.read_text()
    for name in ("hopattn_softmax_launch", "hopattn_softmax_describe"):
        assert f"HOPATTN_EXPORT int {name}(" in source
    assert source.count("check_params(p, err, errlen)") == 2
    assert "ex2.approx.ftz.f32" in source and "__hmax2" in source
    # the launcher below the kernels is stage 05's, unchanged
    launcher = source[source.index("namespace {"):]
    assert launcher == previous.kernel_path.read_text()[previous.kernel_path.read_text().index("namespace {"):]
    notes = draft.notes_path.read_text()
    assert notes.index("## Prediction") < notes.index("## Measured") < notes.index("## What the compiler made of it")
    measured = notes[notes.index("## Measured"):notes.index("## What the compiler made of it")]
    assert "`python -m bench.rowwise_softmax`" in measured and "softmax-bench-nvidia-h200-20261203T0951.log" in measured
    assert "research/softmax/gpu_run.sh" in measured and "ptxas -v" in notes


def test_the_draft_compiles_without_spills_or_remarks(compiled):
    _folder, _draft, facts = compiled
    log5, fns5 = facts[5]
    log6, fns6 = facts[6]
    assert not [line for line in log6.splitlines() if REMARK.search(line)], log6[-3000:]
    ours, theirs = _ptxas(log6), _ptxas(log5)
    assert set(ours) == set(theirs) and len(ours) == 48, sorted(set(ours) ^ set(theirs))  # stage 05's instances
    bad = {n: f for n, f in ours.items() if f[1] or f[2] or f[3]}
    assert not bad, f"stack or spills: {bad}"
    for name, (registers, *_rest) in ours.items():
        if "Li256ELi8ELi1E" in name or "Li1024E" in name:  # four slices an SM; 1024-thread CTAs
            assert registers <= 64, (name, registers)
    assert set(fns6) == set(ours)


def test_the_element_loop_is_leaner_than_stage_05(compiled):
    _folder, _draft, facts = compiled
    counts = {}
    for number in (5, 6):
        path = main_path(facts[number][1][BF16_16K])
        to_pair, _merge, output = phases(path)
        counts[number] = (to_pair, output)
    elements = 8 * 8  # 8 vectors of 8 bf16 a thread
    per_element = {n: (len(a) + len(b)) / elements for n, (a, b) in counts.items()}
    assert per_element[6] < per_element[5], per_element
    assert per_element[5] > 24 and per_element[6] < 14, per_element  # the notes: 26.5 and 13.0
    to_pair, output = counts[6]
    ops = Counter(_opcode(t) for t in to_pair + output)
    assert ops["MUFU.EX2"] == 2 * elements  # one for s, one for y: no rescale a vector
    assert ops["FSETP.GEU.AND"] == 0 and ops["FSEL"] <= 1  # no exp2f range check, no bounds selects
    assert ops["LDG.E.128"] == 8 and ops["STG.E.128"] == 8
    assert any(op.endswith("HMNMX2.BF16_V2") for op in ops)  # the max in packed pairs
    old = Counter(_opcode(t) for t in counts[5][0] + counts[5][1])
    assert old["MUFU.EX2"] > 2 * elements and old["FSETP.GEU.AND"] >= 2 * elements
