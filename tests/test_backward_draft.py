"""Backward stages 04, 05 and 06 wait in research/backward_next/ (their folders and the headers
they introduce) until a GPU run has tested and measured them. Here each is assembled beside the lineage's headers (and the
drafts before it, as it will be), read as a stage (its stage.toml checked as the lineage's are) and compiled with the
project's flags (nvcc, no GPU): what its notes say the compiler made of it must stay true — no
spills, no wgmma waits injected by ptxas, one bulk reduce-add and no vector reductions in the main
kernel, shared memory as the spec's buffers add up; stage 05 without the second pass's kernel;
stage 06's producer and consumers with their register budgets."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hopattn import build, cuda_tools, lineage

pytestmark = pytest.mark.nvcc

WAITING = Path(__file__).resolve().parent.parent / "research" / "backward_next"


DRAFTS = ("04_dq-bulk-reduce", "05_ordered-dq", "06_warp-specialized")
# Per draft: the bulk reduce-adds in the main kernel's SASS.
REDUCE_ADDS = {"04_dq-bulk-reduce": 1, "05_ordered-dq": 1, "06_warp-specialized": 1}


def _draft(tmp_path: Path, name: str) -> lineage.Stage:
    kernels = tmp_path / "kernels"
    if not (kernels / "attention").is_dir():
        shutil.copytree(lineage.ATTENTION_DIR / "common", kernels / "attention" / "common")
        shutil.copytree(lineage.BACKWARD_DIR / "common", kernels / "attention_backward" / "common")
        shutil.copytree(WAITING / "common", kernels / "attention_backward" / "common", dirs_exist_ok=True)
    shutil.copytree(WAITING / name, kernels / "attention_backward" / name)
    return lineage.load_stage(kernels / "attention_backward" / name)


def _tool_or_skip(name: str) -> str:
    try:
        return cuda_tools.require(name)
    except cuda_tools.ToolError as err:
        pytest.skip(str(err))


def test_the_drafts_read_as_the_next_backward_stages(tmp_path):
    last = lineage.discover(lineage.BACKWARD_DIR)[-1]
    four, five, six = (_draft(tmp_path, name) for name in DRAFTS)
    assert [s.number for s in (four, five, six)] == [last.number + 1, last.number + 2, last.number + 3] == [4, 5, 6]
    for stage in (four, five, six):
        assert (stage.block_m, stage.block_n) == (64, 128) and stage.deterministic
        assert "Not measured yet" in (stage.dir / "notes.md").read_text()
    for stage in (four, five):
        assert stage.threads == 256
    assert four.smem_bytes == last.smem_bytes + 2 * 64 * 64 * 4  # stage 03's buffers + two dQ tiles
    assert five.smem_bytes == four.smem_bytes + 4  # + the CTA's key block (a ticket when deterministic)
    assert "dq_kernel" in four.kernel_path.read_text() and "dq_kernel" not in five.kernel_path.read_text()
    # 06: a producer warpgroup of 24 registers and two consumers of 240, two more dQ tiles, the statistics
    assert six.threads == 384 and [(r.name, r.registers) for r in six.roles] == [("producer", 24), ("consumer", 240)]
    assert six.smem_bytes == five.smem_bytes + 2 * 64 * 64 * 4 + 2 * 2 * 64 * 4 + 10 * 8  # + tiles, statistics, barriers


@pytest.mark.parametrize("name", DRAFTS)
def test_the_draft_compiles_as_its_notes_say(tmp_path, name):
    nvcc, cuobjdump = _tool_or_skip("nvcc"), _tool_or_skip("cuobjdump")
    stage = _draft(tmp_path, name)
    flags = [f for f in build.nvcc_flags(stage) if f not in ("-shared", "-Xcompiler=-fPIC,-fvisibility=hidden")]
    fatbin = tmp_path / f"{name}.fatbin"
    run = subprocess.run([nvcc, *flags, "-fatbin", "-o", str(fatbin), str(stage.kernel_path)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    ptxas = run.stdout + run.stderr
    assert "C7517" not in ptxas and "C7519" not in ptxas, "ptxas injected waits on the wgmmas in flight"
    main = ptxas[ptxas.index("Compiling entry function '_Z11dkdv_kernel"):]
    main = main[:main.index("Compiling entry function", 10)] if "Compiling entry function" in main[10:] else main
    assert "0 bytes spill stores, 0 bytes spill loads" in main, main
    registers = int(re.search(r"Used (\d+) registers", main).group(1))
    assert registers <= 255
    dump = subprocess.run([cuobjdump, "-sass", "-fun", "dkdv_kernel", str(fatbin)], capture_output=True,
                          text=True).stdout
    if "Function" not in dump:  # older cuobjdump: no -fun filter by the plain name
        dump = subprocess.run([cuobjdump, "-sass", str(fatbin)], check=True, capture_output=True, text=True).stdout
        dump = dump[dump.index("Function : _Z11dkdv_kernel"):]
        dump = dump[:dump.index("Function :", 10)] if "Function :" in dump[10:] else dump
    assert dump.count("UBLKRED.G.S.ADD.F32") == REDUCE_ADDS[name]
    assert "REDG.E.ADD.F32" not in dump and "SHFL" not in dump
    # the deterministic mode's turn: stage 05's spin and count, nothing of the kind in stage 04
    assert ("NANOSLEEP" in dump and "REDG.E.ADD.S32.STRONG.GPU" in dump) == (name != "04_dq-bulk-reduce")
    if name == "06_warp-specialized":
        assert re.search(r"USETMAXREG\.DEALLOC\.CTAPOOL\s+0x18\b", dump)  # 24 registers
        assert re.search(r"USETMAXREG\.TRY_ALLOC\.CTAPOOL\s+\w+,\s*0xf0\b", dump)  # 240 registers
    assert dump.count("HGMMA.64x64x16") == 24 and dump.count("HGMMA.64x128x16") == 8
