"""Trace points vanish without -DHOPATTN_TRACE: each stage compiles to the same SASS as the same
source with its trace points deleted, and the traced build compiles (common/trace.cuh, common/trace_recorder.cuh).
The backward's too (kernels/attention_backward/common/trace_backward.cuh, recorded by its
trace_recorder_backward.cuh): the stages with trace points, 03 to 11, copied with the lineage's
headers into a temporary tree (beside which their stripped copies are written), with and without
their trace points; and their traced builds compile with the recorder's clock reads and rows,
without a wait injected on the wgmmas in flight."""

from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import pytest
from hopattn import build, lineage

pytestmark = pytest.mark.nvcc

STAGES = lineage.discover()
TRACE_LINE = re.compile(r"^\s*TRACE_(INIT|BEGIN|END|MARK)\(.*\);\s*$")
TRACE_USE = re.compile(r"\bTRACE_(INIT|BEGIN|END|MARK|PARAM|ARG)\b")
# The backward's: a function's trace state, after its last parameter and its call's last argument.
TRACE_ARGS = re.compile(r"\s*\bTRACE_(PARAM|ARG)\b")
INCLUDE = '#include "../common/trace.cuh"'
BACKWARD_INCLUDE = '#include "../common/trace_backward.cuh"'
TRACED_STAGES = ("03_wgmma", "04_dq-bulk-reduce", "05_ordered-dq", "06_warp-specialized", "07_scores-ahead",
                 "08_mask-select", "09_out-of-phase", "10_heavy-first", "11_dq-rows")
# The traced builds' spills (ptxas, the main kernel): stage 05 runs at 255 registers without them, and
# the warp's three registers of trace state (next row, end, kinds) push 16 bytes out, reloaded once a
# step on the TMA-issuing thread's path; stage 06's producer at 24 registers spills 8 bytes in its dQ
# warps' loop; stage 07's, 36 bytes (the producer at 24 registers and two words of the kernel's start);
# stage 08's, 8 bytes (its softmax's loops, without their branches, leave the consumers' registers the room
# 07's lacked); stage 09's, 10's and 11's, 8 bytes too. No other backward stage spills.
TRACED_SPILLS = {"03_wgmma": 0, "04_dq-bulk-reduce": 0, "05_ordered-dq": 16, "06_warp-specialized": 8,
                 "07_scores-ahead": 36, "08_mask-select": 8, "09_out-of-phase": 8,
                 "10_heavy-first": 8, "11_dq-rows": 8}


def _nvcc_or_skip() -> str:
    try:
        return build.nvcc()
    except build.BuildError as err:
        pytest.skip(str(err))


def without_trace_points(source: str) -> str:
    """The source with every trace point (a statement on a line of its own; the backward's TRACE_PARAM
    and TRACE_ARG, wherever they are) and the include removed."""
    kept = [TRACE_ARGS.sub("", line) for line in source.splitlines()
            if not TRACE_LINE.match(line) and line.strip() not in (INCLUDE, BACKWARD_INCLUDE)]
    leftover = [line for line in kept if TRACE_USE.search(line)]
    assert not leftover, f"trace points must be statements on lines of their own: {leftover[:3]}"
    return "\n".join(kept) + "\n"


def _sass(stage: lineage.Stage, source: str, tmp, tag: str, defines=()) -> str:
    folder = tmp / tag / "attention" / stage.dir.name
    folder.mkdir(parents=True)
    (folder.parent / "common").symlink_to(lineage.ATTENTION_DIR / "common")
    (folder / "kernel.cu").write_text(source)
    # A fatbin, not a cubin: the sm_80 stages are built for two targets (sm_90a and sm_80), and nvcc
    # writes one cubin only for one; cuobjdump dumps the SASS of every target in the fatbin.
    fatbin = folder / "kernel.fatbin"
    flags = [f for f in build.nvcc_flags(stage) if f not in ("-shared", "-Xcompiler=-fPIC,-fvisibility=hidden")]
    subprocess.run([build.nvcc(), *flags, *defines, "-fatbin", "-o", str(fatbin), str(folder / "kernel.cu")],
                   check=True, capture_output=True, text=True)
    dump = subprocess.run([_cuobjdump(), "-sass", str(fatbin)], check=True, capture_output=True, text=True).stdout
    return "\n".join(line for line in dump.splitlines() if "/*" in line)  # the instructions and their encodings


