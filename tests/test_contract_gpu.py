"""The full contract on the GPU, for every stage that declares it (stage 17 on): causal, any length,
BSHD and strided views read in place. Through the watchdog (gpu_watchdog.py).

Causal attention is aligned bottom-right, as FlashAttention: query i sees keys j <= i + len_k - len_q.
A query that sees no key (causal with len_q > len_k) has an output of 0. The seeded fuzz over the
whole contract is test_fuzz_gpu.py.
"""

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine (torch.cuda.is_available() is false): the kernels run on an "
                "H200, see README", allow_module_level=True)

from conftest import GPU_SEED  # noqa: E402
from hopattn import lineage  # noqa: E402

FULL = [s for s in lineage.discover() if s.causal and s.tails and "bshd" in s.layouts]
ODD_LENGTHS = [(1, 1), (1, 300), (300, 1), (127, 129), (129, 127), (200, 1000), (1000, 200), (4097, 4099), (64, 64)]
CASES = [(s, causal, lengths) for s in FULL for causal in (False, True) for lengths in ODD_LENGTHS]


def _shape(batch, heads, len_q, len_k, causal, layout="bhsd", view="contiguous"):
    return dict(batch=batch, heads=heads, len_q=len_q, len_k=len_k, causal=causal, layout=layout, view=view,
                kv_heads=0)


def _label(stage, shape, seed):
    return (f"stage {stage.id}, (B, H, Lq, Lk)=({shape['batch']}, {shape['heads']}, {shape['len_q']}, "
            f"{shape['len_k']}), causal={shape['causal']}, layout={shape['layout']}, view={shape['view']}, seed {seed}")


@pytest.mark.parametrize("stage, causal, lengths", CASES,
                         ids=[f"{s.name}-{'causal' if c else 'full'}-{lq}x{lk}" for s, c, (lq, lk) in CASES])
def test_lengths_that_are_not_tile_multiples(gpu, stage, causal, lengths):
    shape, seed = _shape(2, 3, *lengths, causal), GPU_SEED + stage.number
    gpu.call("check", label=_label(stage, shape, seed), stage=stage.number, shape=shape, seed=seed)


@pytest.mark.parametrize("stage", FULL, ids=[s.name for s in FULL])
def test_causal_with_more_queries_than_keys_gives_zero_rows(gpu, stage):
    shape, seed = _shape(1, 2, 1000, 300, True), GPU_SEED + stage.number  # queries 0..699 see no key
    gpu.call("check", label=_label(stage, shape, seed), stage=stage.number, shape=shape, seed=seed)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("stage", FULL, ids=[s.name for s in FULL])
def test_bshd_is_read_in_place_and_matches_bhsd(gpu, stage, causal):
    seed = GPU_SEED + stage.number
    shape = _shape(2, 5, 777, 1029, causal, layout="bshd")
    gpu.call("check", label=_label(stage, shape, seed), stage=stage.number, shape=shape, seed=seed)
    gpu.call("layouts_agree", label=f"stage {stage.id}: BSHD against BHSD, causal={causal}, seed {seed}",
             stage=stage.number, seed=seed, causal=causal)


@pytest.mark.parametrize("stage", FULL, ids=[s.name for s in FULL])
def test_strided_views_are_read_without_a_copy(gpu, stage):
    gpu.call("strided_equals_contiguous", label=f"stage {stage.id}: strided views, seed {GPU_SEED}",
             stage=stage.number, seed=GPU_SEED)


@pytest.mark.parametrize("stage", FULL, ids=[s.name for s in FULL])
def test_repeated_launches_agree_bit_for_bit(gpu, stage):
    shape, seed = _shape(3, 7, 1500, 1500, True), GPU_SEED + stage.number
    gpu.call("check", label=_label(stage, shape, seed), stage=stage.number, shape=shape, seed=seed, repeat=True)


GQA = [s for s in FULL if s.gqa]
LSE = [s for s in FULL if s.lse]
LSE_SHAPES = [(2, 3, 300, 1000, False, "bhsd"), (2, 4, 1000, 300, True, "bshd"), (1, 8, 4097, 4099, True, "bhsd")]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("stage", GQA, ids=[s.name for s in GQA])
def test_grouped_kv_heads_equal_repeated_heads(gpu, stage, causal):
    gpu.call("gqa_equals_repeated_heads", label=f"stage {stage.id}: GQA against repeated K/V, causal={causal}",
             stage=stage.number, seed=GPU_SEED, causal=causal)


@pytest.mark.parametrize("case", LSE_SHAPES, ids=[f"{c[0]}x{c[1]}x{c[2]}x{c[3]}-{'causal' if c[4] else 'full'}-{c[5]}"
                                                  for c in LSE_SHAPES])
@pytest.mark.parametrize("stage", LSE, ids=[s.name for s in LSE])
def test_log_sum_exp_against_float64(gpu, stage, case):
    batch, heads, len_q, len_k, causal, layout = case
    shape = dict(_shape(batch, heads, len_q, len_k, causal, layout), kv_heads=heads // 2 if stage.gqa else 0)
    gpu.call("lse_matches", label=_label(stage, shape, GPU_SEED) + ", log-sum-exp", stage=stage.number, shape=shape,
             seed=GPU_SEED)
