"""The RMSNorm GPU cases cover what the contract promises (checked on the CPU, no GPU needed)."""

from rmsnorm_fuzz import DTYPES, EDGES, MAX_ELEMENTS, VIEWS, backward_cases, edge_cases, fuzz_cases


def test_cases_span_the_contract():
    cases = edge_cases() + fuzz_cases(1234)
    assert {c.dtype for c in cases} == set(DTYPES) and {c.view for c in cases} == set(VIEWS)
    cols = {c.cols for c in cases}
    assert {1, 4097, 65537, 262144, 524289} <= cols and any(c % 2 for c in cols)
    assert all(c.rows * c.cols <= max(MAX_ELEMENTS, c.cols) for c in cases)
    assert any(not c.weight for c in cases) and any(c.eps == 0 for c in cases)
    assert any(c.magnitude >= 1e4 for c in cases) and any(c.magnitude <= 1e-3 for c in cases)
    assert not any(c.dtype == "fp16" and c.magnitude > 1e4 for c in cases)  # fp16 stops at 65504


def test_fuzz_is_seeded():
    assert fuzz_cases(7) == fuzz_cases(7) != fuzz_cases(8)
    assert max(EDGES) > 262144  # past the longest row the clusters hold: the two-pass path


def test_backward_cases_span_the_contract():
    cases = backward_cases(1234)
    assert {c.dtype for c in cases} == set(DTYPES) and {c.view for c in cases} == set(VIEWS)
    assert {1, 16384, 16385, 262144, 262145, 524289} <= {c.cols for c in cases}  # one CTA, 16 CTAs, past them
    assert any(c.drstd for c in cases) and any(not c.drstd for c in cases)
    assert any(c.weight and not c.weight_grad for c in cases) and any(not c.weight for c in cases)
    assert backward_cases(7) == backward_cases(7) != backward_cases(8)
    assert "drstd" in next(c for c in cases if c.drstd).label()
