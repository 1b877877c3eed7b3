"""The drafts on backward stage 09 (research/backward_next/drafts_on_09/*.patch, patches of its kernel.cu;
measured in bench/logs/backward-devtime-drafts-on-09-nvidia-h200-20261203T0156.log), applied to 09 and
compiled with the project's flags (nvcc, no GPU). 10_short-turn is stage 09 with each turn's bar.arrive
moved up behind the dQ product's issue, so it must keep 09's wgmmas and waits, spill nothing, raise no
ptxas remark, and end the turn before the wait for dV and dK. 11_stmatrix-ds stores dSᵀ with four
stmatrix.x4 a thread instead of sixteen 32-bit stores, and 12_turn-and-stmatrix is both: the same
products, no spill, 8 STSM (two consumer warpgroups' store_ds, inlined once each per path) and no
32-bit shared store left in store_ds."""

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


@pytest.mark.parametrize("name", ["11_stmatrix-ds", "12_turn-and-stmatrix"])
def test_stmatrix_drafts_store_ds_with_stmatrix_and_keep_09_s_products(tmp_path, name):
    nine = next(s for s in lineage.discover(lineage.BACKWARD_DIR) if s.dir.name == NINE)
    nine_ptxas, nine_sass = _compile(nine, nine.kernel_path, tmp_path / "nine.fatbin")
    draft = patched_stage(tmp_path / "draft", DRAFTS, name, NINE)
    assert draft.number == int(name[:2])
    source = draft.kernel_path.read_text()
    body = source[source.index("void store_ds("):]
    body = body[:body.index("\n}\n")]
    assert "stmatrix.sync.aligned.m8n8.x4.shared.b16" in body and "st_shared_b32" not in body
    ptxas, sass = _compile(draft, draft.kernel_path, tmp_path / "draft.fatbin")
    for remark in REMARKS:
        assert remark not in ptxas, ptxas
    assert set(re.findall(r"(\d+) bytes spill stores", ptxas)) == {"0"}
    for what in ("HGMMA.64x64x16", "HGMMA.64x128x16", "WARPGROUP.DEPBAR.LE gsb0, 0x1", "WARPGROUP.DEPBAR.LE gsb0, 0x0",
                 "MUFU.EX2"):
        assert sass.count(what) == nine_sass.count(what), what
    assert "STSM" not in nine_sass
    assert sass.count("STSM") == 8
    # the 32-bit shared stores of dSᵀ are gone: 09 has 16 a store_ds more than the draft, per inlined copy
    assert nine_sass.count("STS ") - sass.count("STS ") == 2 * 16


@pytest.mark.parametrize("name", ["13_heavy-first", "14_heavy-first-one-wave"])
def test_heavy_first_drafts_change_only_the_ctas_order(tmp_path, name):
    """13 and 14 map a default causal CTA's linear index to (key block, K/V head, batch), a window of
    pairs at a time, heaviest key block first: the products, waits and exponentials stay 09's, and
    nothing spills; the window is WINDOW_WAVES waves of %nsmid SMs (2 for 13, 1 for 14)."""
    nine = next(s for s in lineage.discover(lineage.BACKWARD_DIR) if s.dir.name == NINE)
    nine_sass = _compile(nine, nine.kernel_path, tmp_path / "nine.fatbin")[1]
    draft = patched_stage(tmp_path / "draft", DRAFTS, name, NINE)
    source = draft.kernel_path.read_text()
    assert f"constexpr int WINDOW_WAVES = {2 if name.startswith('13') else 1};" in source
    assert "%%nsmid" in source and "steps.kv_head = tile.kv_head;" in source
    ptxas, sass = _compile(draft, draft.kernel_path, tmp_path / "draft.fatbin")
    for remark in REMARKS:
        assert remark not in ptxas, ptxas
    assert set(re.findall(r"(\d+) bytes spill stores", ptxas)) == {"0"}
    for what in ("HGMMA.64x64x16", "HGMMA.64x128x16", "WARPGROUP.DEPBAR.LE gsb0, 0x1", "WARPGROUP.DEPBAR.LE gsb0, 0x0",
                 "MUFU.EX2", "STS ", "UBLKRED"):
        assert sass.count(what) == nine_sass.count(what), what
