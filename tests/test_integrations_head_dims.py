"""Head dims through hopattn.integrations on CPU: every (q and k, v) head-dim pair the final forward
stage serves (its stage.toml's supports.head_dims: stage 24's 64, 96, 128, 256 and q/k 192 with v
128, DeepSeek's MLA prefill) is routed to hopattn, with v's head dim in the output and the default
scale of q's; a head dim it does not serve falls back with a counted reason naming those it does;
a call that needs a gradient is served only where the backward serves its head dim (128), else it
falls back with that reason and gets the fallback's gradient, never none.

As in test_integrations.py, hopattn's call is the float64 reference on CPU (Spy); the limits are
the real ones of the final stage, and on meta tensors hopattn's own ops check them (their fake
implementations run the same contract as a launch).
"""

from __future__ import annotations

import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")
from hopattn import lineage  # noqa: E402
from hopattn.integrations import kernels, routing  # noqa: E402
from hopattn.integrations.routing import RoutingError  # noqa: E402
from test_integrations import BF16, cpu_hopattn, needs_df, needs_tf, rel_err, tiny_llama  # noqa: E402
from test_training_integrations import OpLog, grads_of  # noqa: E402

try:
    import transformers
    from hopattn.integrations import transformers as hop_tf
except ImportError:
    transformers = None
try:
    import diffusers
    from diffusers.models import attention_dispatch as ad
    from hopattn.integrations import diffusers as hop_df
except ImportError:
    diffusers = None

FINAL = kernels.hopattn_kernel()
SERVED = FINAL.head_dims  # read from the final stage's spec
STAGE_24 = ((64, 64), (96, 96), (128, 128), (192, 128), (256, 256))  # kernels/attention/24_head-dims/stage.toml
SERVED_TEXT = "64, 96, 128, 192 (v 128) and 256"  # how a reason names stage 24's pairs (as hopattn's errors do)
GRAD_64 = "gradient needed at head dim 64 (the backward serves 128)"
GRAD_MLA = "gradient needed at head dims q/k 192, v 128 (the backward serves 128)"


def pair_id(pair) -> str:
    return f"{pair[0]}" if pair[0] == pair[1] else f"{pair[0]}-v{pair[1]}"


def bhsd(d, dv, heads=4, kv_heads=2, len_q=8, len_k=8, seed=0, grad=False, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, len_q, d, generator=g).to(BF16)
    k = torch.randn(1, kv_heads, len_k, d, generator=g).to(BF16)
    v = torch.randn(1, kv_heads, len_k, dv, generator=g).to(BF16)
    return tuple(t.to(device).requires_grad_(grad) for t in (q, k, v))


# --- what the kernel description serves, read from the specs -------------------------------------


def test_the_final_stage_serves_stage_24s_pairs_and_the_kernel_reads_them_from_its_spec():
    import hopattn

    final = {s.number: s for s in hopattn.stages()}[hopattn.final_stage()]
    assert SERVED == final.head_dims
    assert lineage.get_stage(24).head_dims == STAGE_24  # the stage the brief is about, as its stage.toml says
    assert set(STAGE_24) <= set(SERVED)  # a later stage may serve more, not less
    assert kernels.hopattn_kernel(stage=23).head_dims == ((128, 128),)  # no supports.head_dims: tile.head_dim
    assert kernels.head_dims_text(STAGE_24) == SERVED_TEXT == lineage.get_stage(24).head_dims_text()


def test_head_dims_come_from_the_stage_specs_not_from_the_glue(monkeypatch):
    """Change the specs, and the kernel description follows: forward pairs and backward dims alike."""
    from hopattn import api
    from hopattn import backward as bwd

    stage = api._stage(None)
    back = bwd._stage(None)
    monkeypatch.setitem(api._STAGES, stage.number, dataclasses.replace(stage, head_dims=((80, 80), (128, 128),
                                                                                          (160, 96))))
    monkeypatch.setitem(bwd._STAGES, back.number, dataclasses.replace(back, head_dims=((80, 80), (128, 128))))
    kern = kernels.hopattn_kernel()
    assert kern.head_dims == ((80, 80), (128, 128), (160, 96))
    assert kern.backward_head_dims == ((80, 80), (128, 128))
    monkeypatch.setitem(bwd._STAGES, back.number, dataclasses.replace(back, head_dims=((64, 64),)))
    assert kernels.hopattn_kernel().backward_head_dims == ()  # the backward serves none the forward does


