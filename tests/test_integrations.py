"""hopattn.integrations on CPU: registration with transformers and diffusers, routing counts, strict
refusals, and fallbacks that give SDPA's output.

The CUDA kernel cannot run here, so hopattn's call (``hopattn.api.attention``) is replaced by the
float64 reference of the same contract (bottom-right causal, GQA, rows with no key give 0), and the
kernel description is told that CPU tensors are fine: everything else — the extension points, the
mask checks, the GQA and layout handling, the counting — runs as it does on the GPU.
"""

from __future__ import annotations

import dataclasses
import enum
import weakref

import pytest

torch = pytest.importorskip("torch")
from hopattn.integrations import kernels, masks, routing  # noqa: E402
from hopattn.integrations.routing import RoutingError  # noqa: E402

BF16 = torch.bfloat16


def rel_err(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


class Spy:
    """Stands in for hopattn.api.attention: the float64 reference (differentiable, as hopattn is),
    recording what it was given."""

    def __init__(self, gqa: bool):
        self.gqa, self.calls = gqa, []

    def __call__(self, q, k, v, *, causal=False, scale=None, stage=None, layout="bhsd", out=None,
                 deterministic=False, backward_stage=None):
        self.calls.append({"q": tuple(q.shape), "k": tuple(k.shape), "v": tuple(v.shape), "causal": causal,
                           "layout": layout, "scale": scale,
                           "k_ptr": k.data_ptr(), "q_ptr": q.data_ptr(), "deterministic": deterministic,
                           "backward_stage": backward_stage,
                           "requires_grad": torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))})
        return kernels.reference_attention(q, k, v, causal=causal, scale=scale, layout=layout, gqa=self.gqa)


def cpu_hopattn(monkeypatch, gqa: bool = True) -> tuple[kernels.Kernel, Spy]:
    """hopattn's kernel description (the real one of the final stage) running the reference on CPU."""
    from hopattn import api

    spy = Spy(gqa)
    monkeypatch.setattr(api, "attention", spy)
    return dataclasses.replace(kernels.hopattn_kernel(), devices=("cpu",), gqa=gqa), spy


# --- kernels, masks, routing: no model library needed -----------------------------------------


def test_reference_matches_sdpa_causal_gqa_and_zero_rows():
    torch.manual_seed(0)
    q = torch.randn(1, 4, 6, 128, dtype=torch.float64)
    k, v = torch.randn(1, 2, 9, 128, dtype=torch.float64), torch.randn(1, 2, 9, 128, dtype=torch.float64)
    bottom_right = torch.ones(6, 9, dtype=torch.bool).tril(9 - 6)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bottom_right, enable_gqa=True)
    got = kernels.reference_attention(q, k, v, causal=True)
    assert torch.allclose(got, want, atol=1e-12)
    # more queries than keys: the first rows see no key and give 0, the rest see what bottom-right allows
    q2 = torch.randn(1, 2, 5, 128, dtype=torch.float64)
    k2, v2 = torch.randn(1, 2, 3, 128, dtype=torch.float64), torch.randn(1, 2, 3, 128, dtype=torch.float64)
    out = kernels.reference_attention(q2, k2, v2, causal=True)
    assert torch.equal(out[:, :, :2], torch.zeros_like(out[:, :, :2]))
    assert torch.allclose(out[:, :, 2], v2[:, :, 0])


def test_reference_checks_its_inputs_like_a_kernel():
    q = torch.randn(1, 4, 8, 128)
    k = torch.randn(1, 2, 8, 128)
    with pytest.raises(ValueError, match="k: expected 4 heads"):
        kernels.reference_attention(q, k, k, gqa=False)
    bhsd_memory = q.transpose(1, 2)  # a BSHD view of BHSD memory: read through its strides, as the kernel does
    assert torch.allclose(kernels.reference_attention(bhsd_memory, bhsd_memory, bhsd_memory, layout="bshd"),
                          kernels.reference_attention(q, q, q).transpose(1, 2))
    with pytest.raises(ValueError, match="q: expected a 4-d tensor with a contiguous head dim"):
        kernels.reference_attention(q.transpose(2, 3), q, q)


def test_kernel_limits_name_the_reason():
    kern = kernels.reference_kernel(devices=("cpu",))
    q = torch.zeros(1, 4, 8, 128, dtype=BF16)
    assert kern.unsupported(q, q, q, causal=True) is None
    assert kern.unsupported(q.float(), q.float(), q.float(), False).startswith("dtype float32")
    assert kern.unsupported(q.half(), q.half(), q.half(), False).startswith("dtype float16")
    small = torch.zeros(1, 4, 8, 64, dtype=BF16)
    assert kern.unsupported(small, small, small, False).startswith("head dim 64")
    three = torch.zeros(1, 3, 8, 128, dtype=BF16)
    assert "not a multiple" in kern.unsupported(q, three, three, False)
    noncausal = dataclasses.replace(kern, causal=False)
    assert noncausal.unsupported(q, q, q, True).startswith("causal mask")
    assert kernels.hopattn_kernel().unsupported(q, q, q, False).startswith("device cpu")


