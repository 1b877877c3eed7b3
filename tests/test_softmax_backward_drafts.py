"""Softmax backward stage 03, a lean element loop, drafted in research/softmax_backward/drafts/ before its
GPU run (research/softmax_backward/drafts/README.md) and, after it (2026-12-03T1229), moved into
kernels/softmax_backward/03_lean-element-loop/: these checks of the draft stay, without a GPU.

Here it is assembled beside the forward's common/ (the ABI), the RMSNorm headers and the backward's stages
01 and 02, as kernels/softmax_backward will be once it joins; read as a stage there (its stage.toml and
[constants] checked as the lineage's are, its [[config]] against its launcher, which is stage 02's byte for
byte); and compiled with the project's flags next to stage 02 (nvcc, no GPU): every instance of stage 02,
no stack, no spills and no ptxas remark, every row kernel within 32 registers (two 1024-thread CTAs an
SM), and fewer SASS instructions an element on the path a thread of a whole row takes (counted as
tests/test_softmax_drafts.py counts them: the path from the entry to an EXIT with the most 16-byte
accesses, the fewest element accesses, then the fewest instructions). The numbers the draft's notes
quote, bf16, a thread of the 16k instance (1024 threads x 2 vectors, 16 elements): 267 -> 215
instructions, 16.7 -> 13.4 an element; the 4k instance 239 -> 215, the 64k and 256k clusters 281 -> 245
and 295 -> 249."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hopattn import build, cuda_tools, lineage, softmax_lineage
from test_softmax_drafts import REMARK, _functions, _opcode, _ptxas, main_path

pytestmark = pytest.mark.nvcc

ROOT = Path(__file__).resolve().parent.parent
DRAFT = "03_lean-element-loop"
PREVIOUS = "02_row-in-registers"
WAITING = ROOT / "research" / "softmax_backward" / "drafts" / DRAFT  # until its GPU run
JOINED = softmax_lineage.SOFTMAX_BACKWARD_DIR / DRAFT                 # after it
SIGNATURE = "Ev21SoftmaxBackwardParams"


def _rows(dtype: str, threads: int, vectors: int, rows: int, cluster: int) -> str:
    return f"_Z16softmax_bwd_rowsI{dtype}Li{threads}ELi{vectors}ELi{rows}ELi{cluster}E{SIGNATURE}"


BF16, FP16, FP32 = "13__nv_bfloat16", "6__half", "f"
# The instances of the bench's lengths (bf16): 4k, 16k, 64k (clusters of 4), 256k (clusters of 16).
LENGTHS = {"4k": (256, 2, 1, 1), "16k": (1024, 2, 1, 1), "64k": (1024, 2, 1, 4), "256k": (1024, 2, 1, 16)}


def _tool_or_skip(name: str) -> str:
    try:
        return cuda_tools.require(name)
    except cuda_tools.ToolError as err:
        pytest.skip(str(err))


def _draft_dir() -> Path:
    """The draft: waiting in research/softmax_backward/drafts/, or joined kernels/softmax_backward/ (once)."""
    places = [p for p in (WAITING, JOINED) if (p / "kernel.cu").is_file()]
    assert len(places) == 1, f"the draft must be in exactly one of {WAITING} and {JOINED}: {places}"
    return places[0]


def _tree(root: Path) -> Path:
    """kernels/softmax_backward as it will be: stages 01 and 02 and the draft, beside the forward's common/
    (abi_softmax.h) and the RMSNorm headers they include."""
    kernels = root / "kernels"
    shutil.copytree(softmax_lineage.SOFTMAX_DIR / "common", kernels / "softmax" / "common")
    shutil.copytree(lineage.RMSNORM_DIR / "common", kernels / "rmsnorm" / "common")
    for stage in softmax_lineage.discover_backward():
        if stage.number <= 2:
            shutil.copytree(stage.dir, kernels / "softmax_backward" / stage.dir.name)
    shutil.copytree(_draft_dir(), kernels / "softmax_backward" / DRAFT)
    return kernels / "softmax_backward"


def test_the_draft_is_in_one_place_and_the_lineage_sees_it_only_there():
    """Waiting, the default backward op (the lineage's newest stage) is still 02 and no GPU test runs 03."""
    draft = _draft_dir()
    numbers = [s.number for s in softmax_lineage.discover_backward()]
    assert (3 in numbers) == (draft == JOINED), numbers


def test_the_draft_reads_as_the_next_backward_stage(tmp_path):
    folder = _tree(tmp_path)
    stages = softmax_lineage.discover(folder)
    draft, previous = stages[-1], stages[-2]
    assert draft.dir.name == DRAFT and draft.number == 3 and previous.dir.name == PREVIOUS
    assert draft.lineage == "softmax_backward" and draft.spec.supports.backward
    assert softmax_lineage.constant_mismatches(draft) == []
    assert softmax_lineage.config_mismatches(draft) == []
    # stage 02's configurations, launch, row and contract, and its constants with one more
    assert draft.spec.config == previous.spec.config
    assert draft.spec.launch == previous.spec.launch and draft.spec.row == previous.spec.row
    assert draft.spec.supports == previous.spec.supports
    assert draft.spec.constants == {**previous.spec.constants, "kSmThreads": 2048}
    source = draft.kernel_path.read_text()
    for name in ("hopattn_softmax_backward_launch", "hopattn_softmax_backward_describe"):
        assert f"HOPATTN_EXPORT int {name}(" in source
    assert source.count("check_params(p, err, errlen)") == 2
    assert "__launch_bounds__(kThreadsPerRow * kRows, kSmThreads / (kThreadsPerRow * kRows))" in source
    # the launcher below the kernels is stage 02's, unchanged; stage 01's kernel above it too
    old = previous.kernel_path.read_text()
    launcher = "\nnamespace {\n"
    assert source[source.index(launcher):] == old[old.index(launcher):]
    fallback = re.compile(r"template <typename T, int kVec, int kThreadsPerRow>\n__global__.*?\n}\n", re.S)
    assert fallback.search(source).group(0) == fallback.search(old).group(0)
    notes = draft.notes_path.read_text()
    assert notes.index("## The idea") < notes.index("## Prediction") < notes.index("## Measured") \
        < notes.index("## What the compiler made of it")
    measured = notes[notes.index("## Measured"):notes.index("## What the compiler made of it")]
    assert "`python -m bench.rowwise_softmax`" in measured and "research/softmax/gpu_run.sh" in measured
    if draft.dir == WAITING:  # before its GPU run: the commands, no log
        assert "**Not measured yet.**" in measured and not re.search(r"`bench/logs/[^`]+\.log`", measured)
        assert "--direction backward --stages 2-3" in measured
    else:  # joined after the run of 2026-12-03T1229: the run's logs (tests/test_part_ii_notes.py checks the rows)
        assert "**Not measured yet.**" not in measured and "--direction backward --stages 1-3" in measured
    assert "ptxas -v" in notes


# ---- the compiles (module-scoped: two nvcc runs of about 8 s, in parallel) ------------------------------


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    _tool_or_skip("nvcc")
    cuobjdump = _tool_or_skip("cuobjdump")
    root = tmp_path_factory.mktemp("softmax-backward-draft")
    folder = _tree(root)
    stages = [softmax_lineage.load_stage(folder / name) for name in (PREVIOUS, DRAFT)]
    out = root / "build"
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda s: build.compile_stage(s, out_dir=out), stages))
    facts = {}
    for stage, result in zip(stages, results, strict=True):
        dump = subprocess.run([cuobjdump, "-sass", str(result.library)], check=True, capture_output=True,
                              text=True).stdout
        facts[stage.number] = (result.ptxas_log, _functions(dump))
    return facts


