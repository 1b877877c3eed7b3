"""The drafts on backward stage 10 (research/backward_next/drafts_on_10/*.patch, patches of its kernel.cu;
why: research/backward_next/fa4_compare/README.md), applied to 10 and compiled with the project's flags
(nvcc, no GPU). Both issue dQ (step − 1) first in a warpgroup's turn and store its share and dSᵀ while
dV and dK run; 11 ends the turn after the next Sᵀ as 10 does, 12 before the wait for dV and dK. Both
keep 10's products and exponentials, raise no ptxas remark (the next Sᵀ issued under dV and dK would:
C7512, too few registers), and spill nothing (measured: both slower, README). 13_dq-rows leaves the dkdv
kernel as it is and writes dQ's conversion in whole rows through shared memory."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from hopattn import cuda_tools, lineage
from test_backward_drafts_on_08 import patched_stage
from test_backward_next_draft import REMARKS, _compile

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]

DRAFTS = Path(__file__).resolve().parent.parent / "research" / "backward_next" / "drafts_on_10"
TEN = "10_heavy-first"


@pytest.mark.parametrize("name", ["11_dq-first", "12_dq-first-short-turn"])
def test_dq_first_drafts_keep_10_s_products_and_issue_dq_before_dv_and_dk(tmp_path, name):
    ten = next(s for s in lineage.discover(lineage.BACKWARD_DIR) if s.dir.name == TEN)
    ten_sass = _compile(ten, ten.kernel_path, tmp_path / "ten.fatbin")[1]
    draft = patched_stage(tmp_path / "draft", DRAFTS, name, TEN)
    assert draft.number == int(name[:2])
    source = draft.kernel_path.read_text()
    turn = source[source.index("auto rest = [&]"):source.index("// Every CTA has a step")]
    assert turn.index("issue_dq(step - 1);") < turn.index("wgmma_m64n128k16_bf16_rs<1>(dv")
    assert turn.index("store_dq(step - 1)") < turn.index("wgmma_wait<0>();")  # the share stored before dV, dK retire
    arrive, wait_dvdk = turn.index("named_barrier_arrive"), turn.index("wgmma_wait<0>();")
    assert (arrive < wait_dvdk) == name.startswith("12")
    ptxas, sass = _compile(draft, draft.kernel_path, tmp_path / "draft.fatbin")
    for remark in REMARKS:
        assert remark not in ptxas, ptxas
    assert set(re.findall(r"(\d+) bytes spill stores", ptxas)) == {"0"}
    for what in ("HGMMA.64x64x16", "HGMMA.64x128x16", "MUFU.EX2", "UBLKRED"):
        assert sass.count(what) == ten_sass.count(what), what


def test_dq_rows_draft_changes_only_the_dq_conversion_and_its_stores_are_16_bytes(tmp_path):
    """13_dq-rows: 10's dkdv kernel unchanged (same products, exponentials and shared stores), and the dQ
    conversion staged through shared memory: 16-byte global stores only, where 10's are 4-byte."""
    ten = next(s for s in lineage.discover(lineage.BACKWARD_DIR) if s.dir.name == TEN)
    ten_ptxas, ten_sass = _compile(ten, ten.kernel_path, tmp_path / "ten.fatbin")
    draft = patched_stage(tmp_path / "draft", DRAFTS, "13_dq-rows", TEN)
    ptxas, sass = _compile(draft, draft.kernel_path, tmp_path / "draft.fatbin")
    assert sass == ten_sass  # the dkdv kernel is 10's, instruction for instruction
    for remark in REMARKS:
        assert remark not in ptxas, ptxas

    def convert(fatbin: Path) -> str:
        dump = subprocess.run([cuda_tools.require("cuobjdump"), "-sass", str(fatbin)], check=True,
                              capture_output=True, text=True).stdout
        dump = dump[dump.index("Function : _Z17dq_convert_kernel"):]
        return dump[:dump.index("Function :", 10)] if "Function :" in dump[10:] else dump

    before, after = convert(tmp_path / "ten.fatbin"), convert(tmp_path / "draft.fatbin")
    stores = lambda sass: re.findall(r"\b(STG\.E(?:\.\d+)?)\b", sass)  # noqa: E731
    assert set(stores(before)) == {"STG.E"} and set(stores(after)) == {"STG.E.128"}
    assert "STS" in after and "BAR.SYNC" in after and "STS" not in before
