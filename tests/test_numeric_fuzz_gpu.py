"""The numeric-range fuzz (numeric_cases.py) on every stage with the full contract (17 on), and a
sweep of the softmax scale from 1e-3 to 1e3: each case against float64 with the output poisoned
first, within the bound a float32 computation on the same bf16 inputs sets (gpu_cases.numeric_check),
through the watchdog.

    pytest -m gpu tests/test_numeric_fuzz_gpu.py                       # a fresh seed (in the header)
    HOPATTN_TEST_SEED=1234 pytest -m gpu tests/test_numeric_fuzz_gpu.py  # the same cases and inputs again
"""

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine (torch.cuda.is_available() is false): the kernels run on an "
                "H200, see README", allow_module_level=True)

from conftest import GPU_SEED  # noqa: E402
from hopattn import lineage  # noqa: E402
from numeric_cases import NumericCase, numeric_cases  # noqa: E402

# Stages 17-19 read no grouped K/V heads: numeric_check repeats them for those (the same arithmetic).
FULL = [s for s in lineage.discover() if s.causal and s.tails and s.strided]
NUMERIC = numeric_cases(GPU_SEED)
# Case by case, each stage in turn: the worker keeps the last references (float64 and float32).
CASES = [(s, i, c) for i, c in enumerate(NUMERIC) for s in FULL]


# The range of the scores every stage computes exactly: |scale q·k| up to 2^30 log2 units (7.4e8 in
# natural units; real models stay below 10^4). Each exponential is 2^(s scale_log2 - m scale_log2), one
# FFMA against the row maximum times the scale rounded once per row: the common factor that rounding
# leaves cancels in the division, but past 2^30 it reaches 2^64 and more, and exponentials overflow or
# underflow together. A case beyond it is reported as a skip naming its scores, not launched.
EXPONENT_LIMIT = 2.0 ** 30


@pytest.mark.parametrize("stage, index, case", CASES, ids=[f"{s.name}-{i:03d}-{c.kind}" for s, i, c in CASES])
def test_numeric_range(gpu, stage, index, case):
    seed = GPU_SEED + index
    result = gpu.call("numeric_check", label=f"stage {stage.id}, numeric #{index}, {case.label()}, seed {seed}",
                      timeout=60, stage=stage.number, case=case.asdict(), seed=seed,
                      exponent_limit=EXPONENT_LIMIT)
    if "beyond" in result:
        pytest.skip(f"scores reach {result['beyond']:.3g} log2 units, past the kernels' range (2^30)")


# The head dims besides 128 of the stages that serve several (stage 24 on): the first
# HEAD_DIM_COUNT numeric cases at each, v of its own head dim (gpu_cases.numeric_inputs).
HEAD_DIM_COUNT = 48
HEAD_DIM_CASES = [(s, d, dv, i, c) for s in FULL if len(s.head_dims) > 1 for d, dv in s.head_dims
                  if (d, dv) != (128, 128) for i, c in enumerate(NUMERIC[:HEAD_DIM_COUNT])]


@pytest.mark.parametrize("stage, head_dim, head_dim_v, index, case", HEAD_DIM_CASES,
                         ids=[f"{s.name}-d{d}-{i:03d}-{c.kind}" for s, d, _, i, c in HEAD_DIM_CASES])
def test_numeric_range_head_dims(gpu, stage, head_dim, head_dim_v, index, case):
    seed = GPU_SEED + index
    result = gpu.call("numeric_check", label=f"stage {stage.id}, head dim {head_dim} (v {head_dim_v}), numeric "
                                             f"#{index}, {case.label()}, seed {seed}",
                      timeout=60, stage=stage.number, case={**case.asdict(), "head_dim": head_dim,
                                                            "head_dim_v": head_dim_v},
                      seed=seed, exponent_limit=EXPONENT_LIMIT)
    if "beyond" in result:
        pytest.skip(f"scores reach {result['beyond']:.3g} log2 units, past the kernels' range (2^30)")


# The report: unit-normal inputs, a few hundred queries and keys, two batches, three heads.
SWEEP_SCALES = [10.0 ** (e / 2) for e in range(-6, 7)]  # 1e-3, 3.2e-3, ..., 1e3
SWEEP = [(s, scale, causal) for s in FULL for scale in SWEEP_SCALES for causal in (False, True)]


@pytest.mark.parametrize("stage, scale, causal", SWEEP,
                         ids=[f"{s.name}-scale{scale:.3g}-{'causal' if c else 'full'}" for s, scale, c in SWEEP])
def test_scale_sweep(gpu, stage, scale, causal):
    case = NumericCase("normal", scale, 1.0, causal, batch=2, heads=3, kv_heads=3, len_q=300, len_k=500)
    seed = GPU_SEED + int(scale * 1000) % 997 + causal
    result = gpu.call("numeric_check", label=f"stage {stage.id}, scale sweep, {case.label()}, seed {seed}",
                      timeout=60, stage=stage.number, case=case.asdict(), seed=seed)
    print(f"stage {stage.id} scale {scale:.3g} causal={causal}: error {result['err']:.3g}, bound {result['bound']:.3g}")
