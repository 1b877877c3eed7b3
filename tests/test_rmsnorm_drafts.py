"""RMSNorm forward stage 06, half-size CTAs for the long rows, drafted in research/rmsnorm/drafts/ before
its GPU run (research/rmsnorm/drafts/README.md); these checks follow it when it moves into kernels/rmsnorm/.

Here it is assembled beside the lineage's common/ and stages 01-05, as kernels/rmsnorm will be once it
joins; read as a stage there (its stage.toml and [constants] checked as the lineage's are, its [[config]]
against its launcher); and compiled with the project's flags next to stage 05 (nvcc, no GPU): no stack, no
spills and no ptxas remark; the instances stage 05 launches below 64k bf16 columns, and its clusters of
eight 1024-thread CTAs, compile to stage 05's SASS instruction for instruction (4k-32k and 256k-512k bf16
are stage 05's code); the new slices (512 threads x 8 vectors, clusters of 2, 4, 8: 64k, 128k, 256k bf16
columns) compile to at most 64 registers, so two share an SM where stage 05's 1024-thread CTAs of 56-64
registers had one; and the slices' whole-row path (counted as tests/test_softmax_drafts.py counts it: from
the entry to an EXIT with the most 16-byte accesses, the fewest element accesses, then the fewest
instructions) is no longer than that of the stage-05 instance it replaces: bf16 843 -> 835 at 64k
(13.17 -> 13.05 an element), 861 -> 844 at 256k (13.45 -> 13.19)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hopattn import build, cuda_tools, rowwise
from test_softmax_drafts import REMARK, _functions, _opcode, _ptxas, main_path

pytestmark = pytest.mark.nvcc

ROOT = Path(__file__).resolve().parent.parent
DRAFT = "06_half-ctas-for-long-rows"
PREVIOUS = "05_cluster-rows"
WAITING = ROOT / "research" / "rmsnorm" / "drafts" / DRAFT  # until its GPU run
JOINED = rowwise.RMSNORM_DIR / DRAFT                        # after it
SIGNATURE = "Ev13RmsNormParams"
BF16, FP16, FP32 = "13__nv_bfloat16", "6__half", "f"
PER_VECTOR = {BF16: 8, FP16: 8, FP32: 4}


def _rows(dtype: str, threads: int, vectors: int, rows: int, cluster: int) -> str:
    return f"_Z12rmsnorm_rowsI{dtype}Li{threads}ELi{vectors}ELi{rows}ELi{cluster}E{SIGNATURE}"


# The bench's long rows (bf16): stage 05's instance -> this stage's.
LONG = {"64k": ((1024, 8, 1, 1), (512, 8, 1, 2)), "128k": ((1024, 8, 1, 2), (512, 8, 1, 4)),
        "256k": ((1024, 8, 1, 4), (512, 8, 1, 8))}


def _tool_or_skip(name: str) -> str:
    try:
        return cuda_tools.require(name)
    except cuda_tools.ToolError as err:
        pytest.skip(str(err))


def _draft_dir() -> Path:
    """The draft: waiting in research/rmsnorm/drafts/, or joined kernels/rmsnorm/ (once)."""
    places = [p for p in (WAITING, JOINED) if (p / "kernel.cu").is_file()]
    assert len(places) == 1, f"the draft must be in exactly one of {WAITING} and {JOINED}: {places}"
    return places[0]


def _tree(root: Path) -> Path:
    """kernels/rmsnorm as it will be: common/, stages 01-05 and the draft as stage 06."""
    folder = root / "kernels" / "rmsnorm"
    shutil.copytree(rowwise.RMSNORM_DIR / "common", folder / "common")
    for stage in rowwise.discover():
        if stage.number <= 5:
            shutil.copytree(stage.dir, folder / stage.dir.name)
    shutil.copytree(_draft_dir(), folder / DRAFT)
    return folder


def test_the_draft_is_in_one_place_and_the_lineage_sees_it_only_there():
    """Waiting, the default op (the lineage's newest stage) is still 05 and no GPU test runs 06."""
    draft = _draft_dir()
    numbers = [s.number for s in rowwise.discover()]
    assert (6 in numbers) == (draft == JOINED), numbers


def test_the_draft_reads_as_the_next_rmsnorm_stage(tmp_path):
    folder = _tree(tmp_path)
    stages = rowwise.discover(folder)
    draft, previous = stages[-1], stages[-2]
    assert draft.dir.name == DRAFT and draft.number == 6 and previous.dir.name == PREVIOUS
    assert draft.lineage == "rmsnorm"
    assert rowwise.constant_mismatches(draft) == []
    assert rowwise.config_mismatches(draft) == []
    # stage 05's launch, row and contract, and its constants with two more
    assert draft.spec.launch == previous.spec.launch and draft.spec.row == previous.spec.row
    assert draft.spec.supports == previous.spec.supports
    assert draft.spec.constants == {**previous.spec.constants, "kSliceThreads": 512, "kSmThreads": 1024}
    # stage 05's configurations up to 32k bf16 columns and past 256k; the slices between
    new, old = draft.spec.config, previous.spec.config
    assert new[:8] == old[:8] and new[-2:] == old[-2:]
    assert [(c.threads_per_row, c.vectors, c.cluster) for c in new[8:-2]] == [(512, 8, 2), (512, 8, 4), (512, 8, 8)]
    for cols in (4096, 8192, 16384, 32768, 262144 + 8, 524288, 524289):
        assert draft.spec.config_for(cols) == previous.spec.config_for(cols), cols
    for cols, cluster in ((32769, 2), (65536, 2), (65537, 4), (131072, 4), (131073, 8), (262144, 8)):
        for columns, size in ((cols, 2), ((cols + 1) // 2, 4)):  # bf16 / fp16, and fp32 at half the columns
            c = draft.spec.config_for(columns, size)
            assert (c.threads_per_row, c.vectors, c.cluster) == (512, 8, cluster), (columns, size)
    source = draft.kernel_path.read_text()
    for name in ("hopattn_rmsnorm_launch", "hopattn_rmsnorm_describe"):
        assert f"HOPATTN_EXPORT int {name}(" in source
    assert source.count("rms_check_params(p, err, errlen)") == 2
    assert "__launch_bounds__(kThreadsPerRow * kRows, kSliceBound<kThreadsPerRow, kCluster>)" in source
    # the kernel's body, stage 03's kernels and the launch below with_config are stage 05's, unchanged
    old_source = previous.kernel_path.read_text()
    body = "    static_assert(kCluster == 1 || kRows == 1"
    end = "\nnamespace {\n"
    assert source[source.index(body):source.index(end)] == old_source[old_source.index(body):old_source.index(end)]
    after = "\n// Whether every row of x and out"
    assert source[source.index(after):] == old_source[old_source.index(after):]
    two_pass = "__device__ __forceinline__ float warp_sum"
    kept = "\n// The vector of T at column c"
    assert source[source.index(two_pass):source.index(kept)] == \
        old_source[old_source.index(two_pass):old_source.index(kept)]
    notes = draft.notes_path.read_text()
    assert notes.index("## Prediction") < notes.index("## Measured") < notes.index("## What the compiler made of it")
    measured = notes[notes.index("## Measured"):notes.index("## What the compiler made of it")]
    assert "research/rmsnorm/gpu_run.sh" in measured and "python -m bench.rowwise" in measured
    if draft.dir == WAITING:  # before its GPU run: the commands, no log
        assert "**Not measured yet.**" in measured and not re.search(r"`bench/logs/[^`]+\.log`", measured)
    assert "ptxas -v" in notes


# ---- the compiles (module-scoped: two nvcc runs of about 15 s, in parallel) ----------------------------


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    _tool_or_skip("nvcc")
    cuobjdump = _tool_or_skip("cuobjdump")
    root = tmp_path_factory.mktemp("rmsnorm-draft")
    folder = _tree(root)
    stages = [rowwise.load_stage(folder / name) for name in (PREVIOUS, DRAFT)]
    out = root / "build"
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda s: build.compile_stage(s, out_dir=out), stages))
    facts = {}
    for stage, result in zip(stages, results, strict=True):
        dump = subprocess.run([cuobjdump, "-sass", str(result.library)], check=True, capture_output=True,
                              text=True).stdout
        facts[stage.number] = (result.ptxas_log, _functions(dump))
    return facts


def _instances(threads_clusters) -> set[str]:
    return {_rows(d, t, 8, 1, c) for d in (BF16, FP16, FP32) for t, c in threads_clusters}


@pytest.mark.slow
def test_the_draft_compiles_two_slices_an_sm_without_spills_or_remarks(compiled):
    log5, fns5 = compiled[5]
    log6, fns6 = compiled[6]
    assert not [line for line in log6.splitlines() if REMARK.search(line)], log6[-3000:]
    ours, theirs = _ptxas(log6), _ptxas(log5)
    assert len(ours) == len(theirs) == 48
    bad = {n: f for n, f in ours.items() if f[1] or f[2] or f[3]}
    assert not bad, f"stack or spills: {bad}"
    gone = _instances([(1024, 1), (1024, 2), (1024, 4)])  # stage 05's 64k and 128k-256k CTAs
    slices = _instances([(512, 2), (512, 4), (512, 8)])   # this stage's
    assert set(theirs) - set(ours) == gone and set(ours) - set(theirs) == slices
    # every instance both stages have compiles to the same registers and the same SASS
    kept = set(ours) & set(theirs)
    assert len(kept) == 39
    for n in kept:
        assert ours[n] == theirs[n], (n, ours[n], theirs[n])
        assert [t for _, t in fns6[n]] == [t for _, t in fns5[n]], n
    # two slices an SM: 512 threads x at most 64 registers is half an SM's 65536; stage 05's CTAs, one
    regs = {n: ours[n][0] for n in slices}
    assert max(regs.values()) <= 64, regs
    assert regs[_rows(BF16, 512, 8, 1, 2)] == 64 and regs[_rows(FP32, 512, 8, 1, 8)] == 58, regs  # the notes
    for n in gone:
        assert theirs[n][0] * 1024 > 65536 // 2, (n, theirs[n])
    assert set(fns6) == set(ours)


@pytest.mark.slow
def test_the_slices_whole_row_path_is_no_longer_than_stage_05s(compiled):
    fns5, fns6 = compiled[5][1], compiled[6][1]
    counts = {}
    for dtype, per_vector in PER_VECTOR.items():
        for size, (old, new) in LONG.items():
            elements = 8 * per_vector
            path5 = main_path(fns5[_rows(dtype, *old)])
            path6 = main_path(fns6[_rows(dtype, *new)])
            counts[dtype, size] = (len(path5), len(path6))
            assert len(path6) <= len(path5), (dtype, size, len(path5), len(path6))
            for path in (path5, path6):  # a whole thread: its 8 vectors of x and of weight, 8 stores, 16 bytes each
                ops = Counter(_opcode(t) for t in path)
                assert ops["LDG.E.128"] == 16 and ops["STG.E.128"] == 8, (dtype, size, ops)
                assert not [op for op in ops if re.match(r"^(LDG|STG)\.E\.(U16|S16|U8)$", op)]
            assert len(path6) / elements < 14, (dtype, size, len(path6) / elements)
    assert counts[BF16, "64k"] == (843, 835) and counts[BF16, "256k"] == (861, 844), counts  # the notes