@lru_cache(maxsize=1)
def _cuobjdump() -> str:
    from pathlib import Path

    for candidate in (Path(build.nvcc()).with_name("cuobjdump"),):
        if candidate.is_file():
            return str(candidate)
    try:
        import nvidia.cu13  # pip: nvidia-cuda-cuobjdump

        return str(Path(nvidia.cu13.__path__[0]) / "bin" / "cuobjdump")
    except ImportError:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")


@pytest.mark.slow
def test_every_stage_compiles_to_the_same_sass_with_and_without_trace_points(tmp_path):
    _nvcc_or_skip()
    traced = [s for s in STAGES if INCLUDE in s.kernel_path.read_text()]
    assert traced, "no stage has trace points"

    def compare(stage):
        source = stage.kernel_path.read_text()
        with_points = _sass(stage, source, tmp_path, f"{stage.id}-with")
        stripped = _sass(stage, without_trace_points(source), tmp_path, f"{stage.id}-without")
        return stage.name, with_points == stripped, with_points.count("\n")

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(compare, traced))
    differ = [name for name, same, _ in results if not same]
    assert not differ, f"trace points changed the machine code of {differ}"
    assert all(lines > 100 for _, _, lines in results)


def test_the_stripping_rule_refuses_trace_points_inside_other_statements():
    assert without_trace_points("a();\n    TRACE_MARK(load_q, 0, -1);\nb();\n") == "a();\nb();\n"
    with pytest.raises(AssertionError, match="lines of their own"):
        without_trace_points("if (x) TRACE_MARK(load_q, 0, -1);\n")


def test_the_stripping_rule_takes_the_backward_s_parameters_out():
    src = ("__device__ void role(int wg TRACE_PARAM) {\n    TRACE_BEGIN(qk);\n    f();\n    TRACE_END(qk, 0, s);\n}\n"
           "    role(1 TRACE_ARG);\n" + BACKWARD_INCLUDE + "\n")
    assert without_trace_points(src) == "__device__ void role(int wg) {\n    f();\n}\n    role(1);\n"


def _backward_tree(tmp: Path) -> list[lineage.Stage]:
    """The backward stages with trace points, copied as the lineage has them (the forward's headers,
    the backward's, one folder per stage) under ``tmp``, read as stages."""
    kernels = tmp / "kernels"
    shutil.copytree(lineage.ATTENTION_DIR / "common", kernels / "attention" / "common")
    common = kernels / lineage.BACKWARD_DIR.name / "common"
    shutil.copytree(lineage.BACKWARD_DIR / "common", common)
    folders = [s.dir for s in lineage.discover(lineage.BACKWARD_DIR) if BACKWARD_INCLUDE in s.kernel_path.read_text()]
    for folder in folders:
        shutil.copytree(folder, common.parent / folder.name)
    return [lineage.load_stage(common.parent / folder.name) for folder in folders]


def _fatbin(stage: lineage.Stage, kernel: Path, traced: bool = False) -> tuple[str, str]:
    """(the main kernel's ptxas report, the SASS' instructions) of one compile of ``kernel``."""
    flags = [f for f in build.nvcc_flags(stage, traced) if f not in ("-shared", "-Xcompiler=-fPIC,-fvisibility=hidden")]
    fatbin = kernel.with_suffix(".traced.fatbin" if traced else ".fatbin")
    run = subprocess.run([build.nvcc(), *flags, "-fatbin", "-o", str(fatbin), str(kernel)], capture_output=True,
                         text=True)
    assert run.returncode == 0, f"{stage.name}: {run.stderr[-3000:]}"
    dump = subprocess.run([_cuobjdump(), "-sass", str(fatbin)], check=True, capture_output=True, text=True).stdout
    return run.stdout + run.stderr, "\n".join(line for line in dump.splitlines() if "/*" in line)


