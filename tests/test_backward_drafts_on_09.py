"""The draft on backward stage 09 (research/backward_next/drafts_on_09/10_short-turn.patch, a patch of its
kernel.cu; not measured), applied to 09 and compiled with the project's flags (nvcc, no GPU): 10_short-turn is stage 09 with each
turn's bar.arrive moved up behind the dQ product's issue, so it must keep 09's wgmmas and waits, spill
nothing, raise no ptxas remark, and end the turn before the wait for dV and dK."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hopattn import lineage
from test_backward_drafts_on_08 import patched_stage
from test_backward_next_draft import REMARKS, _compile

pytestmark = pytest.mark.nvcc

DRAFTS = Path(__file__).resolve().parent.parent / "research" / "backward_next" / "drafts_on_09"
NINE = "09_out-of-phase"


def test_the_short_turn_keeps_09_s_products_and_ends_the_turn_before_the_wait(tmp_path):
    nine = next(s for s in lineage.discover(lineage.BACKWARD_DIR) if s.dir.name == NINE)
    nine_sass = _compile(nine, nine.kernel_path, tmp_path / "nine.fatbin")[1]
    draft = patched_stage(tmp_path / "draft", DRAFTS, "10_short-turn", NINE)
    assert draft.number == 10
    source, source9 = draft.kernel_path.read_text(), nine.kernel_path.read_text()
    assert source.count("named_barrier_arrive") == source9.count("named_barrier_arrive") == 1
    assert source.index("named_barrier_arrive") < source.index("issue_s(st, s, k_rows, step + 1")
    assert source9.index("named_barrier_arrive") > source9.index("issue_s(st, s, k_rows, step + 1")
    ptxas, sass = _compile(draft, draft.kernel_path, tmp_path / "draft.fatbin")
    for remark in REMARKS:
        assert remark not in ptxas, ptxas
    assert set(re.findall(r"(\d+) bytes spill stores", ptxas)) == {"0"}
    for what in ("HGMMA.64x64x16", "HGMMA.64x128x16", "WARPGROUP.DEPBAR.LE gsb0, 0x1", "WARPGROUP.DEPBAR.LE gsb0, 0x0",
                 "MUFU.EX2"):
        assert sass.count(what) == nine_sass.count(what), what
    # in the loop, the turn's bar.arrive now comes before the wait for dV and dK (DEPBAR 0x1)
    lines = sass.splitlines()
    arrives = [i for i, line in enumerate(lines) if re.search(r"BAR\.ARV R\d+, 0x100", line)]
    assert arrives and any(line.startswith("WARPGROUP.DEPBAR.LE gsb0, 0x1") for line in lines[arrives[0]:arrives[0] + 40])
