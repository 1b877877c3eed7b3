"""Backward stage 08, two dSᵀ tiles, measured on the H200 and kept in research/backward_next/ (correct,
not faster: its notes say why).
Here it is assembled beside the lineage's headers and stages, as it will be when it joins, read as a
stage (its stage.toml checked as the lineage's are, its figures drawn from it), and compiled with the
project's flags (nvcc, no GPU): what its notes say the compiler made of it must stay true — stage
07's gemms, waits and registers, no spills and no ptxas remark on the wgmma pipeline, one named
barrier of the consumers where 07 had two, dQ's A read from the step's tile; the same SASS with and
without the trace points, and the traced build's spills.
Both drafts here are variants of stage 07, numbered 08 as they were drafted; stage 08 of the lineage
(08_mask-select) joined after them. So each is assembled beside the lineage's stages up to 07 only
(`lineage.discover` refuses two stages numbered 08): the lineage as it was when they were drafted."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hopattn import build, cuda_tools, lineage

pytestmark = pytest.mark.nvcc

WAITING = Path(__file__).resolve().parent.parent / "research" / "backward_next"
DRAFT = "08_two-ds-tiles"
PREVIOUS = "07_scores-ahead"
REMARKS = ("C7512", "C7514", "C7517", "C7518", "C7519")  # ptxas serialising or waiting on the wgmmas


def _tree(tmp_path: Path) -> Path:
    """The lineage as it will be: the forward's common/, the backward's common/ (with the drafts'
    headers, if any), the backward stages, and the draft."""
    kernels = tmp_path / "kernels"
    if not (kernels / "attention").is_dir():
        shutil.copytree(lineage.ATTENTION_DIR / "common", kernels / "attention" / "common")
        shutil.copytree(lineage.BACKWARD_DIR / "common", kernels / "attention_backward" / "common")
        if (WAITING / "common").is_dir():
            shutil.copytree(WAITING / "common", kernels / "attention_backward" / "common", dirs_exist_ok=True)
        for stage in _up_to_07():
            shutil.copytree(stage.dir, kernels / "attention_backward" / stage.dir.name)
        shutil.copytree(WAITING / DRAFT, kernels / "attention_backward" / DRAFT)
    return kernels / "attention_backward"


def _up_to_07() -> list[lineage.Stage]:
    """The lineage's stages the drafts were drafted beside: 01 to 07 (stage 08 joined after them)."""
    return [s for s in lineage.discover(lineage.BACKWARD_DIR) if s.number <= 7]


def _draft(tmp_path: Path) -> lineage.Stage:
    return lineage.load_stage(_tree(tmp_path) / DRAFT)


def _tool_or_skip(name: str) -> str:
    try:
        return cuda_tools.require(name)
    except cuda_tools.ToolError as err:
        pytest.skip(str(err))


