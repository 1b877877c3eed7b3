"""Training through hopattn.integrations on CPU: a model in train() mode sends its attention calls,
which need a gradient, to hopattn; gradients reach q, k and v through the kernel (the float64
reference standing in for it, as in test_integrations.py, and hopattn's own ops on meta tensors,
whose fake implementations run instead of a launch); what the kernel cannot serve in training
(attention dropout, a kernel without a backward) falls back with its reason; the ``deterministic``
option reaches the call; double backward raises instead of giving a wrong number.

Tolerances: a gradient through hopattn is compared with the same model in float32 (SDPA), and must
be no further from it than twice the distance of SDPA's own bf16 gradient: a bound relative to the
rounding every bf16 run has, not a guessed absolute. A wrong gradient (a scale missed, the causal
mask dropped, the K/V heads summed wrongly) is off by O(1) and fails it by far.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest

torch = pytest.importorskip("torch")
from hopattn.integrations import kernels, routing  # noqa: E402
from hopattn.integrations.routing import RoutingError  # noqa: E402
from test_integrations import BF16, cpu_hopattn, needs_df, needs_tf, rel_err, tiny_llama, tiny_wan, wan_inputs  # noqa: E402

try:
    import transformers
    from hopattn.integrations import transformers as hop_tf
except ImportError:  # the tests that need it skip (needs_tf)
    transformers = None
try:
    from diffusers.models import attention_dispatch as ad
    from hopattn.integrations import diffusers as hop_df
except ImportError:  # (needs_df)
    ad = None

DROPOUT = "dropout 0.1 (the kernel has none)"


def grad_errors(model_grads: dict, ref: dict) -> tuple[float, float]:
    """(relative error of all gradients together, the worst relative error of one tensor)."""
    num = sum(float((model_grads[n].float() - g.float()).norm() ** 2) for n, g in ref.items())
    den = sum(float(g.float().norm() ** 2) for g in ref.values())
    worst = max(rel_err(model_grads[n], g) for n, g in ref.items() if g.norm() > 0)
    return (num / den) ** 0.5, worst


def grads_of(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def test_report_counts_served_calls_with_a_backward():
    shape = routing.CallShape("x", 1, 4, 2, 8, 8, 128, True, "bhsd", "bfloat16")
    with routing.track() as report:
        routing.record(shape, mode=routing.DIRECT, grad=True, deterministic=True)
        routing.record(shape, mode=routing.DIRECT, grad=True)
        routing.record(shape, mode=routing.DIRECT)
        routing.record(shape, reason=DROPOUT, grad=True)  # a fallback: SDPA's backward, not the kernel's
    assert (report.served, report.backward, report.deterministic) == (3, 2, 1)
    assert report.summary() == ("4 attention calls: 3 served by hopattn (2 with a gradient through its backward, "
                                "1 of them deterministic); 1 sent to SDPA: dropout 0.1 (the kernel has none)")
    assert report.to_dict()["backward"] == 2 and report.to_dict()["deterministic"] == 1
    with routing.track() as report:
        routing.record(shape, mode=routing.REPEAT_KV, grad=True, deterministic=True)
    assert report.summary() == ("1 attention calls: 1 served by hopattn (1 after repeating K/V heads; 1 with a "
                                "gradient through its deterministic backward)")


def test_kernels_say_whether_they_train():
    q = torch.zeros(1, 4, 8, 128, dtype=BF16)
    from hopattn import backward

    final = kernels.hopattn_kernel()
    assert final.backward and final.deterministic == backward.stages()[-1].deterministic
    assert not kernels.hopattn_kernel(stage=19).backward  # keeps no log-sum-exp: nothing to recompute P from
    ref = kernels.reference_kernel(devices=("cpu",))
    assert ref.unsupported(q, q, q, True, grad=True, deterministic=True) is None
    inference_only = dataclasses.replace(ref, backward=False, label="an inference build")
    assert inference_only.unsupported(q, q, q, True) is None
    assert inference_only.unsupported(q, q, q, True, grad=True) == "gradient needed (an inference build has no backward)"
    atomics = dataclasses.replace(ref, deterministic=False, label="k")
    assert atomics.unsupported(q, q, q, True, grad=True) is None
    assert atomics.unsupported(q, q, q, True, grad=False, deterministic=True) is None  # a forward is deterministic
    assert atomics.unsupported(q, q, q, True, grad=True, deterministic=True).startswith(
        "deterministic algorithms requested (k has no deterministic backward)")
    with pytest.raises(ValueError, match="backward_stage: expected"):
        kernels.hopattn_kernel(backward_stage=99)


def test_serve_differentiates_through_repeats_and_copies():
    """K/V heads repeated for a kernel without GQA, a copy for strides it cannot read: the gradient
    still reaches the tensors the model gave, as it does without them."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 8, 256, generator=g).to(BF16)[..., ::2].requires_grad_()  # head dim not contiguous
    k = torch.randn(1, 2, 8, 128, generator=g).to(BF16).requires_grad_()
    v = torch.randn(1, 2, 8, 128, generator=g).to(BF16).requires_grad_()
    dout = torch.randn(1, 4, 8, 128, generator=g).to(BF16)
    want = torch.autograd.grad(kernels.reference_attention(q.contiguous(), k, v, causal=True, scale=0.1), (q, k, v),
                               dout)
    out, mode = routing.serve(kernels.reference_kernel(gqa=False), q, k, v, causal=True, scale=0.1, layout="bhsd")
    assert mode == routing.REPEAT_KV
    got = torch.autograd.grad(out, (q, k, v), dout)
    assert torch.equal(got[0], want[0])  # dq: the same float64 computation, rounded once
    # dk, dv: summed over the two query heads of each K/V head in bf16 after the repeat, in float64 without it
    assert all(a.shape == b.shape and rel_err(a, b) < 1e-2 for a, b in zip(got, want))


