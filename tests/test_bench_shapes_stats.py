"""FLOP counting, shape and stage selection, statistics and same-run ratios."""

from __future__ import annotations

import pytest

from bench import stats
from bench.shapes import SHAPES, Shape, flops, parse_shapes, parse_stages, tflops


def test_flops_counts_both_gemms_and_halves_causal():
    s = SHAPES["4k"]
    assert (s.batch, s.heads, s.len_q, s.len_k, s.head_dim) == (8, 16, 4096, 4096, 128)
    assert flops(s, False) == 4 * 8 * 16 * 4096 * 4096 * 128
    assert flops(s, True) == flops(s, False) / 2
    # the same tokens per shape (B·L = 32k), so the work doubles with L
    assert [flops(x, False) / flops(s, False) for x in SHAPES.values()] == [1, 2, 4]
    assert (SHAPES["8k"].batch, SHAPES["16k"].batch) == (4, 2)


def test_tflops_matches_the_anchor_measurement():
    # anchors/h200-peers-2026-11-29.json: fa4 8k non-causal 3.33459 ms -> 659.46 TFLOP/s
    assert tflops(SHAPES["8k"], False, 3.33459210395813) == pytest.approx(659.4579, rel=1e-6)
    assert tflops(SHAPES["8k"], True, 1.8113120198249817) == pytest.approx(607.025, rel=1e-5)


def test_tflops_uses_len_q_and_len_k():
    s = Shape("x", 1, 2, 128, 256, 64)
    assert flops(s, False) == 4 * 1 * 2 * 128 * 256 * 64


def test_parse_shapes():
    assert [s.name for s in parse_shapes("16k, 4k,16k")] == ["16k", "4k"]
    with pytest.raises(ValueError, match="--shapes: unknown shape '2k'"):
        parse_shapes("4k,2k")
    with pytest.raises(ValueError, match="--shapes"):
        parse_shapes(" , ")


def test_parse_stages():
    avail = list(range(1, 19))
    assert parse_stages("1,2,5-6", avail) == [1, 2, 5, 6]
    assert parse_stages("7", avail) == [7]
    assert parse_stages("all", avail) == avail
    assert parse_stages("none", avail) == []
    assert parse_stages("6-6, 3", avail) == [3, 6]
    with pytest.raises(ValueError, match="no stage 19"):
        parse_stages("18-19", avail)
    with pytest.raises(ValueError, match="runs backwards"):
        parse_stages("6-5", avail)
    with pytest.raises(ValueError, match="'x' is not a stage number"):
        parse_stages("1,x", avail)


def test_summarize():
    s = stats.summarize([2.0, 1.0, 4.0, 3.0, 5.0])
    assert s == {"median_ms": 3.0, "min_ms": 1.0, "max_ms": 5.0, "spread_pct": pytest.approx(400 / 3), "samples": 5}
    assert stats.summarize([1.5])["spread_pct"] == 0.0
    with pytest.raises(ValueError):
        stats.median([])


def test_ratio_is_median_of_per_round_ratios():
    arm = [1.0, 2.0, 1.0]
    ref = [2.0, 2.0, 3.0]  # per round 2.0, 1.0, 3.0
    assert stats.ratio(arm, ref) == 2.0
    # not the ratio of medians (2/1 = 2 here too), so check a case where they differ
    assert stats.ratio([1.0, 1.0, 4.0], [1.0, 3.0, 4.0]) == 1.0
    assert stats.median([1.0, 1.0, 4.0]) / stats.median([1.0, 3.0, 4.0]) != 1.0
    with pytest.raises(ValueError, match="same number of rounds"):
        stats.ratio([1.0], [1.0, 2.0])


def test_round_order_alternates():
    names = ["a", "b", "c"]
    assert stats.round_order(names, 0) == names
    assert stats.round_order(names, 1) == ["c", "b", "a"]
    assert stats.round_order(names, 2) == names


def test_head_dim_points_keep_h_times_d_and_are_not_in_the_default_run():
    """Issue #29's points: 4k/8k/16k (B·L = 32k) with H·D = 2048 (64 x 32, 128 x 16, 256 x 8; 96 and
    192 with v 128 over the nearest whole number of heads), run with --shapes head-dims only."""
    from bench.shapes import ALL_SHAPES, HEAD_DIM_SHAPES

    points = {(s.name, s.head_dim, s.dv, s.heads, s.batch, s.len_q) for s in HEAD_DIM_SHAPES.values()}
    assert {("8k-d64", 64, 64, 32, 4, 8192), ("8k-d128", 128, 128, 16, 4, 8192), ("8k-d256", 256, 256, 8, 4, 8192),
            ("4k-d96", 96, 96, 21, 8, 4096), ("16k-d192v128", 192, 128, 11, 2, 16384)} <= points
    assert len(HEAD_DIM_SHAPES) == 15 and not set(HEAD_DIM_SHAPES) & set(ALL_SHAPES)
    assert [s.name for s in parse_shapes("all")] == list(ALL_SHAPES)
    assert len(parse_shapes("head-dims")) == 15
    assert [s.name for s in parse_shapes("head-dims-8k")] == ["8k-d64", "8k-d96", "8k-d128", "8k-d192v128", "8k-d256"]
    assert [s.name for s in parse_shapes("8k,8k-d64")] == ["8k", "8k-d64"]
    assert HEAD_DIM_SHAPES["8k-d192v128"].describe() == "B4 H11 L8192 D192 Dv128"


def test_flops_count_qk_over_d_and_pv_over_v_s_head_dim():
    mla = Shape("mla", 1, 2, 128, 256, 192, head_dim_v=128)
    assert flops(mla, False) == 2 * 1 * 2 * 128 * 256 * (192 + 128)
    assert flops(Shape("d64", 1, 2, 128, 256, 64), True) == 4 * 1 * 2 * 128 * 256 * 64 / 2
