"""GPU cases of training through the integrations, run inside the watchdog's worker process
(gpu_watchdog.Worker(..., cases="training_cases")), never in pytest's.

Each case runs one training step (forward, loss, backward) of a small real configuration three
times on the same weights, in this process: through hopattn (strict routing: every call served,
each with a backward), through the library's SDPA, and through SDPA on a float32 copy of the model,
which stands for the exact gradient. The check: hopattn's loss and gradients are no further from the
float32 run than twice SDPA's own bf16 distance from it (gradients: all weights together, and the
attention modules' weights together), plus, for the loss, a floor of 2e-3 relative (well under
bf16's 7.8e-3 epsilon) for when both land almost on it. The bound scales with the rounding every
bf16 run has, so it needs no guessed absolute; factor 2 leaves room for another accumulation order
with the same rounding, and a wrong gradient (a scale missed, the causal mask dropped, K/V heads
summed wrongly, a tile left unwritten) is off by O(1). A case returns its numbers (logged) and
raises AssertionError with them otherwise.

The bf16 SDPA run the bound scales with runs without SDPA's cuDNN backend (routing.sdpa_for_gradients):
torch 2.11's cuDNN backward can be wrong for strided q, k, v (research/accuracy/README.md), and a
bound of twice a wrong run's distance would pass anything. The default backend's distance is logged
beside it (sdpa_default_grads; on these models it has matched the pinned run's).
"""

from __future__ import annotations

import copy

import torch

BF16, CUDA = torch.bfloat16, "cuda"
DETERMINISTIC = "hopattn_deterministic"  # the same kernel registered with deterministic=True
FACTOR, LOSS_FLOOR = 2.0, 2e-3


def initialise() -> None:
    from hopattn.integrations import diffusers as hop_df
    from hopattn.integrations import kernels
    from hopattn.integrations import transformers as hop_tf

    torch.cuda.init()
    torch.zeros(1, device=CUDA)
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 run in float32, not TF32
    torch.backends.cudnn.allow_tf32 = False
    hop_tf.register()
    hop_df.register()
    if kernels.hopattn_kernel().deterministic:
        hop_tf.register(name=DETERMINISTIC, deterministic=True)
        hop_df.register(name=DETERMINISTIC, deterministic=True)


def healthy() -> bool:
    try:
        torch.ones(1, device=CUDA).add_(1)
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001
        return False


def _grads(model) -> dict:
    return {n: p.grad.detach().float() for n, p in model.named_parameters() if p.grad is not None}


def _rel(grads: dict, ref: dict, names=None) -> float:
    names = [n for n in ref if names is None or names(n)]
    num = sum(float((grads[n] - ref[n]).square().sum()) for n in names)
    den = sum(float(ref[n].square().sum()) for n in names)
    return (num / den) ** 0.5


def _compare(label: str, hop: tuple, sdpa: tuple, exact: tuple, report) -> dict:
    """hopattn's (loss, grads) against the float32 run's, within FACTOR times SDPA's distance."""
    (hop_loss, hop_g), (sdpa_loss, sdpa_g), (exact_loss, exact_g) = hop, sdpa, exact
    assert hop_g.keys() == sdpa_g.keys() == exact_g.keys(), f"{label}: different parameters got gradients"
    attention = lambda n: "attn" in n  # noqa: E731  (Llama's self_attn, Wan's attn1 and attn2)
    got = {"hop_grads": _rel(hop_g, exact_g), "sdpa_grads": _rel(sdpa_g, exact_g),
           "hop_attn_grads": _rel(hop_g, exact_g, attention), "sdpa_attn_grads": _rel(sdpa_g, exact_g, attention),
           "hop_vs_sdpa_grads": _rel(hop_g, sdpa_g), "hop_loss": abs(hop_loss - exact_loss) / abs(exact_loss),
           "sdpa_loss": abs(sdpa_loss - exact_loss) / abs(exact_loss), "calls": report.calls,
           "backward": report.backward}
    numbers = ", ".join(f"{k} {v:.3g}" for k, v in got.items())
    assert report.calls == report.served == report.backward > 0, f"{label}: {report.summary()}"
    assert all(torch.isfinite(g).all() for g in hop_g.values()), f"{label}: a gradient through hopattn is not finite"
    assert got["hop_grads"] <= FACTOR * got["sdpa_grads"], f"{label}: gradients too far from float32 ({numbers})"
    assert got["hop_attn_grads"] <= FACTOR * got["sdpa_attn_grads"], \
        f"{label}: attention weights' gradients too far from float32 ({numbers})"
    assert got["hop_loss"] <= FACTOR * got["sdpa_loss"] + LOSS_FLOOR, f"{label}: loss too far from float32 ({numbers})"
    return got


# --- transformers: Llama ---------------------------------------------------------------------------


def _llama(layers: int):
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
                                   num_attention_heads=16, num_key_value_heads=4, head_dim=128,
                                   max_position_embeddings=8192, attn_implementation="sdpa")
    with torch.device(CUDA):
        return transformers.LlamaForCausalLM(cfg).to(BF16).train()


def _llama_step(model, ids, impl, sdpa_default: bool = False) -> tuple[float, dict]:
    """One step; SDPA without its cuDNN backward unless sdpa_default (see the module's docstring)."""
    from hopattn.integrations import routing

    model.set_attn_implementation(impl)
    model.zero_grad(set_to_none=True)
    with routing.sdpa_for_gradients(impl == "sdpa" and not sdpa_default):
        loss = model(ids, labels=ids, use_cache=False).loss
        loss.backward()
    return float(loss.detach()), _grads(model)


