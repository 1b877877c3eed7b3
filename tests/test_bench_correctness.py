"""The float64 reference, the row/head sample, the verdict and the poisoned launch (on the CPU)."""

from __future__ import annotations

import math
import random

import pytest

from bench import correctness

torch = pytest.importorskip("torch")


def inputs(b=2, h=3, lq=96, lk=80, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g).to(torch.bfloat16) for n in (lq, lk, lk)]


def full_sample(b, h, lq):
    return correctness.Sample(tuple((i, j) for i in range(b) for j in range(h)), tuple(range(lq)))


@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_float64_sdpa(causal):
    q, k, v = inputs(lq=80, lk=80)
    scale = 0.125
    ref = correctness.Reference(torch, q, k, v, causal, scale, full_sample(2, 3, 80))
    exact = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal,
                                                             scale=scale)
    assert ref.rel_err(exact) < 1e-12
    # a bf16 result is within bf16 rounding, far under the tolerance
    assert ref.rel_err(exact.to(torch.bfloat16)) < 5e-3


def test_causal_mask_is_top_left_aligned():
    q, k, v = inputs(lq=64, lk=64)
    ref = correctness.Reference(torch, q, k, v, True, 0.2, full_sample(2, 3, 64))
    non_causal = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=0.2)
    assert ref.rel_err(non_causal) > 0.1
    # row 0 attends only to key 0: its output is v[..., 0, :]
    assert torch.allclose(ref.values[(0, 0)][0], v[0, 0, 0].double())


def test_errors_in_unsampled_rows_are_invisible_but_nan_anywhere_is_caught():
    q, k, v = inputs(b=1, h=1, lq=64, lk=64)
    sample = correctness.Sample(((0, 0),), tuple(range(32)))
    ref = correctness.Reference(torch, q, k, v, False, 0.2, sample)
    out = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=0.2)
    out[0, 0, 40:] = 7.0
    assert ref.rel_err(out) < 1e-12
    out[0, 0, 63, 5] = math.nan
    assert ref.rel_err(out) == math.inf


def test_wrong_output_has_a_large_error():
    q, k, v = inputs()
    ref = correctness.Reference(torch, q, k, v, False, 0.2, full_sample(2, 3, 96))
    assert ref.rel_err(torch.zeros_like(q)) == pytest.approx(1.0)


def test_verdict():
    assert correctness.verdict(2.2e-3) is None
    assert "relative error 0.05" in correctness.verdict(0.05)
    assert "tolerance 0.01" in correctness.verdict(0.01)
    assert "NaN" in correctness.verdict(math.inf)
    assert "NaN" in correctness.verdict(math.nan)


def test_sample_small_shapes_check_everything():
    s = correctness.choose_sample(1, 4, 1024, random.Random(1))
    assert s.pairs == tuple((0, h) for h in range(4)) and s.rows == tuple(range(1024))
    assert s.describe(1, 4, 1024) == "all heads, all rows"


def test_sample_large_shapes_include_edges_and_vary_with_the_seed():
    b, h, lq = 2, 16, 16384
    s1 = correctness.choose_sample(b, h, lq, random.Random(1))
    s2 = correctness.choose_sample(b, h, lq, random.Random(2))
    for s in (s1, s2):
        assert len(s.pairs) == correctness.MAX_PAIRS and len(set(s.pairs)) == len(s.pairs)
        assert (0, 0) in s.pairs and (b - 1, h - 1) in s.pairs
        assert len(s.rows) == correctness.MAX_ROWS and list(s.rows) == sorted(set(s.rows))
        assert set(range(64)) <= set(s.rows) and set(range(lq - 64, lq)) <= set(s.rows)
        assert s.describe(b, h, lq) == "4 of 32 heads, 2048 of 16384 rows each"
    assert s1 != s2


def test_poisoned_call_returns_the_result_and_whether_it_reused_the_bait():
    result, poisoned = correctness.poisoned_call(torch, lambda: (torch.ones(6), torch.zeros(2)), 6, torch.float32,
                                                 "cpu")
    assert torch.equal(result[0], torch.ones(6)) and isinstance(poisoned, bool)