# --- transformers -------------------------------------------------------------------------------


@pytest.fixture
def tf_registered(monkeypatch):
    kern, spy = cpu_hopattn(monkeypatch, gqa=True)
    hop_tf.register(kernel=kern)
    yield spy
    hop_tf.unregister()


def llama_step(model, ids, impl):
    model.set_attn_implementation(impl)
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.detach(), grads_of(model)


@needs_tf
def test_llama_in_train_mode_is_served_and_its_gradients_match_float32_as_sdpa_does(tf_registered):
    model = tiny_llama().train()
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    ref_loss, ref = llama_step(model, ids, "sdpa")
    with routing.track(strict=True) as report:
        loss, got = llama_step(model, ids, "hopattn")
    assert report.calls == report.served == report.backward == 2, report.summary()
    assert "2 with a gradient through its backward" in report.summary()
    assert all(c["requires_grad"] for c in tf_registered.calls) and len(tf_registered.calls) == 2
    assert got.keys() == ref.keys() and any("q_proj" in n for n in got)  # through attention into q, k, v
    exact = copy.deepcopy(model).float()
    exact_loss, exact_grads = llama_step(exact, ids, "sdpa")
    sdpa_err, hop_err = grad_errors(ref, exact_grads), grad_errors(got, exact_grads)
    assert hop_err[0] <= 2 * sdpa_err[0] and hop_err[1] <= 2 * sdpa_err[1], (hop_err, sdpa_err)
    assert abs(float(loss) - float(exact_loss)) <= 2 * abs(float(ref_loss) - float(exact_loss)) + 1e-3 * float(exact_loss)
    assert grad_errors(got, ref)[0] < 3e-2


@needs_tf
def test_gradient_checkpointing_serves_the_recomputed_forward_too(tf_registered):
    model = tiny_llama().train()
    ids = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(2))
    _, plain = llama_step(model, ids, "hopattn")
    model.gradient_checkpointing_enable()
    with routing.track(strict=True) as report:
        _, checkpointed = llama_step(model, ids, "hopattn")
    assert report.served == report.backward == 4  # two layers, each forward run again in the backward
    assert all(torch.allclose(checkpointed[n], g, rtol=0, atol=0) for n, g in plain.items())


@needs_tf
def test_dropout_in_training_falls_back_to_sdpa_with_its_reason_and_sdpas_gradients(tf_registered):
    model = tiny_llama(attention_dropout=0.1).train()
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(3))
    torch.manual_seed(5)
    ref_loss, ref = llama_step(model, ids, "sdpa")
    torch.manual_seed(5)
    with routing.track() as report:
        loss, got = llama_step(model, ids, "hopattn")
    assert report.served == 0 and report.fallbacks == {DROPOUT: 2} and report.targets[DROPOUT] == "SDPA"
    assert torch.equal(loss, ref_loss) and all(torch.equal(got[n], g) for n, g in ref.items())  # SDPA's dropout
    assert not tf_registered.calls
    with pytest.raises(RoutingError, match="dropout 0.1"), routing.track(strict=True):
        llama_step(model, ids, "hopattn")
    model.eval()  # transformers passes no dropout outside training: served, gradients and all
    with routing.track(strict=True) as report:
        llama_step(model, ids, "hopattn")
    assert report.served == report.backward == 2


