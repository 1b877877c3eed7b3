"""Every stage against a float64 reference on the GPU.

Fresh random inputs each run (seeded from the clock, printed on failure), outputs poisoned with NaN
before launch, scores of magnitude 50 and more, shapes with Lq != Lk and batch/heads that are not
powers of two, and a second launch that must reproduce the first bit for bit (a moving result is a race).
"""

import math
import os
import time

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine: the kernels run on the H200 (see README)", allow_module_level=True)

import hopattn  # noqa: E402
from hopattn import lineage  # noqa: E402

STAGES = lineage.discover()
MAX_REL_ERR = 1e-2
SEED = int(os.environ.get("HOPATTN_TEST_SEED", time.time_ns() % 2**31))


def runnable(stage):
    major, minor = torch.cuda.get_device_capability()
    return (major, minor) == (9, 0) if stage.arch == "sm_90a" else major >= 8


def shapes_for(stage):
    """(batch, heads, len_q, len_k) for a stage, respecting its tile multiples."""
    m, n = stage.block_m, stage.block_n
    return [
        (1, 1, m, n),
        (3, 5, 3 * m, 5 * n),        # Lq != Lk, odd batch and heads
        (2, 3, 1024, 4096),
        (1, 1, 2 * m, 16384),        # few queries, long keys
        (1, 2, 16384, 16384),        # the longest the plan needs
    ]


def reference(q, k, v, scale, causal=False):
    """softmax(scale q kᵀ) v in float64, one (batch, head) at a time to bound memory."""
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    len_q, len_k = q.shape[2], k.shape[2]
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = (q[b, h].double() @ k[b, h].double().T) * scale
            if causal:  # bottom-right aligned: query i sees keys j <= i + len_k - len_q
                i = torch.arange(len_q, device=q.device)[:, None]
                j = torch.arange(len_k, device=q.device)[None, :]
                s = s.masked_fill(j > i + len_k - len_q, float("-inf"))
            out[b, h] = torch.softmax(s, dim=-1) @ v[b, h].double()
    return out


def rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def random_inputs(shape_q, shape_k, magnitude, gen):
    def draw(shape):
        return (torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32) * magnitude).to(torch.bfloat16)
    return draw(shape_q), draw(shape_k), draw(shape_k)


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_stage_matches_float64_reference(stage):
    if not runnable(stage):
        pytest.skip(f"{torch.cuda.get_device_name()} cannot run {stage.arch} code")
    gen = torch.Generator(device="cuda").manual_seed(SEED + stage.number)
    scale = 1 / math.sqrt(128)
    for batch, heads, len_q, len_k in shapes_for(stage):
        # magnitude 4: scores scale·q·k have a spread of about 16 and extremes well past ±50.
        q, k, v = random_inputs((batch, heads, len_q, 128), (batch, heads, len_k, 128), 4.0, gen)
        ref = reference(q, k, v, scale)
        peak = ((q[0, 0].float() @ k[0, 0].float().T) * scale).abs().max().item()
        out = torch.full_like(q, float("nan"))
        hopattn.attention(q, k, v, stage=stage.number, out=out)
        torch.cuda.synchronize()
        where = f"stage {stage.id}, shape {(batch, heads, len_q, len_k)}, seed {SEED}"
        assert not out.isnan().any(), f"unwritten or NaN outputs: {where}"
        err = rel_err(out, ref)
        assert err < MAX_REL_ERR, f"relative error {err:.2e}: {where}"
        again = torch.full_like(q, float("nan"))
        hopattn.attention(q, k, v, stage=stage.number, out=again)
        assert torch.equal(out, again), f"two launches on the same inputs differ (a race?): {where}"
        if len_k >= 4096:
            assert peak >= 50, f"the inputs should reach scores of 50 and more, reached {peak:.1f}"


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_compiled_kernel_matches_spec(stage):
    if not runnable(stage):
        pytest.skip(f"{torch.cuda.get_device_name()} cannot run {stage.arch} code")
    info = hopattn.stage_info(stage.number)
    assert info["threads"] == stage.threads
    assert info["max_threads"] == stage.threads  # __launch_bounds__(NUM_THREADS)
    assert info["static_smem"] + info["dynamic_smem"] == stage.smem_bytes
    assert (info["block_m"], info["block_n"]) == (stage.block_m, stage.block_n)
    if info["local_bytes"]:  # spills: allowed only where the notes explain them
        assert "spill" in stage.notes_path.read_text().lower(), f"{stage.name} uses local memory; notes.md must say why"


def test_functional_call_and_torch_compile_agree():
    stage = STAGES[-1]
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    q, k, v = random_inputs((2, 3, 256, 128), (2, 3, 512, 128), 1.0, gen)
    eager = hopattn.attention(q, k, v, stage=stage.number)
    compiled = torch.compile(lambda a, b, c: hopattn.attention(a, b, c, stage=stage.number) * 2, fullgraph=True)
    assert torch.equal(compiled(q, k, v), eager * 2)


def test_custom_scale_is_applied():
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    q, k, v = random_inputs((1, 2, 128, 128), (1, 2, 128, 128), 1.0, gen)
    out = hopattn.attention(q, k, v, stage=STAGES[-1].number, scale=0.3)
    assert rel_err(out, reference(q, k, v, 0.3)) < MAX_REL_ERR


def test_inputs_on_another_device_are_rejected():
    q = torch.zeros(1, 1, 128, 128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="k: expected a CUDA tensor"):
        hopattn.attention(q, q.cpu(), q, stage=1)


def test_out_aliasing_an_input_is_rejected():
    q = torch.zeros(1, 1, 128, 128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="out: must not share memory with q"):
        hopattn.attention(q, q.clone(), q.clone(), stage=1, out=q)