def test_hopattn_kernel_describes_the_final_stage():
    import hopattn

    kern = kernels.hopattn_kernel()
    final = {s.number: s for s in hopattn.stages()}[hopattn.final_stage()]
    assert kern.head_dims == final.head_dims and kern.causal == final.causal  # supports.head_dims: (q·k, v) pairs
    assert kern.gqa == bool(getattr(final, "gqa", False))
    assert kern.layouts == tuple(final.layouts)
    with pytest.raises(ValueError, match="stage"):
        kernels.hopattn_kernel(stage=999)


def test_serve_repeats_kv_only_for_a_kernel_without_gqa():
    q = torch.randn(1, 4, 8, 128, dtype=BF16)
    k = torch.randn(1, 2, 8, 128, dtype=BF16)
    for gqa, mode in ((True, routing.DIRECT), (False, routing.REPEAT_KV)):
        kern = kernels.reference_kernel(gqa=gqa)
        out, got = routing.serve(kern, q, k, k, causal=True, scale=0.1, layout="bhsd")
        assert got == mode
        want = kernels.reference_attention(q, k, k, causal=True, scale=0.1)
        assert torch.equal(out, want)


def test_serve_copies_only_what_the_kernel_cannot_read():
    kern = kernels.reference_kernel()
    base = torch.randn(1, 8, 3 * 4 * 128, dtype=BF16)
    q, k, v = (t.unflatten(2, (4, 128)) for t in base.chunk(3, dim=-1))  # a fused QKV projection's views
    out, mode = routing.serve(kern, q, k, v, causal=False, scale=0.1, layout="bshd")
    assert mode == routing.DIRECT  # heads of a row packed: read in place
    odd = torch.randn(1, 4, 8, 256, dtype=BF16)[..., ::2]  # head dim not contiguous
    _, mode = routing.serve(kern, odd, odd, odd, causal=False, scale=0.1, layout="bhsd")
    assert mode == routing.COPIED
    bhsd_only = dataclasses.replace(kern, layouts=("bhsd",), strided=False)
    out2, mode = routing.serve(bhsd_only, q, k, v, causal=False, scale=0.1, layout="bshd")
    assert mode == routing.COPIED and out2.shape == q.shape and torch.equal(out2, out)


def test_mask_classification():
    lq, lk = 4, 6
    causal = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
    assert masks.classify(None, lq, lk) == masks.NONE
    assert masks.classify(torch.ones(2, 1, lq, lk, dtype=torch.bool), lq, lk) == masks.NONE
    assert masks.classify(causal[None, None].expand(2, 1, lq, lk), lq, lk) == masks.CAUSAL
    top_left = torch.ones(lq, lk, dtype=torch.bool).tril()
    assert masks.classify(top_left[None, None], lq, lk) == masks.OTHER
    additive = torch.zeros(1, 1, lq, lk).masked_fill(~causal, float("-inf"))
    assert masks.classify(additive, lq, lk) == masks.CAUSAL
    assert masks.classify(torch.zeros(1, 1, 1, lk), lq, lk) == masks.NONE  # LTX-2's text mask after registers
    assert masks.classify(torch.full((1, 1, lq, lk), 0.5), lq, lk) == masks.OTHER  # a bias
    padding = torch.ones(2, 1, 1, lk, dtype=torch.bool)
    padding[0, ..., 0] = False
    assert masks.classify(padding, lq, lk) == masks.OTHER
    assert masks.classify(torch.ones(lk, dtype=torch.bool), lq, lk) == masks.OTHER  # not 2-d or more


def test_mask_verdict_is_cached_per_tensor_but_sees_in_place_edits():
    m = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    assert masks.classify(m, 4, 4) == masks.NONE
    m[0, 0, 0, 1] = False  # bumps the version counter
    assert masks.classify(m, 4, 4) == masks.OTHER
    alive = weakref.ref(m)
    del m
    assert alive() is None  # the cache does not keep a model's mask alive


def test_masks_taken_in_turn_are_each_read_once(monkeypatch):
    """LTX-2 hands its layers a few masks in turn; reading one is a device sync, so each is read once."""
    reads = []
    real = masks._classify
    monkeypatch.setattr(masks, "_classify", lambda m, q, k: reads.append(id(m)) or real(m, q, k))
    video, audio = torch.ones(1, 1, 1, 6, dtype=torch.bool), torch.ones(1, 1, 1, 3, dtype=torch.bool)
    for _ in range(10):  # ten layers, each with both masks
        assert masks.classify(video, 4, 6) == masks.NONE
        assert masks.classify(audio, 4, 3) == masks.NONE
    assert sorted(reads) == sorted([id(video), id(audio)])