@needs_tf
def test_a_kernel_without_a_backward_sends_training_calls_to_sdpa(monkeypatch):
    kern, spy = cpu_hopattn(monkeypatch)
    kern = dataclasses.replace(kern, backward=False, label="an inference build")
    hop_tf.register(kernel=kern)
    reason = "gradient needed (an inference build has no backward)"
    try:
        model = tiny_llama().train()
        ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(4))
        _, ref = llama_step(model, ids, "sdpa")
        with routing.track() as report:
            _, got = llama_step(model, ids, "hopattn")
        assert report.fallbacks == {reason: 2} and all(torch.equal(got[n], g) for n, g in ref.items())
        with torch.no_grad(), routing.track(strict=True) as report:  # inference: served
            model(ids)
        assert report.served == 2 and report.backward == 0
        with pytest.raises(RoutingError, match="has no backward"), routing.track(strict=True):
            llama_step(model, ids, "hopattn")
    finally:
        hop_tf.unregister()


@needs_tf
def test_deterministic_option_reaches_the_call(monkeypatch):
    kern, spy = cpu_hopattn(monkeypatch)
    model = tiny_llama().train()
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(6))
    try:
        for option, torch_flag, want in ((True, False, True), (False, True, False), (None, False, False),
                                         (None, True, True)):
            hop_tf.register(kernel=kern, deterministic=option)
            spy.calls.clear()
            previous = torch.are_deterministic_algorithms_enabled()
            torch.use_deterministic_algorithms(torch_flag)
            try:
                with routing.track(strict=True) as report:
                    llama_step(model, ids, "hopattn")
            finally:
                torch.use_deterministic_algorithms(previous)
            assert [c["deterministic"] for c in spy.calls] == [want, want], (option, torch_flag)
            assert report.deterministic == (2 if want else 0)
        # a model that passes flash-attention's deterministic=True to its attention gets it too
        hop_tf.register(kernel=kern, deterministic=False)
        attention = transformers.AttentionInterface._global_mapping["hopattn"]
        q = torch.randn(1, 4, 8, 128, dtype=BF16, requires_grad=True)
        kv = torch.randn(1, 2, 8, 128, dtype=BF16, requires_grad=True)
        attention(model.model.layers[0].self_attn, q, kv, kv, None, deterministic=True)
        assert spy.calls[-1]["deterministic"] is True
        with pytest.raises(TypeError, match="deterministic: expected True, False or None"):
            hop_tf.register(kernel=kern, deterministic="yes")
        atomics = dataclasses.replace(kern, deterministic=False, label="an atomic build")
        with pytest.raises(ValueError, match="an atomic build has no deterministic backward"):
            hop_tf.register(kernel=atomics, deterministic=True)
        # following torch's flag with a kernel that cannot: training calls go to SDPA, counted
        hop_tf.register(kernel=atomics)
        torch.use_deterministic_algorithms(True)
        try:
            with routing.track() as report:
                llama_step(model, ids, "hopattn")
        finally:
            torch.use_deterministic_algorithms(False)
        assert report.fallbacks == {"deterministic algorithms requested (an atomic build has no deterministic "
                                    "backward)": 2}
    finally:
        hop_tf.unregister()