@pytest.mark.slow
def test_the_backward_stages_compile_to_the_same_sass_with_and_without_trace_points(tmp_path):
    _nvcc_or_skip()
    stages = _backward_tree(tmp_path)
    assert tuple(s.dir.name for s in stages) == TRACED_STAGES

    def compare(stage):
        source = stage.kernel_path.read_text()
        assert BACKWARD_INCLUDE in source and "TRACE_END(qk, 0, step);" in source, stage.name
        stripped = stage.dir.parent / f"{stage.dir.name}-without" / "kernel.cu"
        stripped.parent.mkdir()
        stripped.write_text(without_trace_points(source))
        with_points = _fatbin(stage, stage.kernel_path)[1]
        return stage.name, with_points == _fatbin(stage, stripped)[1], with_points.count("\n")

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(compare, stages))
    differ = [name for name, same, _ in results if not same]
    assert not differ, f"trace points changed the machine code of backward {differ}"
    assert all(lines > 100 for _, _, lines in results)


@pytest.mark.slow
def test_the_backward_traced_builds_record_without_changing_the_wgmma_pipeline(tmp_path):
    _nvcc_or_skip()
    stages = _backward_tree(tmp_path)
    assert tuple(s.dir.name for s in stages) == TRACED_STAGES == tuple(TRACED_SPILLS)

    def traced(stage):
        assert any(f.endswith("trace_recorder_backward.cuh") for f in build.nvcc_flags(stage, traced=True))
        return stage, *_fatbin(stage, stage.kernel_path, traced=True)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(traced, stages))
    for stage, ptxas, sass in results:
        assert "C7517" not in ptxas and "C7519" not in ptxas, f"{stage.name}: ptxas fenced or waited on the wgmmas"
        main = ptxas[ptxas.index("Compiling entry function '_Z11dkdv_kernel"):]
        main = main[:main.index("Compiling entry function", 10)] if "Compiling entry function" in main[10:] else main
        spills = int(re.search(r"(\d+) bytes spill stores", main).group(1))
        assert spills == TRACED_SPILLS[stage.dir.name], f"{stage.name}: {spills} bytes of spill stores"
        assert "CS2R" in sass and "STG.E.128" in sass  # the clock reads and the 16-byte rows


@pytest.mark.slow
def test_the_traced_build_of_the_final_stage_compiles(tmp_path):
    _nvcc_or_skip()
    stage = STAGES[-1]
    sass = _sass(stage, stage.kernel_path.read_text(), tmp_path, "traced",
                 defines=(build.TRACE_FLAG, "-include", str(build.TRACE_RECORDER)))
    assert "CS2R" in sass or "S2UR" in sass  # the clock reads are there


@pytest.mark.slow
def test_every_head_dim_kernel_of_stage_24_s_traced_build_records(tmp_path):
    """`python -m bench.trace --head-dim` launches the kernel of that head dim: each of the ten
    (attention_kernel<D, COMPUTED_ORDER>) reads the clock and writes its 16-byte rows."""
    _nvcc_or_skip()
    stage = next(s for s in STAGES if s.number == 24)
    flags = [f for f in build.nvcc_flags(stage, traced=True)
             if f not in ("-shared", "-Xcompiler=-fPIC,-fvisibility=hidden")]
    fatbin = tmp_path / "traced.fatbin"
    subprocess.run([build.nvcc(), *flags, "-fatbin", "-o", str(fatbin), str(stage.kernel_path)], check=True,
                   capture_output=True, text=True)
    dump = subprocess.run([_cuobjdump(), "-sass", str(fatbin)], check=True, capture_output=True, text=True).stdout
    kernels = {re.match(r"\s*(\S+)", f).group(1): f for f in re.split(r"\n\s*Function : ", dump)[1:]}
    dims = sorted({int(re.search(r"attention_kernelILi(\d+)E", name).group(1)) for name in kernels})
    assert len(kernels) == 10 and dims == sorted(stage.tile_head_dims())
    for name, sass in kernels.items():
        assert "SR_CLOCKLO" in sass and "SR_GLOBALTIMER" in sass and "STG.E.128" in sass, name