def test_top_left_causal_keeps_the_keys_sdpa_would_see():
    assert masks.top_left_causal(8, 8) == (8, None)
    assert masks.top_left_causal(4, 10) == (4, None)
    keys, reason = masks.top_left_causal(10, 4)
    assert keys is None and "more queries" in reason


def test_report_counts_summarises_and_checks():
    shape = routing.CallShape("x", 1, 4, 2, 8, 8, 128, True, "bhsd", "bfloat16")
    with routing.track() as outer:
        with routing.track() as inner:
            routing.record(shape, mode=routing.DIRECT)
            routing.record(shape, mode=routing.REPEAT_KV)
        routing.record(shape, reason="head dim 64 (hopattn serves 128)")
    assert (inner.calls, inner.served, outer.calls, outer.served, outer.fell_back) == (2, 2, 3, 2, 1)
    assert outer.summary() == ("3 attention calls: 2 served by hopattn (1 after repeating K/V heads); "
                               "1 sent to SDPA: head dim 64 (hopattn serves 128)")
    assert outer.to_dict()["fallbacks"] == {"head dim 64 (hopattn serves 128)": 1}
    assert outer.shapes[(shape, None)] == 2
    with pytest.raises(RoutingError, match="no attention call went through hopattn"):
        with routing.track(strict=True):
            pass
    with pytest.raises(RoutingError, match="cannot serve .* head dim 64"):
        with routing.track(strict=True):
            routing.refuse_or_record("hopattn", shape, "head dim 64", strict=False)
    assert not routing.strict_active()


# --- transformers -------------------------------------------------------------------------------

try:
    import transformers
    from hopattn.integrations import transformers as hop_tf
except ImportError:  # the library-free tests above still run
    transformers = None
needs_tf = pytest.mark.skipif(transformers is None, reason="transformers is not installed (pip install -e '.[models]')")


def tiny_llama(attn="sdpa", heads=4, kv_heads=2, head_dim=128, layers=2, dtype=BF16, **extra):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
                                   num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                                   max_position_embeddings=256, attn_implementation=attn, **extra)
    return transformers.LlamaForCausalLM(cfg).to(dtype).eval()


def logits(model, ids, impl, **kw):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(ids, **kw).logits


@pytest.fixture
def tf_registered(monkeypatch):
    kern, spy = cpu_hopattn(monkeypatch, gqa=True)
    hop_tf.register(kernel=kern)
    yield spy
    hop_tf.unregister()


@needs_tf
def test_transformers_unknown_until_registered_then_config_and_from_pretrained_work(monkeypatch, tmp_path):
    hop_tf.unregister()
    with pytest.raises(ValueError, match="hopattn"):
        tiny_llama(attn="hopattn")
    kern, spy = cpu_hopattn(monkeypatch)
    assert hop_tf.register(kernel=kern, strict=True) == "hopattn"
    try:
        model = tiny_llama(attn="hopattn")
        assert model.config._attn_implementation == "hopattn"
        model.save_pretrained(tmp_path)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="hopattn",
                                                                   dtype=BF16)
        assert loaded.config._attn_implementation == "hopattn"
        ids = torch.randint(0, 256, (1, 12))
        with torch.no_grad(), routing.track(strict=True) as report:
            loaded(ids)
        assert report.calls == report.served == 2 and len(spy.calls) == 2
    finally:
        hop_tf.unregister()


