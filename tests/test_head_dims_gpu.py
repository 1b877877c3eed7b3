"""Every head dim a stage serves besides 128 (its supports.head_dims: stage 24 on, 64, 96, 192 with
v 128, and 256), on the GPU, through the watchdog (gpu_watchdog.py): against float64 with the
output poisoned first (gpu_cases.check), over the contract — causal or not, lengths on and off the
head dim's own tile (kernel.cu's HeadDimTile<D>: 192 x 96 at head dim 64, 128 x 80 at 256), more
queries than keys, BSHD, strided and offset views, a strided out, grouped K/V heads — plus the
log-sum-exp, row maxima that move far (the rescale, rebase and recompute paths), BSHD against
BHSD and grouped against repeated K/V bit for bit, the empty cases, and the head dims a stage does
not serve refused before launch. Head dim 128 is the rest of the GPU suite's. The seeded fuzz of
each head dim is in test_fuzz_gpu.py, the numeric-range fuzz in test_numeric_fuzz_gpu.py.

    pytest -m gpu -rs tests/test_head_dims_gpu.py
"""

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine (torch.cuda.is_available() is false): the kernels run on an "
                "H200, see README", allow_module_level=True)

from conftest import GPU_SEED  # noqa: E402
from hopattn import lineage  # noqa: E402

STAGES = lineage.discover()
# (stage, q and k's head dim, v's) for every head dim but 128 of every stage that serves several
HEAD_DIMS = [(s, d, dv) for s in STAGES if len(s.head_dims) > 1 for d, dv in s.head_dims if (d, dv) != (128, 128)]
UNSERVED = ((80, 80), (192, 192), (64, 128), (32, 32))


def _ids(cases):
    return [f"{s.name}-d{d}" + (f"v{dv}" if dv != d else "") for s, d, dv, *_ in cases]


def runnable(stage):
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0) if stage.arch == "sm_90a" else major < 8:
        pytest.skip(f"{torch.cuda.get_device_name()} cannot run {stage.arch} code")


def _shapes(stage, d):
    """(batch, heads, kv_heads, len_q, len_k, causal, layout, view) on and off the head dim's tile."""
    c = stage.constants(d)
    m, n = c["BLOCK_M"], c["BLOCK_N"]
    return [
        (1, 1, 0, m, n, False, "bhsd", "contiguous"),  # one tile
        (3, 5, 0, 3 * m, 5 * n, False, "bhsd", "contiguous"),  # whole tiles
        (3, 5, 0, 3 * m + 1, 5 * n - 1, True, "bhsd", "contiguous"),  # one row past, one key short
        (2, 3, 0, 1024, 4096, False, "bshd", "strided"),
        (2, 3, 0, 1000, 3001, True, "bshd", "offset"),
        (1, 2, 0, 1000, 300, True, "bhsd", "contiguous"),  # queries 0..699 see no key: zero rows
        (1, 2, 0, 300, 1000, True, "bhsd", "contiguous"),  # fewer queries than keys
        (2, 8, 2, 700, 900, True, "bhsd", "contiguous"),  # grouped K/V heads
        (1, 32, 1, 513, 2049, False, "bshd", "contiguous"),  # multi-query
        (1, 1, 0, 1, 1, False, "bhsd", "contiguous"),
        (4, 16, 0, 2048, 2048, True, "bhsd", "contiguous"),  # more output tiles than SMs
        (1, 2, 0, 16384, 16384, False, "bhsd", "contiguous"),
    ]


CASES = [(s, d, dv, i, shape) for s, d, dv in HEAD_DIMS for i, shape in enumerate(_shapes(s, d))]


@pytest.mark.parametrize("stage, head_dim, head_dim_v, index, shape", CASES,
                         ids=[f"{name}-{c[3]:02d}" for name, c in zip(_ids(CASES), CASES)])
def test_head_dim_matches_float64_reference(gpu, stage, head_dim, head_dim_v, index, shape):
    runnable(stage)
    batch, heads, kv_heads, len_q, len_k, causal, layout, view = shape
    case = dict(batch=batch, heads=heads, kv_heads=kv_heads, len_q=len_q, len_k=len_k, causal=causal, layout=layout,
                view=view, head_dim=head_dim, head_dim_v=head_dim_v)
    seed = GPU_SEED + stage.number + head_dim + index
    out_view = "strided" if index % 4 == 3 else "contiguous"
    label = (f"stage {stage.id}, head dim {head_dim} (v {head_dim_v}), (B, H, Hkv, Lq, Lk)={shape[:5]}, "
             f"causal={causal}, layout={layout}, view={view}, out={out_view}, seed {seed}")
    gpu.call("check", label=label, timeout=120, stage=stage.number, shape=case, seed=seed, out_view=out_view,
             repeat=index < 3)