def test_backward_dims_are_what_hopattn_backward_accepts():
    """The gradient is offered exactly where hopattn's backward op takes the tensors: for every pair
    the forward serves, its checks (the fake implementation, on meta tensors) pass iff the kernel
    description says the backward serves it."""
    from hopattn import backward as bwd

    assert FINAL.backward and FINAL.backward_head_dims == ((128, 128),)
    for d, dv in SERVED:
        q, k, v = bhsd(d, dv, device="meta")
        out = torch.empty(*q.shape[:3], dv, dtype=BF16, device="meta")
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device="meta")
        try:
            bwd.attention_backward(out, q, k, v, out, lse, causal=True)
            accepted = True
        except ValueError as err:
            accepted = False
            assert "head dim" in str(err) or "shape" in str(err), err
        assert accepted == ((d, dv) in FINAL.trained_head_dims), (d, dv)


@pytest.mark.parametrize("pair", SERVED, ids=pair_id)
def test_every_served_pair_is_accepted_by_hopattns_own_forward_checks(pair):
    """The real op's checks (meta tensors: its fake implementation) take what the description serves,
    and give an output of v's head dim."""
    import hopattn

    d, dv = pair
    q, k, v = bhsd(d, dv, device="meta")
    assert FINAL.unsupported(q, k, v, True) is not None  # device meta: the real description runs on cuda
    meta = dataclasses.replace(FINAL, devices=("meta",))
    assert meta.unsupported(q, k, v, True) is None
    out = hopattn.attention(q, k, v, causal=True)
    assert tuple(out.shape) == (1, 4, 8, dv)


def test_unsupported_names_the_reason_for_each_head_dim():
    kern = dataclasses.replace(FINAL, devices=("cpu",))
    for d, dv in SERVED:
        q, k, v = bhsd(d, dv)
        assert kern.unsupported(q, k, v, True) is None, (d, dv)
        want = None if (d, dv) == (128, 128) else (GRAD_MLA if (d, dv) == (192, 128) else
                                                   f"gradient needed at head dim {d} (the backward serves 128)")
        assert kern.unsupported(q, k, v, True, grad=True) == want, (d, dv)
        assert kern.unsupported(q, k, v, True, grad=True, deterministic=True) == want, (d, dv)
    for d in (80, 160, 32):
        q, k, v = bhsd(d, d)
        assert kern.unsupported(q, k, v, False) == f"head dim {d} (hopattn serves {SERVED_TEXT})"
    # v's head dim differs from q's only where the stage serves the pair
    for d, dv in ((128, 64), (64, 128), (256, 128)):
        q, k, v = bhsd(d, dv)
        assert kern.unsupported(q, k, v, False) == f"head dims q/k {d}, v {dv} (hopattn serves {SERVED_TEXT})"
    q, k, v = bhsd(192, 192)  # 192 is served with v of 128 only
    assert kern.unsupported(q, k, v, False) == f"head dim 192 (hopattn serves {SERVED_TEXT})"
    q, _, v = bhsd(192, 128)
    _, k, _ = bhsd(128, 128)
    assert kern.unsupported(q, k, v, False) == "head dims of q and k differ (q 192, k 128)"
    # a kernel whose description has a backward at every head dim (None) serves gradients at them all
    ref = kernels.reference_kernel(devices=("cpu",), head_dims=SERVED)
    assert all(ref.unsupported(*bhsd(d, dv), True, grad=True) is None for d, dv in SERVED)
    assert dataclasses.replace(ref, backward=False).trained_head_dims == ()


def test_kernel_head_dims_take_ints_as_before():
    """An int d still means (d, d): the benchmark's FlashAttention descriptions list ints."""
    kern = kernels.Kernel(name="k", call=None, head_dims=(64, 96, (192, 128)))
    assert kern.head_dims == ((64, 64), (96, 96), (192, 128))
    assert dataclasses.replace(kern, label="x").head_dims == kern.head_dims
    assert kernels.Kernel(name="k", call=None).head_dims == ((128, 128),)


