"""The drafts on backward stage 10 (research/backward_next/drafts_on_10/*.patch, patches of its kernel.cu;
why: research/backward_next/fa4_compare/README.md), applied to 10 and compiled with the project's flags
(nvcc, no GPU). Both issue dQ (step − 1) first in a warpgroup's turn and store its share and dSᵀ while
dV and dK run; 11 ends the turn after the next Sᵀ as 10 does, 12 before the wait for dV and dK. Both
keep 10's products and exponentials, raise no ptxas remark (the next Sᵀ issued under dV and dK would:
C7512, too few registers), and spill nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hopattn import lineage
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
