"""The cross-entropy lineage's drafts (research/cross_entropy/drafts/NN_slug/), not yet measured: each is
assembled beside the lineage's stages and common/ in a temporary tree, as it will be when it moves to
kernels/cross_entropy/NN_slug (research/cross_entropy/drafts/README.md), read as a stage there (its
stage.toml typed and checked against kernel.cu as the lineage's are; the next number after the last
stage), and compiled with the project's flags (nvcc, no GPU): every template instance its launcher can
dispatch, with no spill, no stack and no ptxas remark. The draft is never put under kernels/ itself,
where it would become the default op before its GPU run."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hopattn import build, cross_entropy_lineage, cuda_tools, lineage

pytestmark = pytest.mark.nvcc

DRAFTS = lineage.RMSNORM_DIR.parent.parent / "research" / "cross_entropy" / "drafts"
NAMES = sorted(p.name for p in DRAFTS.iterdir() if p.is_dir() and re.match(r"\d\d_", p.name))
# The instances each draft's launcher dispatches (3 dtypes each): kernel name -> count.
EXPECTED_INSTANCES = {"06_persistent-prefetch": {"cross_entropy_online": 12, "cross_entropy_persistent_rows": 33}}


def _tree(tmp_path: Path, name: str):
    """kernels/rmsnorm/common, kernels/cross_entropy/{common, the stages, the draft} under tmp_path; the
    draft read as a stage of that lineage."""
    kernels = tmp_path / "kernels"
    shutil.copytree(lineage.RMSNORM_DIR / "common", kernels / "rmsnorm" / "common")
    root = kernels / "cross_entropy"
    # the lineage as it is, less a copy of this draft already there (a GPU session's, README.md)
    shutil.copytree(cross_entropy_lineage.CROSS_ENTROPY_DIR, root, ignore=shutil.ignore_patterns("__pycache__", name))
    shutil.copytree(DRAFTS / name, root / name)
    stages = cross_entropy_lineage.discover(root)  # refuses a gap or a repeated number
    return stages[-1], stages


def _ptxas(stage) -> str:
    try:
        nvcc = cuda_tools.require("nvcc")
    except cuda_tools.ToolError as err:
        pytest.skip(str(err))
    flags = [f for f in build.nvcc_flags(stage) if f not in ("-shared", "-Xcompiler=-fPIC,-fvisibility=hidden")]
    out = stage.dir / "draft.cubin"
    run = subprocess.run([nvcc, *flags, "-cubin", "-o", str(out), str(stage.kernel_path)], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout + run.stderr


def test_there_is_a_draft():
    assert NAMES == sorted(EXPECTED_INSTANCES)


@pytest.mark.parametrize("name", NAMES)
def test_the_draft_is_the_next_stage(tmp_path, name):
    stage, stages = _tree(tmp_path, name)
    assert stage.dir.name == name and stage.number == len(stages) and stage.number == int(name[:2])
    assert cross_entropy_lineage.constant_mismatches(stage) == []
    assert cross_entropy_lineage.config_mismatches(stage) == []
    source = stage.kernel_path.read_text()
    assert re.search(rf"__global__ void .*?\b{stage.spec.kernel}\(", source, re.S)
    for export in ("hopattn_cross_entropy_launch", "hopattn_cross_entropy_describe"):
        assert f"HOPATTN_EXPORT int {export}(" in source
    assert source.count("cross_entropy_check_params(p, err, errlen)") == 2
    assert stage.spec.row.reads == 1 and "cluster" in stage.spec.row.owners  # the final stage's, as 05's
    previous = stages[-2].spec.config
    assert [(c.threads_per_row, c.vectors, c.rows_per_cta, c.cluster) for c in stage.spec.config] == [
        (c.threads_per_row, c.vectors, c.rows_per_cta, c.cluster) for c in previous]  # the previous stage's table
    notes = stage.notes_path.read_text()
    assert notes.index("## Prediction") < notes.index("## Measured") < notes.index("## What the compiler made of it")
    measured = notes[notes.index("## Measured"):]
    assert ("**Not measured yet.**" in measured or "**Measured as a draft" in measured) and "ptxas -v" in notes and "GB/s" in notes


@pytest.mark.slow  # a minute: 45 instances for sm_90a
@pytest.mark.parametrize("name", NAMES)
def test_the_draft_compiles_without_spills_or_remarks(tmp_path, name):
    from hopattn.compiler.ptxas import parse_ptxas

    stage, _ = _tree(tmp_path, name)
    log = _ptxas(stage)
    functions = {fn: r for (arch, fn), r in parse_ptxas(log).items() if arch == "sm_90a"}
    counts = {}
    for fn in functions:
        kernel = re.match(r"_Z\d+(\w+?)I", fn).group(1)
        counts[kernel] = counts.get(kernel, 0) + 1
    assert counts == EXPECTED_INSTANCES[name], counts
    spilled = {fn: (r.spill_stores, r.spill_loads) for fn, r in functions.items() if r.spill_stores or r.spill_loads}
    assert not spilled, spilled
    assert not {fn for fn, r in functions.items() if r.stack_frame}, "a stack frame"
    remarks = [line for line in log.splitlines() if "warning" in line.lower() or "Potential" in line
               or re.search(r"\bC\d{4}\b", line)]
    assert not remarks, remarks
    # the notes' "What the compiler made of it" gives every bf16 instance's registers as ptxas did
    notes = stage.notes_path.read_text()
    compiler = notes[notes.index("## What the compiler made of it"):]
    bf16 = [r.registers for fn, r in functions.items() if "persistent" in fn and "bfloat16" in fn]
    assert bf16 and all(str(n) in compiler for n in bf16)
