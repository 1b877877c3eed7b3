"""The backward's dQ conversion as the specs say it ([movement] dq_convert) and its figure on stage 11's
page: rows (01-03: a row-major accumulator, 16-byte stores), fragments (04-10: the accumulator in wgmma
fragment order, each thread's 4-byte pieces stored in place), staged rows (11: the fragments through a
padded shared tile, then whole rows)."""

from __future__ import annotations

import re

import pytest
from hopattn import lineage

from site_gen.diagrams.backward import backward_diagrams
from site_gen.diagrams.backward.dq_convert import dq_convert_diagram
from site_gen.pages import backward as backward_page

STAGES = lineage.discover(lineage.BACKWARD_DIR)


def _convert_source(stage) -> str:
    source = stage.kernel_path.read_text()
    start = source.index("dq_convert_kernel(const AttnBwdParams p)")
    return source[start:source.index("\n}\n", start)]


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_each_stage_s_spec_names_its_conversion(stage):
    body = _convert_source(stage)
    form = stage.movement.dq_convert
    assert form in lineage.DQ_CONVERTS, f"backward stage {stage.id}: [movement] dq_convert missing"
    row_stores = "*reinterpret_cast<uint4*>(dq +" in body
    fragments = "dq_block_index(t, 4 * j)" in body
    staged = "__shared__" in body and "DQ_ROW_PITCH" in body
    assert (row_stores, fragments, staged) == {"rows": (True, False, False), "fragments": (False, True, False),
                                               "staged rows": (True, True, True)}[form], stage.id


def test_the_figure_draws_for_the_staged_stages_alone_and_leads_stage_11_s_page():
    drawn = {s.number: [d.kind for d in backward_diagrams(s, STAGES)] for s in STAGES}
    assert [n for n, kinds in drawn.items() if "dq-convert" in kinds] == [s.number for s in STAGES
                                                                          if s.movement.dq_convert == "staged rows"]
    eleven = next(s for s in STAGES if s.number == 11)
    figures = backward_diagrams(eleven, STAGES)
    lead = backward_page.lead_for(eleven, figures)
    assert next(d for d in figures if d.id == lead).kind == "dq-convert"


def test_the_figure_s_numbers_are_the_kernels():
    eleven = next(s for s in STAGES if s.number == 11)
    d = dq_convert_diagram(eleven, STAGES)
    k = eleven.constants()
    assert k["DQ_ROW_PITCH"] == 272 and k["CONSUMER_THREADS"] == 256 and eleven.block_m == 64
    for text in ("stage 10", "16 bytes into each of 8 rows", "16 stores a thread", "2 whole rows",
                 "4 stores a thread", "272-byte rows"):
        assert text in d.caption, text
    assert "moves each row 4 banks on" in d.svg  # 272 / 4 = 68 words a row, 68 mod 32 = 4
    # a warp's fragment store: 8 rows with one half-filled sector each; a row store: 2 rows of 8 whole ones
    written = re.findall(r'<rect[^>]*fill-opacity="0.35"', d.svg)
    assert len(written) == 8 + 2 * 8, len(written)
    assert d.svg == dq_convert_diagram(eleven, STAGES).svg  # the same bytes each time