@needs_tf
def test_llama_gqa_goes_to_the_kernel_without_repeat_and_matches_sdpa(tf_registered):
    model = tiny_llama()
    ids = torch.randint(0, 256, (2, 16))
    ref = logits(model, ids, "sdpa")
    with routing.track(strict=True) as report:
        out = logits(model, ids, "hopattn")
    assert report.calls == report.served == 2 and report.modes == {routing.DIRECT: 2}
    call = tf_registered.calls[0]
    assert call["k"][1 if call["layout"] == "bhsd" else 2] == 2  # 2 K/V heads reached the kernel
    assert call["causal"] is True
    assert rel_err(out, ref) < 2e-2
    assert (out.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


@needs_tf
def test_llama_kv_heads_repeated_for_a_stage_without_gqa(monkeypatch):
    kern, spy = cpu_hopattn(monkeypatch, gqa=False)  # the reference would refuse 2 K/V heads for 4 query heads
    hop_tf.register(kernel=kern)
    try:
        model = tiny_llama()
        ids = torch.randint(0, 256, (1, 16))
        ref = logits(model, ids, "sdpa")
        with routing.track(strict=True) as report:
            out = logits(model, ids, "hopattn")
        assert report.served == 2 and report.modes == {routing.REPEAT_KV: 2}
        assert rel_err(out, ref) < 2e-2
    finally:
        hop_tf.unregister()


@needs_tf
def test_llama_reads_projection_layout_in_place(tf_registered):
    model = tiny_llama()
    ids = torch.randint(0, 256, (1, 16))
    logits(model, ids, "hopattn", use_cache=False)
    # no cache: q, k, v are views of the projections, BSHD in memory, so the kernel reads "bshd" in place
    assert {c["layout"] for c in tf_registered.calls} == {"bshd"}
    with routing.track(strict=True) as report:
        logits(model, ids, "hopattn", use_cache=True)
    # with a cache, K/V are the cache's BHSD tensors: read through their strides, still without a copy
    assert report.modes == {routing.DIRECT: 2}


@needs_tf
def test_padding_mask_falls_back_to_exactly_sdpa(tf_registered):
    model = tiny_llama()
    ids = torch.randint(0, 256, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[0, :5] = 0  # left padding
    ref = logits(model, ids, "sdpa", attention_mask=mask)
    with routing.track() as report:
        out = logits(model, ids, "hopattn", attention_mask=mask)
    assert torch.equal(out, ref)
    assert report.calls == 2 and report.served == 0
    assert report.fallbacks == {"attention mask (padding or another pattern than causal)": 2}
    # a mask with no padding is the plain causal case: served
    with routing.track(strict=True) as report:
        logits(model, ids, "hopattn", attention_mask=torch.ones(2, 16, dtype=torch.long))
    assert report.served == 2


@needs_tf
def test_strict_registration_refuses_a_padding_mask_naming_the_reason(monkeypatch):
    kern, _ = cpu_hopattn(monkeypatch)
    hop_tf.register(kernel=kern, strict=True)
    try:
        model = tiny_llama(attn="hopattn")
        mask = torch.ones(2, 16, dtype=torch.long)
        mask[1, :3] = 0
        with pytest.raises(RoutingError, match=r"cannot serve this transformers attention call .*attention mask") as e:
            with torch.no_grad():
                model(torch.randint(0, 256, (2, 16)), attention_mask=mask)
        assert e.value.reason.startswith("attention mask")
    finally:
        hop_tf.unregister()


@needs_tf
def test_strict_track_refuses_under_a_permissive_registration(tf_registered):
    model = tiny_llama(dtype=torch.float32)
    with pytest.raises(RoutingError, match="dtype float32"):
        with routing.track(strict=True):
            logits(model, torch.randint(0, 256, (1, 8)), "hopattn")


@needs_tf
@pytest.mark.parametrize("dtype,reason", [(torch.float32, "dtype float32"), (torch.float16, "dtype float16")])
def test_other_dtypes_fall_back_to_exactly_sdpa(tf_registered, dtype, reason):
    model = tiny_llama(dtype=dtype)
    ids = torch.randint(0, 256, (1, 8))
    ref = logits(model, ids, "sdpa")
    with routing.track() as report:
        out = logits(model, ids, "hopattn")
    assert torch.equal(out, ref)
    assert list(report.fallbacks) == [f"{reason} (hopattn serves bfloat16)"] and report.fell_back == 2
    assert not tf_registered.calls


@needs_tf
def test_a_head_dim_the_stage_does_not_serve_falls_back(tf_registered):
    model = tiny_llama(head_dim=80)
    ids = torch.randint(0, 256, (1, 8))
    ref = logits(model, ids, "sdpa")
    with routing.track() as report:
        out = logits(model, ids, "hopattn")
    served = kernels.head_dims_text(kernels.hopattn_kernel().head_dims)  # "64, 96, 128, 192 (v 128) and 256"
    assert torch.equal(out, ref) and report.fallbacks == {f"head dim 80 (hopattn serves {served})": 2}
    assert not tf_registered.calls


@needs_tf
def test_dropout_in_training_falls_back(tf_registered):
    model = tiny_llama(attention_dropout=0.1)
    model.set_attn_implementation("hopattn")
    model.train()
    with routing.track() as report:
        model(torch.randint(0, 256, (1, 8)))
    assert report.fallbacks == {"dropout 0.1 (the kernel has none)": 2}


@needs_tf
def test_cpu_tensors_fall_back_with_the_real_kernel():
    hop_tf.register()  # the real hopattn kernel: CUDA only
    try:
        model = tiny_llama()
        ids = torch.randint(0, 256, (1, 8))
        ref = logits(model, ids, "sdpa")
        with routing.track() as report:
            out = logits(model, ids, "hopattn")
        assert torch.equal(out, ref) and report.fallbacks == {"device cpu (hopattn runs on cuda)": 2}
    finally:
        hop_tf.unregister()


@needs_tf
def test_prefill_chunk_after_a_cache_is_served_as_bottom_right_causal(tf_registered):
    model = tiny_llama()
    ids = torch.randint(0, 256, (1, 12))
    ref = logits(model, ids, "sdpa")[:, 8:]
    model.set_attn_implementation("hopattn")
    with torch.no_grad(), routing.track(strict=True) as report:
        first = model(ids[:, :8], use_cache=True)
        second = model(ids[:, 8:], past_key_values=first.past_key_values, use_cache=True).logits
    # the second chunk: 4 queries over 12 keys with a materialized bottom-right causal mask
    assert report.served == 4
    last = tf_registered.calls[-1]
    assert last["causal"] is True and last["q"][2 if last["layout"] == "bhsd" else 1] == 4
    assert rel_err(second, ref) < 2e-2


@needs_tf
def test_generate_is_served_end_to_end(tf_registered):
    model = tiny_llama(attn="hopattn")
    ids = torch.randint(0, 256, (1, 6))
    with torch.no_grad(), routing.track(strict=True) as report:
        model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert report.calls == report.served == 2 * 4  # prefill + 3 one-query decode steps, 2 layers


def eager_logits(model, ids, **kw):
    return logits(model, ids, "eager", **kw)


def tiny_gpt_oss():
    """GPT-OSS's attention: sinks (s_aux) on every layer, a sliding window on the first."""
    torch.manual_seed(0)
    cfg = transformers.GptOssConfig(vocab_size=256, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=128, num_local_experts=4,
                                    num_experts_per_tok=2, sliding_window=8, max_position_embeddings=256,
                                    layer_types=["sliding_attention", "full_attention"], attn_implementation="eager")
    model = transformers.GptOssForCausalLM(cfg).to(BF16).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.copy_(torch.randn(4) * 2)  # sinks that weigh: the defect showed with them
    return model


@needs_tf
def test_attention_sinks_go_to_the_models_eager_attention_and_match_it(tf_registered):
    """GPT-OSS passes its sinks as s_aux; SDPA would drop them (logits 73 % off in the issue's run)."""
    model = tiny_gpt_oss()
    ids = torch.randint(0, 256, (2, 12))
    ref = eager_logits(model, ids)
    with routing.track() as report:
        out = logits(model, ids, "hopattn")
    assert torch.equal(out, ref)
    assert report.served == 0 and report.fallbacks == {"attention sinks (s_aux)": 2}
    assert "2 sent to the model's eager attention: attention sinks (s_aux)" in report.summary()
    with pytest.raises(RoutingError, match="attention sinks"), routing.track(strict=True):
        logits(model, ids, "hopattn")


@needs_tf
def test_softcapping_goes_to_eager_and_the_sliding_window_to_sdpa_each_matching_the_model(tf_registered):
    torch.manual_seed(0)
    cfg = transformers.Gemma2Config(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                    num_attention_heads=2, num_key_value_heads=1, head_dim=128, sliding_window=4,
                                    attn_logit_softcapping=5.0, attn_implementation="eager")
    model = transformers.Gemma2ForCausalLM(cfg).to(BF16).eval()
    ids = torch.randint(0, 256, (1, 16))
    ref = eager_logits(model, ids)
    with routing.track() as report:
        out = logits(model, ids, "hopattn")
    assert torch.equal(out, ref) and report.fallbacks == {"logit softcapping (softcap)": 2}
    no_cap = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**{**cfg.to_dict(),
                                                                          "attn_logit_softcapping": None}))
    no_cap = no_cap.to(BF16).eval()
    ref = eager_logits(no_cap, ids)
    with routing.track() as report:
        out = logits(no_cap, ids, "hopattn")
    # layer 0's window is in the mask SDPA is given; layer 1 (full causal) is served
    assert report.fallbacks == {"sliding window 4 over 16 keys": 1} and report.served == 1
    assert report.targets == {"sliding window 4 over 16 keys": "SDPA"}
    assert rel_err(out, ref) < 2e-2


