"""The two drafts on backward stage 08 (research/backward_next/drafts_on_08/, patches of its kernel.cu:
correct, and not faster than 08 in the default mode, see its README), applied to 08 and compiled with
the project's flags (nvcc, no GPU): what the README says of them must stay true —
09_uniform moves descriptors into uniform registers (far fewer R2UR than 08), 10_named-dq hands the
dQ tiles over on named barriers of 160 threads; both keep 08's wgmmas and waits without a ptxas
remark; and the check that would have refused the configuration that hung (producer 32 + consumers
240 registers, more than a 168-register launch gives the CTA) does refuse it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hopattn import build, lineage
from test_backward_next_draft import REMARKS, _compile, _tool_or_skip

pytestmark = pytest.mark.nvcc

DRAFTS = Path(__file__).resolve().parent.parent / "research" / "backward_next" / "drafts_on_08"
EIGHT = "08_mask-select"


def patched_stage(tmp_path: Path, drafts: Path, draft: str, base: str) -> lineage.Stage:
    """Draft ``draft`` (``drafts/<draft>.patch``, a patch of a stage's kernel.cu) as a stage folder of its
    own beside the lineage's common headers in ``tmp_path``: the base stage's folder, patched, under the
    draft's name (so its number), as the draft's README says to rebuild it."""
    kernels = tmp_path / "kernels"
    shutil.copytree(lineage.ATTENTION_DIR / "common", kernels / "attention" / "common")
    shutil.copytree(lineage.BACKWARD_DIR / "common", kernels / "attention_backward" / "common")
    folder = kernels / "attention_backward" / draft
    shutil.copytree(lineage.BACKWARD_DIR / base, folder)
    run = subprocess.run(["patch", "-s", "-p1", "-d", str(folder), "-i", str(drafts / f"{draft}.patch")],
                         capture_output=True, text=True)
    assert run.returncode == 0, f"{draft}.patch no longer applies to {base}: {run.stdout}{run.stderr}"
    return lineage.load_stage(folder)


def _tree(tmp_path: Path, draft: str) -> lineage.Stage:
    return patched_stage(tmp_path, DRAFTS, draft, EIGHT)


@pytest.fixture(scope="module")
def eight_sass(tmp_path_factory) -> str:
    stage = next(s for s in lineage.discover(lineage.BACKWARD_DIR) if s.dir.name == EIGHT)
    return _compile(stage, stage.kernel_path, tmp_path_factory.mktemp("eight") / "eight.fatbin")[1]


@pytest.mark.parametrize("draft", ["09_uniform", "10_named-dq"])
def test_a_draft_compiles_as_its_readme_says(tmp_path, draft, eight_sass):
    stage = _tree(tmp_path, draft)
    assert stage.number == int(draft[:2])
    ptxas, sass = _compile(stage, stage.kernel_path, tmp_path / "draft.fatbin")
    for remark in REMARKS:
        assert remark not in ptxas, ptxas
    assert int(re.search(r"Used (\d+) registers", ptxas).group(1)) == 168
    assert re.search(r"USETMAXREG\.DEALLOC\.CTAPOOL\s+0x18\b", sass)  # the producer back at 24
    assert re.search(r"USETMAXREG\.TRY_ALLOC\.CTAPOOL\s+\w+,\s*0xf0\b", sass)  # the consumers at 240
    assert set(re.findall(r"(\d+) bytes spill stores", ptxas)) == {"0"}  # the dQ warps' addresses advanced, not recomputed
    # 08's products and waits, unchanged
    for what in ("HGMMA.64x64x16", "HGMMA.64x128x16", "WARPGROUP.DEPBAR.LE gsb0, 0x1", "WARPGROUP.DEPBAR.LE gsb0, 0x0"):
        assert sass.count(what) == eight_sass.count(what), what
    # the uniform values: descriptors no longer moved into uniform registers before each wgmma
    assert eight_sass.count("R2UR") == 124 and sass.count("R2UR") <= 45
    if draft == "10_named-dq":  # the dQ hand-over: bar.arrive and bar.sync of 160 threads (0xa0)
        assert sass.count("BAR.ARV") >= 3 and len(re.findall(r"BAR\.SYNC\.DEFER_BLOCKING \w+, 0xa0", sass)) >= 3
    else:
        assert ", 0xa0" not in sass


def test_the_register_pool_check_refuses_the_configuration_that_hung(tmp_path):
    stage = _tree(tmp_path, "09_uniform")
    source = stage.kernel_path.read_text()
    assert "constexpr int PRODUCER_REGS = 24;" in source
    stage.kernel_path.write_text(source.replace("constexpr int PRODUCER_REGS = 24;", "constexpr int PRODUCER_REGS = 32;"))
    flags = [f for f in build.nvcc_flags(stage, False) if f not in ("-shared", "-Xcompiler=-fPIC,-fvisibility=hidden")]
    run = subprocess.run([_tool_or_skip("nvcc"), *flags, "-fatbin", "-o", str(tmp_path / "hung.fatbin"),
                          str(stage.kernel_path)], capture_output=True, text=True)
    assert run.returncode != 0 and "setmaxnreg asks for more registers than the launch gave the CTA" in run.stderr
