"""Trace points vanish without -DHOPATTN_TRACE: each stage compiles to the same SASS as the same
source with its trace points deleted, and the traced build compiles (common/trace.cuh, common/trace_recorder.cuh)."""

from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import pytest
from hopattn import build, lineage

pytestmark = pytest.mark.nvcc

STAGES = lineage.discover()
TRACE_LINE = re.compile(r"^\s*TRACE_(INIT|BEGIN|END|MARK)\(.*\);\s*$")
TRACE_USE = re.compile(r"\bTRACE_(INIT|BEGIN|END|MARK)\b")
INCLUDE = '#include "../common/trace.cuh"'


def _nvcc_or_skip() -> str:
    try:
        return build.nvcc()
    except build.BuildError as err:
        pytest.skip(str(err))


def without_trace_points(source: str) -> str:
    """The source with every trace point (a statement on a line of its own) and the include removed."""
    kept = [line for line in source.splitlines() if not TRACE_LINE.match(line) and line.strip() != INCLUDE]
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


@pytest.mark.slow
def test_the_traced_build_of_the_final_stage_compiles(tmp_path):
    _nvcc_or_skip()
    stage = STAGES[-1]
    sass = _sass(stage, stage.kernel_path.read_text(), tmp_path, "traced",
                 defines=(build.TRACE_FLAG, "-include", str(build.TRACE_RECORDER)))
    assert "CS2R" in sass or "S2UR" in sass  # the clock reads are there