LSE = [(s, d, dv, causal) for s, d, dv in HEAD_DIMS for causal in (False, True)]


@pytest.mark.parametrize("stage, head_dim, head_dim_v, causal", LSE,
                         ids=[f"{name}-{'causal' if c[3] else 'full'}" for name, c in zip(_ids(LSE), LSE)])
def test_head_dim_log_sum_exp(gpu, stage, head_dim, head_dim_v, causal):
    runnable(stage)
    shape = dict(batch=2, heads=4, kv_heads=2, len_q=700, len_k=500, causal=causal, layout="bhsd",
                 view="contiguous", head_dim=head_dim, head_dim_v=head_dim_v)
    gpu.call("lse_matches", label=f"stage {stage.id}, head dim {head_dim}: log-sum-exp, causal={causal}",
             stage=stage.number, shape=shape, seed=GPU_SEED + head_dim)


MAXIMA = [(s, d, dv, kind, causal) for s, d, dv in HEAD_DIMS
          for kind in ("rising", "rising-slow", "jump", "jump-window", "falling") for causal in (False, True)]


@pytest.mark.parametrize("stage, head_dim, head_dim_v, kind, causal", MAXIMA,
                         ids=[f"{name}-{c[3]}-{'causal' if c[4] else 'full'}" for name, c in zip(_ids(MAXIMA), MAXIMA)])
def test_head_dim_row_maxima_that_move_far(gpu, stage, head_dim, head_dim_v, kind, causal):
    runnable(stage)
    seed = GPU_SEED + stage.number + head_dim
    gpu.call("moving_maxima", label=f"stage {stage.id}, head dim {head_dim}: maxima {kind}, causal={causal}, "
                                    f"seed {seed}",
             stage=stage.number, kind=kind, causal=causal, seed=seed, head_dim=head_dim, head_dim_v=head_dim_v)


SAME = [(s, d, dv, causal) for s, d, dv in HEAD_DIMS for causal in (False, True)]


@pytest.mark.parametrize("stage, head_dim, head_dim_v, causal", SAME,
                         ids=[f"{name}-{'causal' if c[3] else 'full'}" for name, c in zip(_ids(SAME), SAME)])
def test_head_dim_layouts_and_grouped_heads_agree_bit_for_bit(gpu, stage, head_dim, head_dim_v, causal):
    runnable(stage)
    what = f"stage {stage.id}, head dim {head_dim}, causal={causal}"
    gpu.call("layouts_agree", label=f"{what}: BSHD against BHSD", stage=stage.number, seed=GPU_SEED, causal=causal,
             head_dim=head_dim, head_dim_v=head_dim_v)
    gpu.call("gqa_equals_repeated_heads", label=f"{what}: GQA against repeated K/V", stage=stage.number,
             seed=GPU_SEED, causal=causal, head_dim=head_dim, head_dim_v=head_dim_v)


@pytest.mark.parametrize("stage, head_dim, head_dim_v", HEAD_DIMS, ids=_ids(HEAD_DIMS))
def test_head_dim_empty_inputs(gpu, stage, head_dim, head_dim_v):
    runnable(stage)
    gpu.call("empty_and_degenerate", label=f"stage {stage.id}, head dim {head_dim}: empty and degenerate shapes",
             stage=stage.number, head_dim=head_dim, head_dim_v=head_dim_v)


REFUSED = [(s, d, dv) for s in STAGES if s.number >= 17 for d, dv in UNSERVED if s.head_dim_v(d) != dv] + [
    (s, 64, 64) for s in STAGES if 17 <= s.number and s.head_dim_v(64) is None]


@pytest.mark.parametrize("stage, head_dim, head_dim_v", REFUSED, ids=_ids(REFUSED))
def test_head_dims_a_stage_does_not_serve_are_refused_before_launch(gpu, stage, head_dim, head_dim_v):
    runnable(stage)
    message = gpu.call("refuses_head_dim", label=f"stage {stage.id}: head dims ({head_dim}, {head_dim_v}) refused",
                       stage=stage.number, head_dim=head_dim, head_dim_v=head_dim_v)
    assert f"stage {stage.id} serves" in message and "head dim" in message, message