@needs_tf
def test_position_bias_goes_to_sdpa_which_honours_it(tf_registered):
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=256, d_model=256, d_kv=128, d_ff=512, num_layers=2, num_heads=2,
                                attn_implementation="eager")
    eager = transformers.T5ForConditionalGeneration(cfg).to(BF16).eval()
    # T5's stacks keep copies of the config: the implementation is chosen when the model is built
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**{**cfg.to_dict(),
                                                                             "attn_implementation": "hopattn"}))
    model = model.to(BF16).eval()
    model.load_state_dict(eager.state_dict())
    ids, dec = torch.randint(0, 256, (1, 10)), torch.randint(0, 256, (1, 6))
    with torch.no_grad():
        ref = eager(input_ids=ids, decoder_input_ids=dec).logits
        with routing.track() as report:
            out = model(input_ids=ids, decoder_input_ids=dec).logits
    assert report.served == 0 and set(report.fallbacks) == {"position bias (position_bias)"}
    assert rel_err(out, ref) < 2e-2


@needs_tf
def test_attention_weights_requested_go_to_eager(tf_registered):
    model = tiny_llama()
    ids = torch.randint(0, 256, (1, 8))
    model.set_attn_implementation("hopattn")
    with torch.no_grad(), routing.track() as report:
        out = model(ids, output_attentions=True)
    assert report.fallbacks == {"attention weights requested (output_attentions)": 2}
    assert out.attentions is not None and out.attentions[0].shape == (1, 4, 8, 8)