def test_call_shape_records_vs_head_dim():
    q, k, v = bhsd(192, 128)
    shape = routing.shape_of("x", q, k, True, "bhsd", v=v)
    assert shape.head_dim == 192 and shape.head_dim_v == 128
    assert "D=192 Dv=128" in shape.describe()
    assert routing.CallShape(**shape.to_dict()) == shape  # as the model benchmark reads captured calls back
    q, k, v = bhsd(64, 64)
    same = routing.shape_of("x", q, k, True, "bhsd")
    assert same == routing.shape_of("x", q, k, True, "bhsd", v=v)
    assert same.head_dim_v is None and same.to_dict()["head_dim_v"] == 64 and "Dv" not in same.describe()
    assert routing.CallShape(**same.to_dict()) == same
    assert routing.CallShape("x", 1, 4, 2, 8, 8, 128, True, "bhsd", "bfloat16").head_dim_v is None


def test_reference_gives_vs_head_dim_with_qs_default_scale():
    q, k, v = (t.double() for t in bhsd(192, 128))
    out = kernels.reference_attention(q, k, v, causal=True)
    assert out.shape == (1, 4, 8, 128)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.allclose(out, want, atol=1e-12)  # SDPA's default scale: 1/sqrt(q's head dim)
    assert not torch.allclose(out, kernels.reference_attention(q, k, v, causal=True, scale=128 ** -0.5))
    with pytest.raises(ValueError, match="k of q's head dim"):
        kernels.reference_attention(q, v, v)


# --- transformers --------------------------------------------------------------------------------


@pytest.fixture
def tf_registered(monkeypatch):
    kern, spy = cpu_hopattn(monkeypatch, gqa=True)
    hop_tf.register(kernel=kern)
    yield spy
    hop_tf.unregister()


def logits(model, ids, impl):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(ids).logits


@needs_tf
@pytest.mark.parametrize("pair", SERVED, ids=pair_id)
def test_transformers_attention_function_serves_every_pair(tf_registered, pair):
    """The function models call, on BHSD q, k (GQA) and v of v's head dim: served, in place, with q's
    default scale, out BSHD of v's head dim, as SDPA's."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    d, dv = pair
    module = tiny_llama(layers=1).model.layers[0].self_attn
    attention = transformers.AttentionInterface._global_mapping["hopattn"]
    q, k, v = bhsd(d, dv, len_q=8, len_k=11)
    with routing.track(strict=True) as report:
        out, weights = attention(module, q, k[:, :, :8], v[:, :, :8], None)
    assert weights is None and report.served == 1 and report.modes == {routing.DIRECT: 1}
    (shape, _), = report.shapes
    assert (shape.head_dim, shape.head_dim_v or shape.head_dim) == (d, dv)
    call = tf_registered.calls[-1]
    assert call["q"][-1] == d and call["v"][-1] == dv and call["scale"] == 1 / math.sqrt(d)
    assert out.shape == (1, 8, 4, dv)
    want = kernels.reference_attention(q, k[:, :, :8], v[:, :, :8], causal=True).transpose(1, 2)
    assert torch.equal(out, want)
    sdpa, _ = sdpa_attention_forward(module, q, k[:, :, :8], v[:, :, :8], None)
    assert sdpa.shape == out.shape and rel_err(out, sdpa) < 1e-2


@needs_tf
@pytest.mark.parametrize("dim", sorted({d for d, dv in SERVED if d == dv}))
def test_llama_at_every_served_head_dim_is_served_strictly_and_matches_sdpa(tf_registered, dim):
    model = tiny_llama(head_dim=dim)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(dim))
    ref = logits(model, ids, "sdpa")
    with routing.track(strict=True) as report:
        out = logits(model, ids, "hopattn")
    assert report.calls == report.served == 2
    assert {c["q"][-1] for c in tf_registered.calls} == {dim}
    assert rel_err(out, ref) < 2e-2


@needs_tf
@pytest.mark.parametrize("dim", [80, 160])
def test_llama_at_an_unserved_head_dim_falls_back_with_the_served_dims_named(tf_registered, dim):
    model = tiny_llama(head_dim=dim)
    ids = torch.randint(0, 256, (1, 8))
    ref = logits(model, ids, "sdpa")
    reason = f"head dim {dim} (hopattn serves {SERVED_TEXT})"
    with routing.track() as report:
        out = logits(model, ids, "hopattn")
    assert torch.equal(out, ref) and report.fallbacks == {reason: 2} and report.targets[reason] == "SDPA"
    assert f"2 sent to SDPA: {reason}" in report.summary() and not tf_registered.calls
    with pytest.raises(RoutingError, match=rf"D={dim} .*: head dim {dim} \(hopattn serves 64, 96, 128, 192 \(v 128\) and 256\)"):
        with routing.track(strict=True):
            logits(model, ids, "hopattn")


def tiny_deepseek(**extra):
    """DeepSeek-V3's multi-head latent attention, tiny: q and k of 128 + 64 (rope) = 192, v of 128."""
    torch.manual_seed(0)
    cfg = transformers.DeepseekV3Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        n_group=1, topk_group=1, first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, attn_implementation="sdpa", **extra)
    return transformers.DeepseekV3ForCausalLM(cfg).to(BF16).eval()