def _compile(stage: lineage.Stage, kernel: Path, out: Path, traced: bool = False) -> tuple[str, str]:
    """(the main kernel's ptxas report, its SASS) of one compile of ``kernel`` with the stage's flags."""
    nvcc, cuobjdump = _tool_or_skip("nvcc"), _tool_or_skip("cuobjdump")
    flags = [f for f in build.nvcc_flags(stage, traced) if f not in ("-shared", "-Xcompiler=-fPIC,-fvisibility=hidden")]
    run = subprocess.run([nvcc, *flags, "-fatbin", "-o", str(out), str(kernel)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    ptxas = run.stdout + run.stderr
    main = ptxas[ptxas.index("Compiling entry function '_Z11dkdv_kernel"):]
    main = main[:main.index("Compiling entry function", 10)] if "Compiling entry function" in main[10:] else main
    dump = subprocess.run([cuobjdump, "-sass", str(out)], check=True, capture_output=True, text=True).stdout
    dump = dump[dump.index("Function : _Z11dkdv_kernel"):]
    dump = dump[:dump.index("Function :", 10)] if "Function :" in dump[10:] else dump
    # one instruction a line, without its address and encoding
    sass = [re.sub(r"^\s+/\*[0-9a-f]{4,}\*/\s*", "", line).split(";")[0].strip() for line in dump.splitlines()
            if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]
    # the remarks ptxas prints about the whole compile (they name the function they are about)
    remarks = "\n".join(line for line in ptxas.splitlines() if "dkdv_kernel" in line and "Potential" in line)
    return main + remarks, "\n".join(sass)


def test_the_draft_reads_as_the_next_backward_stage(tmp_path):
    stages = _up_to_07()
    last = stages[-1]
    eight = _draft(tmp_path)
    seven = next(s for s in stages if s.dir.name == PREVIOUS)
    assert last.dir.name == PREVIOUS and eight.number == last.number + 1 == 8
    assert (eight.block_m, eight.block_n, eight.head_dim) == (64, 128, 128) and eight.deterministic
    notes = (eight.dir / "notes.md").read_text()  # measured on the H200, and kept out of the lineage
    assert "**It is correct, and it is not faster: it does not join the lineage.**" in notes
    assert "438 passed, 15 skipped" in notes and (eight.dir / "traces" / "08.json").is_file()
    # stage 07's roles, order and pictures' keys; the one change in the buffers is a second dSᵀ tile
    assert eight.threads == seven.threads == 384
    assert [(r.name, r.warps, r.registers) for r in eight.roles] == [(r.name, r.warps, r.registers) for r in seven.roles]
    assert eight.roles[0] == seven.roles[0]  # the producer, tasks and all
    assert eight.diagram == seven.diagram and [o.op for o in eight.schedule] == [o.op for o in seven.schedule]
    changed = [(a.name, a.buffers, b.buffers) for a, b in zip(eight.smem, seven.smem, strict=True) if a != b]
    assert [(name, new) for name, new, _ in changed] == [("dS", 2)], changed
    assert eight.smem_bytes == seven.smem_bytes + 128 * 64 * 2 == 230508 <= 227 * 1024
    consumer = " ".join(eight.roles[1].tasks)
    assert "dSᵀ free" not in consumer and "tile step % 2" in consumer


def test_the_draft_s_figures_draw(tmp_path):
    from site_gen.diagrams.backward import backward_diagrams

    folder = _tree(tmp_path)
    stages = lineage.discover(folder)
    assert stages[-1].dir.name == DRAFT
    figures = backward_diagrams(stages[-1], stages)
    assert len(figures) == 4


def test_the_draft_compiles_as_its_notes_say(tmp_path):
    stage = _draft(tmp_path)
    ptxas, sass = _compile(stage, stage.kernel_path, tmp_path / "draft.fatbin")
    for remark in REMARKS:
        assert remark not in ptxas, f"ptxas serialised or waited on the wgmmas: {ptxas}"
    assert "0 bytes spill stores, 0 bytes spill loads" in ptxas, ptxas
    assert int(re.search(r"Used (\d+) registers", ptxas).group(1)) == 168  # 65536 / 384 at launch
    assert re.search(r"USETMAXREG\.DEALLOC\.CTAPOOL\s+0x18\b", sass)  # the producer: 24 registers
    assert re.search(r"USETMAXREG\.TRY_ALLOC\.CTAPOOL\s+\w+,\s*0xf0\b", sass)  # the consumers: 240
    # three copies of parts of a step: the prologue (Sᵀ, dPᵀ), the loop (all five), the last step (dV, dK, dQ)
    assert sass.count("HGMMA.64x64x16") == 48 and sass.count("HGMMA.64x128x16") == 16
    assert sass.count("WARPGROUP.ARRIVE") == 8
    assert sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") == 5 and sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x0") == 3
    assert sass.count("MUFU.EX2") == 64 and sass.count("STS.128") == 16
    # the change: one named barrier of the consumers (in the loop and in the peeled last step), not two
    assert sass.count("BAR.SYNC.DEFER_BLOCKING 0x1, 0x100") == 2 and "BAR.SYNC.DEFER_BLOCKING 0x2" not in sass
    assert sass.count("BAR.SYNC") == 3 and "used 2 barriers" in ptxas
    assert sass.count("UBLKRED.G.S.ADD.F32") == 1 and "REDG.E.ADD.F32" not in sass
    assert "NANOSLEEP" in sass and "REDG.E.ADD.S32.STRONG.GPU" in sass  # the deterministic turns (stage 05's)
    assert len(sass.splitlines()) == 3016  # stage 07: 3000; the tile's address, step % 2

    # The idea, in the loop's SASS: between a dQ product (dSᵀ read transposed) and the stores of its
    # share, the next step's Sᵀ (K-major operands) and a wait that leaves one group in flight; after
    # the stores, dPᵀ. The last step's copy stores after a wait for everything.
    lines = sass.splitlines()
    runs = [i for i, line in enumerate(lines) if line.startswith("STS.128") and not lines[i - 1].startswith("STS.128")
            and not lines[i - 2].startswith("STS.128")]
    runs = [i for i in runs if sum(1 for line in lines[i:i + 20] if line.startswith("STS.128")) == 8]
    assert len(runs) == 2, runs

    def gemms_before(i):
        return [line for line in lines[:i] if "HGMMA" in line or "WARPGROUP.DEPBAR" in line]

    loop, last = gemms_before(runs[0]), gemms_before(runs[1])
    # dQ's last k-step, the wait<1> for dV and dK, the next step's Sᵀ (8 k-steps), the wait<1> for dQ
    assert "HGMMA.64x64x16" in loop[-11] and "tnspA" in loop[-11] and loop[-10].endswith("gsb0, 0x1"), loop[-12:]
    assert all("HGMMA.64x64x16" in line and "tnspA" not in line for line in loop[-9:-1]), loop[-9:]
    assert loop[-1].endswith("gsb0, 0x1"), loop[-3:]
    after = [line for line in lines[runs[0]:] if "HGMMA" in line][:8]
    assert all("HGMMA.64x64x16" in line and "tnspA" not in line for line in after)  # dPᵀ of the next step
    assert "tnspA" in last[-3] and last[-1].endswith("gsb0, 0x0") and last[-2].endswith("gsb0, 0x1"), last[-3:]


def test_the_trace_points_leave_the_sass_alone_and_the_traced_build_records(tmp_path):
    from test_trace_points import without_trace_points

    stage = _draft(tmp_path)
    source = stage.kernel_path.read_text()
    assert '#include "../common/trace_backward.cuh"' in source and "TRACE_END(qk, 0, step);" in source
    stripped = stage.dir.parent / f"{DRAFT}-without" / "kernel.cu"
    stripped.parent.mkdir()
    stripped.write_text(without_trace_points(source))
    with_points = _compile(stage, stage.kernel_path, tmp_path / "with.fatbin")[1]
    assert with_points == _compile(stage, stripped, tmp_path / "without.fatbin")[1]
    ptxas, sass = _compile(stage, stage.kernel_path, tmp_path / "traced.fatbin", traced=True)
    for remark in REMARKS:
        assert remark not in ptxas, f"the traced build serialised or waited on the wgmmas: {ptxas}"
    assert int(re.search(r"(\d+) bytes spill stores", ptxas).group(1)) == 36  # as stage 07's traced build
    assert "CS2R" in sass and "STG.E.128" in sass  # the clock reads and the 16-byte rows
    assert sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") == 5 and sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x0") == 3


