"""The numeric fuzz's cases (CPU): reproducible, and covering the ranges the issue names."""

import math

from numeric_cases import KINDS, MAGNITUDES, SCALES, numeric_cases


def test_same_seed_same_cases_other_seed_other_cases():
    assert numeric_cases(7) == numeric_cases(7)
    assert numeric_cases(7) != numeric_cases(8)


def test_at_least_300_cases_covering_every_kind_both_masks_and_gqa():
    cases = numeric_cases(12345)
    assert len(cases) >= 300
    assert {c.kind for c in cases} == set(KINDS)
    for kind in KINDS:
        of_kind = [c for c in cases if c.kind == kind]
        assert {c.causal for c in of_kind} == {False, True}, kind
    assert any(c.heads > c.kv_heads for c in cases) and any(c.heads == c.kv_heads for c in cases)
    assert any(c.len_q > c.len_k and c.causal for c in cases)  # rows that see no key


def test_scales_and_magnitudes_span_their_ranges():
    cases = numeric_cases(99)
    for values, (lo, hi) in (([c.scale for c in cases], SCALES), ([c.magnitude for c in cases], MAGNITUDES)):
        assert lo <= min(values) and max(values) <= hi
        # log-uniform: each decade of the range is reached
        decades = {math.floor(math.log10(x)) for x in values}
        assert decades >= set(range(round(math.log10(lo)), round(math.log10(hi)))), sorted(decades)


def test_lengths_cross_tile_boundaries_and_outliers_sit_where_named():
    cases = numeric_cases(3)
    assert {c.len_k % 128 for c in cases} >= {0, 1, 127}
    assert any(c.len_q == 1 for c in cases) or any(c.len_q < 128 for c in cases)
    for c in cases:
        tiles = math.ceil(c.len_k / 128)
        if c.kind == "outlier_first":
            assert c.block == 0
        elif c.kind == "outlier_last":
            assert c.block == tiles - 1
        elif c.kind in ("jump", "jump_window"):
            assert 1 <= c.block < tiles and tiles >= 4
        assert c.batch * c.heads * c.len_q * c.len_k <= 3e7