@needs_tf
@pytest.mark.skipif((192, 128) not in SERVED, reason="the final stage does not serve q/k 192 with v 128")
def test_deepseek_mla_prefill_192_128_is_served_with_vs_head_dim(tf_registered):
    model = tiny_deepseek()
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(3))
    ref = logits(model, ids, "sdpa")
    with routing.track(strict=True) as report:
        out = logits(model, ids, "hopattn")
    assert report.calls == report.served == 2
    assert {(c["q"][-1], c["k"][-1], c["v"][-1]) for c in tf_registered.calls} == {(192, 192, 128)}
    assert {(s.head_dim, s.head_dim_v) for s, _ in report.shapes} == {(192, 128)}
    attn = model.model.layers[0].self_attn
    assert {c["scale"] for c in tf_registered.calls} == {attn.scaling}  # the model's own scaling reached the kernel
    assert rel_err(out, ref) < 2e-2


@needs_tf
def test_llama_training_at_head_dim_64_falls_back_with_the_gradient_reason_and_sdpas_gradients(tf_registered):
    model = tiny_llama(head_dim=64).train()
    ids = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(4))

    def step(impl):
        model.set_attn_implementation(impl)
        model.zero_grad(set_to_none=True)
        loss = model(ids, labels=ids).loss
        loss.backward()
        return loss.detach(), grads_of(model)

    ref_loss, ref = step("sdpa")
    with routing.track() as report:
        loss, got = step("hopattn")
    assert report.served == 0 and report.fallbacks == {GRAD_64: 2} and report.targets[GRAD_64] == "SDPA"
    assert not tf_registered.calls
    assert torch.equal(loss, ref_loss) and got.keys() == ref.keys()
    assert any("q_proj" in n for n in got) and all(torch.equal(got[n], g) for n, g in ref.items())
    with pytest.raises(RoutingError, match=r"gradient needed at head dim 64 \(the backward serves 128\)"):
        with routing.track(strict=True):
            step("hopattn")
    with torch.no_grad(), routing.track(strict=True) as report:  # the same model in inference: served
        model(ids)
    assert report.served == 2 and report.backward == 0


@needs_tf
@pytest.mark.skipif((192, 128) not in SERVED, reason="the final stage does not serve q/k 192 with v 128")
def test_deepseek_training_falls_back_with_the_gradient_reason(tf_registered):
    model = tiny_deepseek().train()
    ids = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(5))

    def step(impl):
        model.set_attn_implementation(impl)
        model.zero_grad(set_to_none=True)
        model(ids, labels=ids).loss.backward()
        return grads_of(model)

    ref = step("sdpa")
    with routing.track() as report:
        got = step("hopattn")
    assert report.fallbacks == {GRAD_MLA: 2} and not tf_registered.calls
    assert got.keys() == ref.keys() and all(torch.equal(got[n], g) for n, g in ref.items())