@needs_tf
def test_an_argument_the_glue_does_not_know_goes_to_eager(tf_registered):
    model = tiny_llama()
    attention = transformers.AttentionInterface._global_mapping["hopattn"]
    module = model.model.layers[0].self_attn
    q = torch.randn(1, 4, 8, 128, dtype=BF16)
    kv = torch.randn(1, 2, 8, 128, dtype=BF16)
    with routing.track() as report:
        out, weights = attention(module, q, kv, kv, None, scaling=0.1, new_bias=torch.zeros(1))
    assert report.fallbacks == {"argument new_bias (not known to hopattn)": 1}
    from transformers.models.llama.modeling_llama import eager_attention_forward

    causal = torch.zeros(8, 8, dtype=BF16).masked_fill(~torch.ones(8, 8, dtype=torch.bool).tril(), -3.0e38)
    want, _ = eager_attention_forward(module, q, kv, kv, causal[None, None], scaling=0.1)
    assert torch.equal(out, want) and weights is not None


# --- diffusers ----------------------------------------------------------------------------------

try:
    import diffusers
    from diffusers.models import attention_dispatch as ad
    from hopattn.integrations import diffusers as hop_df
except ImportError:
    diffusers = None
needs_df = pytest.mark.skipif(diffusers is None, reason="diffusers is not installed (pip install -e '.[models]')")


@pytest.fixture
def df_registered(monkeypatch):
    kern, spy = cpu_hopattn(monkeypatch, gqa=True)
    hop_df.register(kernel=kern)
    yield spy
    hop_df.unregister()


def tiny_wan(dtype=BF16):
    torch.manual_seed(0)
    return diffusers.WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=128,
                                           in_channels=4, out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64,
                                           num_layers=2, rope_max_seq_len=32).to(dtype).eval()


def wan_inputs(dtype=BF16):
    g = torch.Generator().manual_seed(1)
    return dict(hidden_states=torch.randn(1, 4, 3, 8, 8, generator=g).to(dtype), timestep=torch.tensor([500]),
                encoder_hidden_states=torch.randn(1, 12, 32, generator=g).to(dtype), return_dict=False)


def run(model, inputs, backend):
    with torch.no_grad(), ad.attention_backend(backend):
        return model(**inputs)


@needs_df
def test_diffusers_backend_name_is_added_and_accepted(df_registered):
    assert ad.AttentionBackendName("hopattn").value == "hopattn"
    assert "hopattn" in {m.value for m in ad.AttentionBackendName.__members__.values()}
    model = tiny_wan()
    model.set_attention_backend("hopattn")
    with torch.no_grad(), routing.track(strict=True) as report:
        model(**wan_inputs())
    assert report.calls == report.served == 4
    model.set_attention_backend("native")
    with torch.no_grad(), routing.track() as report:
        model(**wan_inputs())
    assert report.calls == 0
    hop_df.unregister()
    with pytest.raises(ValueError, match="not registered|not a valid"):
        with ad.attention_backend("hopattn"):
            pass


@needs_df
def test_unregister_leaves_nothing_usable_behind(monkeypatch):
    kern, _ = cpu_hopattn(monkeypatch, gqa=True)
    hop_df.register(kernel=kern)
    switched = tiny_wan()
    switched.set_attention_backend("hopattn")
    hop_df.unregister()
    assert "hopattn" not in {m.value for m in ad.AttentionBackendName}
    with pytest.raises(ValueError, match="must be one of"):
        tiny_wan().set_attention_backend("hopattn")
    with pytest.raises(RuntimeError, match=r"was unregistered.*set_attention_backend\('native'\)"):
        with torch.no_grad():
            switched(**wan_inputs())
    hop_df.register(kernel=kern)  # and back: the model switched before works again
    try:
        with torch.no_grad(), routing.track(strict=True) as report:
            switched(**wan_inputs())
        assert report.served == 4
    finally:
        hop_df.unregister()


@needs_df
def test_enum_member_is_added_the_way_enum_would():
    class Names(str, enum.Enum):
        NATIVE = "native"

    member = hop_df._add_member(Names, "hopattn")
    assert Names("hopattn") is member and member.value == "hopattn" and member.name == "HOPATTN"
    assert isinstance(member, Names) and member == "hopattn"
    assert list(Names) == [Names.NATIVE, member] and Names.__members__["HOPATTN"] is member
    assert {member: 1}[Names("hopattn")] == 1
    assert hop_df._add_member(Names, "hopattn") is member  # idempotent