class OpLog(torch.utils._python_dispatch.TorchDispatchMode):
    """The hopattn ops that run inside the block, with their arguments."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "hopattn":
            self.calls.append((func.name().removeprefix("hopattn::"), args))
        return func(*args, **(kwargs or {}))


def meta_hopattn() -> kernels.Kernel:
    """The real hopattn kernel, taking meta tensors: its ops run their fake implementations."""
    return dataclasses.replace(kernels.hopattn_kernel(), devices=("meta",))


@needs_tf
def test_gradients_reach_q_k_v_through_hopattns_ops_on_meta_tensors():
    kern = meta_hopattn()
    hop_tf.register(kernel=kern, strict=True, deterministic=kern.deterministic)
    try:
        with torch.device("meta"):
            model = tiny_llama().train()
        model.set_attn_implementation("hopattn")
        ids = torch.randint(0, 256, (2, 16), device="meta")
        with routing.track(strict=True) as report, OpLog() as ops:
            loss = model(ids, labels=ids).loss
            forward = [name for name, _ in ops.calls]
            loss.backward()
        assert report.served == report.backward == 2 and forward == ["attention_lse"] * 2
        backward = [args for name, args in ops.calls if name == "attention_backward"]
        assert len(backward) == 2
        assert all(args[10] is kern.deterministic for args in backward)  # (dout, q, k, v, out, lse, dlse, causal,
        # scale, layout, deterministic, stage): the option reached the backward op
        attn = model.model.layers[0].self_attn
        assert all(getattr(attn, p).weight.grad.shape == getattr(attn, p).weight.shape
                   for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
        # the attention function alone: gradients shaped like q and the grouped k, v
        attention = transformers.AttentionInterface._global_mapping["hopattn"]
        q = torch.empty(1, 4, 128, 128, dtype=BF16, device="meta", requires_grad=True)
        k, v = (torch.empty(1, 2, 128, 128, dtype=BF16, device="meta", requires_grad=True) for _ in range(2))
        out, _ = attention(attn, q, k, v, None)
        out.sum().backward()
        assert (q.grad.shape, k.grad.shape, v.grad.shape) == (q.shape, k.shape, v.shape)
    finally:
        hop_tf.unregister()


@needs_tf
def test_double_backward_raises_instead_of_a_wrong_number():
    """create_graph=True gives the first-order gradient; a backward through it raises."""
    hop_tf.register(kernel=meta_hopattn())
    try:
        with torch.device("meta"):
            module = tiny_llama(layers=1).model.layers[0].self_attn
        attention = transformers.AttentionInterface._global_mapping["hopattn"]
        q = torch.empty(1, 4, 128, 128, dtype=BF16, device="meta", requires_grad=True)
        kv = torch.empty(1, 2, 128, 128, dtype=BF16, device="meta", requires_grad=True)
        out, _ = attention(module, q, kv, kv, None)
        (dq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
        assert dq.shape == q.shape
        with pytest.raises(RuntimeError, match="hopattn.attention_backward.*no autograd formula"):
            dq.sum().backward()
    finally:
        hop_tf.unregister()


# --- diffusers ----------------------------------------------------------------------------------


@pytest.fixture
def df_registered(monkeypatch):
    kern, spy = cpu_hopattn(monkeypatch, gqa=True)
    hop_df.register(kernel=kern)
    yield spy
    hop_df.unregister()


def wan_step(model, inputs, backend, target):
    model.zero_grad(set_to_none=True)
    with ad.attention_backend(backend):
        pred = model(**inputs)[0]
    loss = (pred.float() - target.float()).square().mean()  # flow matching: the velocity's squared error
    loss.backward()
    return loss.detach(), grads_of(model)


@needs_df
def test_wan_training_step_is_served_and_its_gradients_match_float32_as_native_does(df_registered):
    model = tiny_wan().train()
    inputs = wan_inputs()
    target = torch.randn(inputs["hidden_states"].shape, generator=torch.Generator().manual_seed(7))
    ref_loss, ref = wan_step(model, inputs, "native", target)
    with routing.track(strict=True) as report:
        loss, got = wan_step(model, inputs, "hopattn", target)
    assert report.calls == report.served == report.backward == 4, report.summary()
    assert all(c["requires_grad"] and c["layout"] == "bshd" for c in df_registered.calls)
    assert any("attn1.to_q" in n for n in got) and any("attn2.to_k" in n for n in got)
    exact = copy.deepcopy(model).float()
    float_inputs = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()}
    exact_loss, exact_grads = wan_step(exact, float_inputs, "native", target)
    sdpa_err, hop_err = grad_errors(ref, exact_grads), grad_errors(got, exact_grads)
    assert hop_err[0] <= 2 * sdpa_err[0] and hop_err[1] <= 2 * sdpa_err[1], (hop_err, sdpa_err)
    assert abs(float(loss) - float(exact_loss)) <= 2 * abs(float(ref_loss) - float(exact_loss)) + 1e-3 * float(exact_loss)


@needs_df
def test_diffusers_deterministic_option_reaches_the_call(monkeypatch):
    kern, spy = cpu_hopattn(monkeypatch)
    hop_df.register(kernel=kern, deterministic=True)
    try:
        q = torch.randn(1, 8, 2, 128, dtype=BF16, requires_grad=True)
        with routing.track(strict=True) as report:
            ad.dispatch_attention_fn(q, q, q, backend=ad.AttentionBackendName("hopattn")).sum().backward()
        assert spy.calls[-1]["deterministic"] is True and spy.calls[-1]["requires_grad"] is True
        assert report.deterministic == report.backward == 1 and q.grad.shape == q.shape
        with pytest.raises(ValueError, match="no deterministic backward"):
            hop_df.register(kernel=dataclasses.replace(kern, deterministic=False), deterministic=True)
    finally:
        hop_df.unregister()


@needs_df
def test_diffusers_dropout_in_training_falls_back_to_native(df_registered):
    q = torch.randn(1, 8, 2, 128, dtype=BF16, requires_grad=True)
    with routing.track() as report:
        ad.dispatch_attention_fn(q, q, q, dropout_p=0.1, backend=ad.AttentionBackendName("hopattn")).sum().backward()
    assert report.fallbacks == {DROPOUT: 1} and report.targets[DROPOUT] == "diffusers' native backend"
    assert q.grad is not None and not df_registered.calls


@needs_df
def test_wan_gradients_through_hopattns_ops_on_meta_tensors():
    hop_df.register(kernel=meta_hopattn(), strict=True)
    try:
        with torch.device("meta"):
            model = tiny_wan().train()
        inputs = {k: v.to("meta") if torch.is_tensor(v) else v for k, v in wan_inputs().items()}
        with routing.track(strict=True) as report, OpLog() as ops, ad.attention_backend("hopattn"):
            model(**inputs)[0].float().square().mean().backward()
        names = [name for name, _ in ops.calls]
        assert report.served == report.backward == 4
        assert names.count("attention_lse") == 4 and names.count("attention_backward") == 4
        assert model.blocks[0].attn1.to_q.weight.grad.shape == model.blocks[0].attn1.to_q.weight.shape
    finally:
        hop_df.unregister()


def _sdpa_switches() -> dict:
    b = torch.backends.cuda
    return {"flash": b.flash_sdp_enabled(), "efficient": b.mem_efficient_sdp_enabled(), "math": b.math_sdp_enabled(),
            "cudnn": b.cudnn_sdp_enabled()}


def test_a_fallback_with_a_gradient_runs_sdpa_without_cudnn_and_keeps_the_callers_switches():
    before = _sdpa_switches()
    with routing.sdpa_for_gradients(False):  # inference: SDPA's own choice
        assert _sdpa_switches() == before
    with routing.sdpa_for_gradients(True):
        assert _sdpa_switches() == {**before, "cudnn": False}
    assert _sdpa_switches() == before
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH, SDPBackend.CUDNN_ATTENTION]):  # the caller turned flash off
        with routing.sdpa_for_gradients(True):
            assert _sdpa_switches() == {"flash": False, "efficient": False, "math": True, "cudnn": False}
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):  # cuDNN alone, as the caller asked: kept
        with routing.sdpa_for_gradients(True):
            assert _sdpa_switches()["cudnn"] is True


@needs_tf
def test_transformers_training_fallback_runs_sdpa_without_cudnn(monkeypatch):
    from transformers.integrations import sdpa_attention

    seen = []
    real = sdpa_attention.sdpa_attention_forward

    def spy(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward", spy)  # before register: it is looked up there
    kern, _ = cpu_hopattn(monkeypatch, gqa=True)
    hop_tf.register(kernel=kern)
    try:
        model = tiny_llama(attention_dropout=0.1).train()
        ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(3))
        with routing.track() as report:
            llama_step(model, ids, "hopattn")
        assert report.fallbacks == {DROPOUT: 2} and seen == [False, False]
        with torch.no_grad():  # still dropout (train mode), no gradient: SDPA's own choice
            model(ids)
        assert seen[2:] == [torch.backends.cuda.cudnn_sdp_enabled()] * 2
    finally:
        hop_tf.unregister()


@needs_df
def test_diffusers_training_fallback_runs_native_without_cudnn(df_registered, monkeypatch):
    seen = []
    real = ad._AttentionBackendRegistry._backends[ad.AttentionBackendName.NATIVE]

    def spy(**kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real(**kwargs)

    monkeypatch.setitem(ad._AttentionBackendRegistry._backends, ad.AttentionBackendName.NATIVE, spy)
    q = torch.randn(1, 8, 2, 128, dtype=BF16, requires_grad=True)
    ad.dispatch_attention_fn(q, q, q, dropout_p=0.1, backend=ad.AttentionBackendName("hopattn")).sum().backward()
    with torch.no_grad():
        ad.dispatch_attention_fn(q, q, q, dropout_p=0.1, backend=ad.AttentionBackendName("hopattn"))
    assert seen == [False, torch.backends.cuda.cudnn_sdp_enabled()]