@needs_tf
def test_hopattns_ops_on_meta_tensors_serve_192_128_forward_and_refuse_its_gradient_before_any_launch():
    """The real description and hopattn's own ops (fake implementations on meta tensors): MLA's
    forward reaches the op with v of 128 and gives out of 128; the same call needing a gradient goes
    to SDPA instead of reaching a backward that would refuse it."""
    hop_tf.register(kernel=dataclasses.replace(FINAL, devices=("meta",)))
    try:
        with torch.device("meta"):
            module = tiny_llama(layers=1).model.layers[0].self_attn
        attention = transformers.AttentionInterface._global_mapping["hopattn"]
        q, k, v = bhsd(192, 128, device="meta")
        with torch.no_grad(), routing.track(strict=True) as report, OpLog() as ops:
            out, _ = attention(module, q, k, v, None)
        assert report.served == 1 and [name for name, _ in ops.calls] == ["attention"]
        assert ops.calls[0][1][2].shape[-1] == 128 and out.shape == (1, 8, 4, 128)
        q, k, v = bhsd(64, 64, grad=True, device="meta")
        with routing.track() as report, OpLog() as ops:
            out, _ = attention(module, q, k, v, None)
            out.sum().backward()
        assert report.fallbacks == {GRAD_64: 1} and ops.calls == []
        assert q.grad.shape == q.shape and v.grad.shape == v.shape
    finally:
        hop_tf.unregister()


# --- diffusers -----------------------------------------------------------------------------------


@pytest.fixture
def df_registered(monkeypatch):
    kern, spy = cpu_hopattn(monkeypatch, gqa=True)
    hop_df.register(kernel=kern)
    yield spy
    hop_df.unregister()


def dispatch(q, k, v, **kw):
    return ad.dispatch_attention_fn(q, k, v, backend=ad.AttentionBackendName("hopattn"), **kw)


def native(**kw):
    return ad._AttentionBackendRegistry._backends[ad.AttentionBackendName.NATIVE](**kw)


def bshd(d, dv, seed=0, grad=False):
    return tuple(t.transpose(1, 2).detach().requires_grad_(grad)
                 for t in bhsd(d, dv, heads=2, kv_heads=2, len_q=9, len_k=12, seed=seed))


@needs_df
@pytest.mark.parametrize("pair", SERVED, ids=pair_id)
def test_diffusers_dispatch_serves_every_pair_with_vs_head_dim(df_registered, pair):
    d, dv = pair
    q, k, v = bshd(d, dv)
    with routing.track(strict=True) as report:
        out = dispatch(q, k, v)
    assert report.served == 1 and report.modes == {routing.DIRECT: 1}
    call = df_registered.calls[-1]
    assert call["layout"] == "bshd" and call["q"][-1] == d and call["v"][-1] == dv
    assert call["scale"] == 1 / math.sqrt(d)  # q's head dim, as the native backend's default
    assert out.shape == (1, 9, 2, dv)
    assert torch.equal(out, kernels.reference_attention(q, k, v, layout="bshd"))
    assert rel_err(out, native(query=q, key=k, value=v)) < 1e-2
    with routing.track(strict=True):  # a scale the model passes reaches the kernel as it is
        scaled = dispatch(q, k, v, scale=0.05)
    assert df_registered.calls[-1]["scale"] == 0.05
    assert torch.equal(scaled, kernels.reference_attention(q, k, v, layout="bshd", scale=0.05))


@needs_df
@pytest.mark.parametrize("dims", [(80, 80), (160, 160), (128, 64)], ids=["80", "160", "128-v64"])
def test_diffusers_unserved_head_dims_fall_back_to_native_counted(df_registered, dims):
    d, dv = dims
    q, k, v = bshd(d, dv)
    reason = (f"head dim {d}" if d == dv else f"head dims q/k {d}, v {dv}") + f" (hopattn serves {SERVED_TEXT})"
    with routing.track() as report:
        out = dispatch(q, k, v)
    assert report.fallbacks == {reason: 1} and report.targets[reason] == "diffusers' native backend"
    assert torch.equal(out, native(query=q, key=k, value=v)) and not df_registered.calls
    with pytest.raises(RoutingError, match=rf"\[B=1 H=2 Lq=9 Lk=12 D={d} .*: {reason[:12]}"):
        with routing.track(strict=True):
            dispatch(q, k, v)


