"""The full contract on the GPU, for every stage that declares it (stage 17 on): causal, any length, BSHD.

Causal attention is aligned bottom-right, as FlashAttention: query i sees keys j <= i + len_k - len_q.
A query that sees no key (causal with len_q > len_k) has an output of 0, as FlashAttention's.
Every check is against float64 on fresh random inputs (seed printed on failure), outputs poisoned
with NaN before the launch.
"""

import math
import os
import random
import time

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine: the kernels run on the H200 (see README)", allow_module_level=True)

import hopattn  # noqa: E402
from hopattn import lineage  # noqa: E402

FULL = [s for s in lineage.discover() if s.causal and s.tails and "bshd" in s.layouts]
SEED = int(os.environ.get("HOPATTN_TEST_SEED", time.time_ns() % 2**31))
MAX_REL_ERR = 1e-2
SCALE = 1 / math.sqrt(128)


def reference(q, k, v, causal):
    """BHSD float64 reference; rows that see no key are 0."""
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    len_q, len_k = q.shape[2], k.shape[2]
    i = torch.arange(len_q, device=q.device)[:, None]
    j = torch.arange(len_k, device=q.device)[None, :]
    visible = (j <= i + len_k - len_q) if causal else torch.ones(len_q, len_k, dtype=torch.bool, device=q.device)
    seen = visible.any(-1)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = (q[b, h].double() @ k[b, h].double().T) * SCALE
            s = s.masked_fill(~visible, float("-inf"))
            out[b, h][seen] = torch.softmax(s[seen], dim=-1) @ v[b, h].double()
    return out


def draw(shape, gen, magnitude=4.0):
    return (torch.randn(shape, generator=gen, device="cuda") * magnitude).to(torch.bfloat16)


def check(stage, batch, heads, len_q, len_k, causal, gen, layout="bhsd"):
    where = f"stage {stage.id}, {(batch, heads, len_q, len_k)}, causal={causal}, layout={layout}, seed {SEED}"
    q, k, v = draw((batch, heads, len_q, 128), gen), draw((batch, heads, len_k, 128), gen), draw(
        (batch, heads, len_k, 128), gen)
    if layout == "bshd":  # the same values, stored BSHD: the kernel must read them in place
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    out = torch.full_like(q, float("nan"))
    hopattn.attention(q, k, v, causal=causal, stage=stage.number, layout=layout, out=out)
    torch.cuda.synchronize()
    if layout == "bshd":
        q, k, v, out = (t.transpose(1, 2) for t in (q, k, v, out))
    assert not out.isnan().any(), f"unwritten or NaN outputs: {where}"
    ref = reference(q, k, v, causal)
    err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err < MAX_REL_ERR, f"relative error {err:.2e}: {where}"
    return out


@pytest.mark.parametrize("stage", FULL, ids=[s.name for s in FULL])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_lengths_that_are_not_tile_multiples(stage, causal):
    gen = torch.Generator(device="cuda").manual_seed(SEED + stage.number)
    for len_q, len_k in [(1, 1), (1, 300), (300, 1), (127, 129), (129, 127), (200, 1000), (1000, 200),
                         (4097, 4099), (64, 64)]:
        check(stage, 2, 3, len_q, len_k, causal, gen)


@pytest.mark.parametrize("stage", FULL, ids=[s.name for s in FULL])
def test_random_lengths_up_to_20000(stage):
    rng = random.Random(SEED)
    gen = torch.Generator(device="cuda").manual_seed(SEED + stage.number)
    for _ in range(6):
        len_q, len_k = rng.randint(1, 20000), rng.randint(1, 20000)
        check(stage, 1, rng.randint(1, 3), len_q, len_k, rng.random() < 0.5, gen)


@pytest.mark.parametrize("stage", FULL, ids=[s.name for s in FULL])
def test_causal_with_more_queries_than_keys_gives_zero_rows(stage):
    gen = torch.Generator(device="cuda").manual_seed(SEED + stage.number)
    out = check(stage, 1, 2, 1000, 300, True, gen)  # queries 0..699 see no key
    assert torch.equal(out[:, :, :700], torch.zeros_like(out[:, :, :700]))
    assert out[:, :, 700:].abs().amax() > 0


@pytest.mark.parametrize("stage", FULL, ids=[s.name for s in FULL])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bshd_is_read_in_place_and_matches_bhsd(stage, causal):
    gen = torch.Generator(device="cuda").manual_seed(SEED + stage.number)
    check(stage, 2, 5, 777, 1029, causal, gen, layout="bshd")
    q, k, v = (draw((2, 300, 5, 128), gen) for _ in range(3))
    bshd = hopattn.attention(q, k, v, causal=causal, stage=stage.number, layout="bshd")
    bhsd = hopattn.attention(*(t.transpose(1, 2).contiguous() for t in (q, k, v)), causal=causal, stage=stage.number)
    assert torch.equal(bshd.transpose(1, 2), bhsd), "the layout changed the result"


@pytest.mark.parametrize("stage", FULL, ids=[s.name for s in FULL])
def test_strided_views_are_read_without_a_copy(stage):
    """A head-dim slice of a wider tensor: rows 512 bytes apart, read through the strides."""
    gen = torch.Generator(device="cuda").manual_seed(SEED + stage.number)
    wide = draw((2, 3, 640, 256), gen)
    q, k = wide[..., :128], wide[..., 128:]  # views: not contiguous, read in place
    v = draw((2, 3, 640, 128), gen)
    out = hopattn.attention(q, k, v, stage=stage.number)
    ref = hopattn.attention(q.contiguous(), k.contiguous(), v, stage=stage.number)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("stage", FULL, ids=[s.name for s in FULL])
def test_repeated_launches_agree_bit_for_bit(stage):
    gen = torch.Generator(device="cuda").manual_seed(SEED + stage.number)
    q, k, v = (draw((3, 7, 1500, 128), gen) for _ in range(3))
    first = hopattn.attention(q, k, v, causal=True, stage=stage.number)
    for _ in range(3):
        assert torch.equal(hopattn.attention(q, k, v, causal=True, stage=stage.number), first)