def _per_element(fns: dict, name: str, elements: int) -> tuple[float, list[str]]:
    path = main_path(fns[name])
    return len(path) / elements, path


@pytest.mark.slow
def test_the_draft_compiles_within_32_registers_without_spills_or_remarks(compiled):
    log2, _fns2 = compiled[2]
    log3, fns3 = compiled[3]
    assert not [line for line in log3.splitlines() if REMARK.search(line)], log3[-3000:]
    ours, theirs = _ptxas(log3), _ptxas(log2)
    assert set(ours) == set(theirs) and len(ours) == 45, sorted(set(ours) ^ set(theirs))  # stage 02's instances
    bad = {n: f for n, f in ours.items() if f[1] or f[2] or f[3]}
    assert not bad, f"stack or spills: {bad}"
    rows = {n: f[0] for n, f in ours.items() if "softmax_bwd_rows" in n}
    assert len(rows) == 33 and max(rows.values()) <= 32, rows  # kSmThreads / CTA threads CTAs an SM
    for n, f in ours.items():  # stage 01's kernels, unchanged
        if "softmax_bwd_two_passes" in n:
            assert f == theirs[n], (n, f, theirs[n])
    # stage 02 kept its 1024-thread CTAs above 32 registers (one an SM): what this stage changes
    assert theirs[_rows(BF16, 1024, 2, 1, 1)][0] > 32 and theirs[_rows(BF16, 1024, 2, 1, 16)][0] > 32
    assert set(fns3) == set(ours)


@pytest.mark.slow
def test_the_whole_row_path_is_leaner_than_stage_02(compiled):
    fns2, fns3 = compiled[2][1], compiled[3][1]
    counts = {}
    for dtype, per_vector in ((BF16, 8), (FP16, 8), (FP32, 4)):
        for size, (threads, vectors, rows, cluster) in LENGTHS.items():
            name = _rows(dtype, threads, vectors, rows, cluster)
            elements = vectors * per_vector
            counts[dtype, size] = (_per_element(fns2, name, elements)[0], _per_element(fns3, name, elements)[0])
    for (dtype, size), (old, new) in counts.items():
        if (dtype, size) == (FP16, "4k"):  # fp16's re-conversion after the reduction: +7 of 224, for 49 -> 32 registers
            assert new < old + 0.5, (dtype, size, old, new)
        else:
            assert new < old, (dtype, size, old, new)
    old, new = counts[BF16, "16k"]
    assert old > 16 and new < 14, (old, new)  # the notes: 16.7 and 13.4 (267 and 215 instructions)

    # the 16k bf16 instance's whole path: 16-byte accesses with nothing element-wise, one unpack an element
    _, path = _per_element(fns3, _rows(BF16, 1024, 2, 1, 1), 16)
    ops = Counter(_opcode(t) for t in path)
    assert ops["LDG.E.128"] == 4 and ops["STG.E.128"] == 2
    assert not [op for op in ops if re.match(r"^(LDG|STG)\.E\.(U16|S16|U8)$", op)]
    assert ops["FFMA"] == 16 and ops["FMUL"] == 16  # the dot; dx's products
    assert sum("PRMT" in t and ("0x1044" in t or "0x3244" in t) for t in path) == 32  # dx's unpack, after the reduction
    assert ops["LDS"] == 1 and ops["LDS.128"] == 0 and ops["SHFL.BFLY"] == 10  # the warps' sums a lane each
    _, old_path = _per_element(fns2, _rows(BF16, 1024, 2, 1, 1), 16)
    old_ops = Counter(_opcode(t) for t in old_path)
    assert old_ops["LDS.128"] == 8 and old_ops["SHFL.BFLY"] == 5  # stage 02: every thread adds the 32 sums