@needs_df
def test_diffusers_mismatched_q_and_k_head_dims_are_not_served(df_registered):
    """q and k of different head dims: no kernel serves it; the native backend decides (it raises,
    as it does without hopattn), and a strict run refuses it naming both dims."""
    q, _, _ = bshd(192, 128)
    _, k, v = bshd(128, 128)
    reason = "head dims of q and k differ (q 192, k 128)"
    with routing.track() as report, pytest.raises(RuntimeError) as err:
        dispatch(q, k, v)
    assert not isinstance(err.value, RoutingError) and report.fallbacks == {reason: 1} and not df_registered.calls
    with pytest.raises(RuntimeError):
        native(query=q, key=k, value=v)  # what the native backend does with them on its own
    with pytest.raises(RoutingError, match=r"head dims of q and k differ \(q 192, k 128\)"):
        with routing.track(strict=True):
            dispatch(q, k, v)


@needs_tf
def test_transformers_mismatched_q_and_k_head_dims_are_not_served(tf_registered):
    module = tiny_llama(layers=1).model.layers[0].self_attn
    attention = transformers.AttentionInterface._global_mapping["hopattn"]
    q, _, _ = bhsd(192, 128)
    _, k, v = bhsd(128, 128)
    with routing.track() as report, pytest.raises(RuntimeError) as err:
        attention(module, q, k, v, None)
    assert not isinstance(err.value, RoutingError) and not tf_registered.calls
    assert report.fallbacks == {"head dims of q and k differ (q 192, k 128)": 1}


@needs_df
def test_diffusers_grad_at_head_dim_64_falls_back_with_native_gradients(df_registered):
    q, k, v = bshd(64, 64, grad=True)
    with routing.track() as report:
        dispatch(q, k, v).float().square().sum().backward()
    assert report.fallbacks == {GRAD_64: 1} and report.targets[GRAD_64] == "diffusers' native backend"
    assert not df_registered.calls
    q2, k2, v2 = bshd(64, 64, grad=True)
    native(query=q2, key=k2, value=v2).float().square().sum().backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in ((q, q2), (k, k2), (v, v2)))
    with pytest.raises(RoutingError, match="gradient needed at head dim 64"), routing.track(strict=True):
        dispatch(*bshd(64, 64, grad=True))
    with torch.no_grad(), routing.track(strict=True) as report:  # no gradient needed: served
        dispatch(*bshd(64, 64, grad=True))
    assert report.served == 1 and len(df_registered.calls) == 1


def tiny_ltx2():
    torch.manual_seed(0)
    return diffusers.LTX2VideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=128, cross_attention_dim=256,
        audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=64,
        audio_cross_attention_dim=128, num_layers=2, caption_channels=16).to(BF16)


@needs_df
def test_ltx2_training_serves_video_and_sends_audio_with_its_gradient_to_native(df_registered):
    """LTX-2 in training: its video attention (128) is served with hopattn's backward, its audio
    attention (64) goes to the native backend with the gradient reason; every parameter still gets
    its gradient, close to an all-native step's."""
    from test_integrations import ltx2_inputs

    model = tiny_ltx2().train()

    def step(backend):
        model.zero_grad(set_to_none=True)
        with ad.attention_backend(backend):
            video, audio = model(**ltx2_inputs())[:2]
        (video.float().square().mean() + audio.float().square().mean()).backward()
        return grads_of(model)

    ref = step("native")
    with routing.track() as report:
        got = step("hopattn")
    assert report.calls == 12 and report.served == report.backward == 4, report.summary()
    assert report.fallbacks == {GRAD_64: 8}
    assert {c["q"][-1] for c in df_registered.calls} == {128}
    assert got.keys() == ref.keys() and any("audio_attn1.to_q" in n for n in got)
    assert all(rel_err(got[n], g) < 5e-2 for n, g in ref.items() if g.norm() > 0)