@needs_df
def test_wan_self_and_cross_attention_served_in_place_and_match_native(df_registered):
    model = tiny_wan()
    ref = run(model, wan_inputs(), "native")[0]
    with routing.track(strict=True) as report:
        out = run(model, wan_inputs(), "hopattn")[0]
    assert report.served == 4 and report.modes == {routing.DIRECT: 4}
    lengths = sorted({(s.q_len, s.k_len) for s, _ in report.shapes})
    assert lengths == [(48, 12), (48, 48)]  # cross-attention to 12 text tokens, self-attention over 3x4x4
    assert {c["layout"] for c in df_registered.calls} == {"bshd"}
    assert all(c["causal"] is False for c in df_registered.calls)
    assert rel_err(out, ref) < 2e-2


@needs_df
def test_wan_fp32_falls_back_to_exactly_native(df_registered):
    model = tiny_wan(torch.float32)
    ref = run(model, wan_inputs(torch.float32), "native")[0]
    with routing.track() as report:
        out = run(model, wan_inputs(torch.float32), "hopattn")[0]
    assert torch.equal(out, ref) and report.fallbacks == {"dtype float32 (hopattn serves bfloat16)": 4}


@needs_df
def test_flux_joint_attention_served(df_registered):
    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=2,
                                             attention_head_dim=128, num_attention_heads=2, joint_attention_dim=32,
                                             pooled_projection_dim=16, guidance_embeds=False,
                                             axes_dims_rope=(16, 56, 56)).to(BF16).eval()
    g = torch.Generator().manual_seed(2)
    inputs = dict(hidden_states=torch.randn(1, 16, 4, generator=g).to(BF16),
                  encoder_hidden_states=torch.randn(1, 8, 32, generator=g).to(BF16),
                  pooled_projections=torch.randn(1, 16, generator=g).to(BF16), timestep=torch.tensor([0.5]),
                  img_ids=torch.zeros(16, 3), txt_ids=torch.zeros(8, 3), return_dict=False)
    ref = run(model, inputs, "native")[0]
    with routing.track(strict=True) as report:
        out = run(model, inputs, "hopattn")[0]
    assert report.served == 3 and {(s.q_len, s.k_len) for s, _ in report.shapes} == {(24, 24)}
    assert rel_err(out, ref) < 2e-2


def tiny_ltx2():
    torch.manual_seed(0)
    return diffusers.LTX2VideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=128, cross_attention_dim=256,
        audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=64,
        audio_cross_attention_dim=128, num_layers=2, caption_channels=16).to(BF16).eval()


def ltx2_inputs():
    g = torch.Generator().manual_seed(3)
    frames, height, width, audio, text = 2, 4, 4, 5, 8
    return dict(hidden_states=torch.randn(1, frames * height * width, 4, generator=g).to(BF16),
                audio_hidden_states=torch.randn(1, audio, 4, generator=g).to(BF16),
                encoder_hidden_states=torch.randn(1, text, 16, generator=g).to(BF16),
                audio_encoder_hidden_states=torch.randn(1, text, 16, generator=g).to(BF16),
                timestep=torch.tensor([500.0]), sigma=torch.tensor([0.5]),
                encoder_attention_mask=torch.ones(1, text), audio_encoder_attention_mask=torch.ones(1, text),
                num_frames=frames, height=height, width=width, fps=24.0, audio_num_frames=audio, return_dict=False)


@needs_df
def test_ltx2_audio_head_dim_64_is_served(df_registered):
    model = tiny_ltx2()
    ref = run(model, ltx2_inputs(), "native")
    with routing.track(strict=True) as report:
        out = run(model, ltx2_inputs(), "hopattn")
    # per block: video self- and text cross-attention (head dim 128; the all-ones text mask is no mask);
    # audio self, audio text, audio-to-video and video-to-audio attention (head dim 64), served since stage 24
    assert report.calls == report.served == 12
    assert sorted({c["q"][-1] for c in df_registered.calls}) == [64, 128]
    assert sum(c["q"][-1] == 64 for c in df_registered.calls) == 8
    for a, b in zip(out, ref):
        assert rel_err(a, b) < 2e-2


def dispatch(q, k, v, **kw):
    return ad.dispatch_attention_fn(q, k, v, backend=ad.AttentionBackendName("hopattn"), **kw)


