"""The GPU fuzz's shape list (fuzz_shapes.py) covers the whole contract and repeats for a seed."""

import math

from fuzz_shapes import GQA_RATIOS, HUNG_BEFORE, MAX_LEN, fuzz_shapes


def test_the_same_seed_gives_the_same_shapes_and_another_seed_others():
    assert fuzz_shapes(5) == fuzz_shapes(5)
    assert fuzz_shapes(5) != fuzz_shapes(6)


def test_at_least_300_shapes_across_the_contract():
    shapes = fuzz_shapes(12345)
    assert len(shapes) >= 300
    assert shapes[:len(HUNG_BEFORE)] == HUNG_BEFORE  # the shapes that hung come first
    assert {s.causal for s in shapes} == {False, True}
    assert {s.layout for s in shapes} == {"bhsd", "bshd"}
    assert {s.view for s in shapes} == {"contiguous", "strided", "offset"}
    assert any(s.len_q > s.len_k for s in shapes) and any(s.len_q < s.len_k for s in shapes)
    assert min(min(s.len_q, s.len_k) for s in shapes) == 1
    assert max(max(s.len_q, s.len_k) for s in shapes[len(HUNG_BEFORE):]) >= MAX_LEN - 1
    tiles = [s.tiles for s in shapes]
    assert min(tiles) == 1 and max(tiles) >= 2000
    assert sum(t > 132 for t in tiles) >= 50  # more output tiles than SMs: persistent CTAs loop
    assert sum(s.len_q % 128 not in (0,) for s in shapes) >= 100  # lengths that are not tile multiples


def test_grouped_query_ratios_when_the_stage_has_them():
    shapes = fuzz_shapes(7, gqa=True)
    ratios = {s.heads // s.kv for s in shapes}
    assert set(GQA_RATIOS) <= ratios
    assert all(s.heads % s.kv == 0 for s in shapes)
    assert all(s.kv == s.heads for s in fuzz_shapes(7))  # without GQA: as many K/V heads as q heads
    assert all(math.ceil(s.len_q / 128) * s.batch * s.heads == s.tiles for s in shapes)