def llama_training_step(seed: int, layers: int = 2, batch: int = 2, length: int = 1000) -> dict:
    """A small Llama (GQA 16/4 heads, causal, a length that is no multiple of any tile) trained one
    step through attn_implementation="hopattn" against "sdpa" and a float32 copy."""
    from hopattn.integrations import routing

    model = _llama(layers)
    ids = torch.randint(0, 32000, (batch, length), device=CUDA, generator=torch.Generator(device=CUDA).manual_seed(seed))
    sdpa = _llama_step(model, ids, "sdpa")
    default = _llama_step(model, ids, "sdpa", sdpa_default=True)
    with routing.track(strict=True) as report:
        hop = _llama_step(model, ids, "hopattn")
    exact_model = copy.deepcopy(model).float()
    exact = _llama_step(exact_model, ids, "sdpa")
    got = _compare(f"Llama, {layers} layers, B={batch} L={length}, seed {seed}", hop, sdpa, exact, report)
    return {**got, "sdpa_default_grads": _rel(default[1], exact[1])}


def llama_fallback_gradients(seed: int) -> dict:
    """A Llama at head dim 64, which hopattn's backward does not serve: every call needs a gradient
    and falls back to SDPA with its reason, and the gradients it gets are SDPA's without cuDNN's
    backward — as close to the float32 run as that SDPA run's (the fallback is that run)."""
    import transformers
    from hopattn.integrations import routing

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=2,
                                   num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                                   max_position_embeddings=8192, attn_implementation="sdpa")
    with torch.device(CUDA):
        model = transformers.LlamaForCausalLM(cfg).to(BF16).train()
    ids = torch.randint(0, 32000, (1, 2048), device=CUDA, generator=torch.Generator(device=CUDA).manual_seed(seed))
    sdpa = _llama_step(model, ids, "sdpa")
    default = _llama_step(model, ids, "sdpa", sdpa_default=True)
    with routing.track() as report:
        hop = _llama_step(model, ids, "hopattn")
    exact = _llama_step(copy.deepcopy(model).float(), ids, "sdpa")
    assert report.served == 0 and report.calls == 2 and all("gradient needed at head dim 64" in r
                                                             for r in report.fallbacks), report.summary()
    got = {"hop_grads": _rel(hop[1], exact[1]), "sdpa_grads": _rel(sdpa[1], exact[1]),
           "sdpa_default_grads": _rel(default[1], exact[1])}
    assert got["hop_grads"] <= FACTOR * got["sdpa_grads"], f"fallback gradients too far from float32 ({got})"
    return got


def llama_deterministic(seed: int) -> dict:
    """register(deterministic=True): two training steps give gradients identical bit for bit."""
    from hopattn.integrations import kernels, routing

    if not kernels.hopattn_kernel().deterministic:
        return {"skipped": 1.0}  # the backward's final stage has no deterministic mode
    model = _llama(2)
    ids = torch.randint(0, 32000, (2, 777), device=CUDA, generator=torch.Generator(device=CUDA).manual_seed(seed))
    with routing.track(strict=True) as report:
        first = _llama_step(model, ids, DETERMINISTIC)
        second = _llama_step(model, ids, DETERMINISTIC)
    assert report.deterministic == report.backward == 4, report.summary()
    differ = [n for n in first[1] if not torch.equal(first[1][n], second[1][n])]
    assert not differ and first[0] == second[0], f"deterministic gradients differ run to run in {differ[:5]}"
    return {"tensors": float(len(first[1]))}


# --- diffusers: Wan --------------------------------------------------------------------------------


def _wan_step(model, inputs, target, backend) -> tuple[float, dict]:
    from diffusers.models import attention_dispatch as ad
    from hopattn.integrations import routing

    model.zero_grad(set_to_none=True)
    with ad.attention_backend(backend), routing.sdpa_for_gradients(backend == "native"):
        pred = model(**inputs, return_dict=False)[0]
        loss = (pred.float() - target.float()).square().mean()  # flow matching: the velocity's squared error
        loss.backward()
    return float(loss.detach()), _grads(model)


def wan_training_step(seed: int, layers: int = 2) -> dict:
    """A small Wan2.1 transformer (12 heads of 128 as the 1.3B, self-attention over 5 x 15 x 26 =
    1,950 tokens, cross-attention to 512 text tokens) trained one step through the "hopattn" backend
    against "native" and a float32 copy."""
    import diffusers
    from hopattn.integrations import routing

    torch.manual_seed(0)
    with torch.device(CUDA):
        model = diffusers.WanTransformer3DModel(num_attention_heads=12, attention_head_dim=128, ffn_dim=8960,
                                                num_layers=layers).to(BF16).train()
    g = torch.Generator(device=CUDA).manual_seed(seed)
    inputs = dict(hidden_states=torch.randn(1, 16, 5, 30, 52, device=CUDA, generator=g).to(BF16),
                  timestep=torch.tensor([500.0], device=CUDA),
                  encoder_hidden_states=torch.randn(1, 512, 4096, device=CUDA, generator=g).to(BF16))
    target = torch.randn(1, 16, 5, 30, 52, device=CUDA, generator=g)
    sdpa = _wan_step(model, inputs, target, "native")
    with routing.track(strict=True) as report:
        hop = _wan_step(model, inputs, target, "hopattn")
    lengths = sorted({(s.q_len, s.k_len) for s, _ in report.shapes})
    assert lengths == [(1950, 512), (1950, 1950)], lengths
    exact_model = copy.deepcopy(model).float()
    float_inputs = {k: v.float() if v.is_floating_point() else v for k, v in inputs.items()}
    exact = _wan_step(exact_model, float_inputs, target, "native")
    return _compare(f"Wan, {layers} layers, seed {seed}", hop, sdpa, exact, report)