# --- the diagnostic draft: stage 07 with the load warp on warp 3 ------------------------------------

DIAGNOSTIC = "08_load-warp-3"


def _diagnostic(tmp_path: Path) -> lineage.Stage:
    """The diagnostic assembled as gpu_run.sh assembled it when it was drafted: the lineage up to stage 07,
    the draft as stage 08."""
    kernels = tmp_path / "kernels"
    shutil.copytree(lineage.ATTENTION_DIR / "common", kernels / "attention" / "common")
    shutil.copytree(lineage.BACKWARD_DIR / "common", kernels / "attention_backward" / "common")
    for stage in _up_to_07():
        shutil.copytree(stage.dir, kernels / "attention_backward" / stage.dir.name)
    shutil.copytree(WAITING / DIAGNOSTIC, kernels / "attention_backward" / DIAGNOSTIC)
    return lineage.load_stage(kernels / "attention_backward" / DIAGNOSTIC)


def test_the_diagnostic_is_stage_07_with_the_load_warp_moved(tmp_path):
    diag = _diagnostic(tmp_path)
    seven = next(s for s in lineage.discover(lineage.BACKWARD_DIR) if s.dir.name == PREVIOUS)
    assert diag.number == 8 and diag.smem == seven.smem and diag.schedule == seven.schedule
    assert [(r.name, r.warps, r.registers) for r in diag.roles] == [(r.name, r.warps, r.registers) for r in seven.roles]
    assert diag.roles[0].tasks[0].startswith("warp 3, one thread") and diag.roles[1] == seven.roles[1]
    # the source is 07's but for comments and the load warp's index
    def code(path, edits=()):
        lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("//")]
        for old, new in edits:
            lines = [line.replace(old, new) for line in lines]
        return lines

    ours = code(diag.kernel_path, [("warp == LOAD_WARP", "warp == 0")])
    assert ours.count("constexpr int LOAD_WARP = 3;        // the producer's load warp (stage 07: warp 0)") == 1
    assert [line for line in ours if "LOAD_WARP" not in line] == code(seven.kernel_path)
    assert "## Measured\n\nNot measured yet" in (diag.dir / "notes.md").read_text()


def test_the_diagnostic_compiles_as_stage_07_does(tmp_path):
    diag = _diagnostic(tmp_path)
    ptxas, sass = _compile(diag, diag.kernel_path, tmp_path / "diag.fatbin")
    for remark in REMARKS:
        assert remark not in ptxas, ptxas
    assert "0 bytes spill stores, 0 bytes spill loads" in ptxas
    assert int(re.search(r"Used (\d+) registers", ptxas).group(1)) == 168
    assert sass.count("HGMMA.64x64x16") == 48 and sass.count("HGMMA.64x128x16") == 16
    assert sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") == 5 and sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x0") == 3
    assert sass.count("BAR.SYNC") == 5 and len(sass.splitlines()) == 3000  # stage 07's