@needs_df
def test_diffusers_masks_gqa_and_causal_through_dispatch(df_registered):
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 8, 4, 128, generator=g).to(BF16)  # BSHD
    k, v = (torch.randn(2, 10, 2, 128, generator=g).to(BF16) for _ in range(2))
    native = ad._AttentionBackendRegistry._backends[ad.AttentionBackendName.NATIVE]
    with routing.track(strict=True) as report:
        out = dispatch(q, k, v, enable_gqa=True)
        ones = dispatch(q, k, v, attn_mask=torch.ones(2, 10, dtype=torch.bool), enable_gqa=True)
    assert report.served == 2 and report.modes == {routing.DIRECT: 2}
    assert df_registered.calls[0]["k"] == (2, 10, 2, 128)  # GQA passed through
    want = native(query=q, key=k, value=v, enable_gqa=True)
    assert rel_err(out, want) < 1e-2 and torch.equal(out, ones)
    padding = torch.ones(2, 10, dtype=torch.bool)
    padding[1, 7:] = False
    with routing.track() as report:
        out = dispatch(q, k, v, attn_mask=padding, enable_gqa=True)
    assert report.fallbacks == {"attention mask (padding or another pattern than causal)": 1}
    assert torch.equal(out, native(query=q, key=k, value=v, attn_mask=padding[:, None, None], enable_gqa=True))
    # is_causal with fewer queries than keys: SDPA aligns it top-left; served with the keys it sees
    with routing.track(strict=True) as report:
        out = dispatch(q, k, v, is_causal=True, enable_gqa=True)
    assert df_registered.calls[-1]["k"][1] == 8 and df_registered.calls[-1]["causal"] is True
    assert rel_err(out, native(query=q, key=k, value=v, is_causal=True, enable_gqa=True)) < 1e-2
    with pytest.raises(RoutingError, match="dropout 0.1"):
        with routing.track(strict=True):
            dispatch(q, k, v, dropout_p=0.1, enable_gqa=True)


@needs_df
def test_diffusers_verdicts_are_kept_per_call_signature_and_fallbacks_get_the_models_tensors(monkeypatch):
    """The backend keeps the kernel's verdict per (shapes, dtypes, device, causal, grad, deterministic):
    kernel.unsupported runs once per signature, a new dtype or a gradient gets its own verdict, and
    a fallback receives the model's own key and value (not the keys a top-left mask would keep)."""
    kern, spy = cpu_hopattn(monkeypatch, gqa=True)
    asked = []
    real = type(kern).unsupported
    monkeypatch.setattr(type(kern), "unsupported", lambda self, *a, **kw: asked.append(a[0].dtype) or real(self, *a, **kw))
    backend = hop_df.make_backend(kern, strict=False)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 8, 2, 128, generator=g).to(BF16)
    k, v = (torch.randn(1, 10, 2, 128, generator=g).to(BF16) for _ in range(2))
    with routing.track() as report:
        first = backend(query=q, key=k, value=v)
        again = backend(query=q, key=k, value=v)
    assert torch.equal(first, again) and report.served == 2 and asked == [BF16]
    with routing.track() as report:
        out32 = backend(query=q.float(), key=k.float(), value=v.float())
        backend(query=q.float(), key=k.float(), value=v.float())
    assert asked == [BF16, torch.float32] and report.fallbacks == {"dtype float32 (hopattn serves bfloat16)": 2}
    native = ad._AttentionBackendRegistry._backends[ad.AttentionBackendName.NATIVE]
    assert torch.equal(out32, native(query=q.float(), key=k.float(), value=v.float()))
    leaf = q.clone().requires_grad_()
    backend(query=leaf, key=k, value=v)
    assert len(asked) == 3  # a call that needs a gradient is judged on its own
    # top-left causal over fewer queries than keys: the kernel reads the 8 keys SDPA lets them see; a
    # fallback (fp32) gets all 10 with the model's is_causal, so SDPA applies its own alignment
    calls = []
    monkeypatch.setattr(ad._AttentionBackendRegistry, "_backends", {
        **ad._AttentionBackendRegistry._backends,
        ad.AttentionBackendName.NATIVE: lambda **kw: calls.append(kw) or native(**kw)})
    backend(query=q.float(), key=k.float(), value=v.float(), is_causal=True)
    assert calls[-1]["key"].shape[1] == 10 and calls[-1]["is_causal"] is True
    backend(query=q, key=k, value=v, is_causal=True)
    assert spy.calls[-1]["k"][1] == 8 and spy.calls[-1]["causal"] is True


@needs_df
def test_diffusers_strict_registration_refuses(monkeypatch):
    kern, _ = cpu_hopattn(monkeypatch)
    hop_df.register(kernel=kern, strict=True)
    try:
        q = torch.randn(1, 8, 2, 80).to(BF16)
        with pytest.raises(RoutingError, match=r"diffusers attention call \[B=1 H=2 Lq=8 Lk=8 D=80.*head dim 80"):
            dispatch(q, q, q)
    finally:
        hop_df.unregister()
