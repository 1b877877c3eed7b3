"""hopattn as a transformers attention implementation (transformers 5.x).

    from hopattn.integrations import transformers as hop
    hop.register()                                   # once: "hopattn" becomes an attn_implementation
    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16, attn_implementation="hopattn")
    # or, on a model already built: model.set_attn_implementation("hopattn")

Two extension points are used: ``AttentionInterface.register(name, fn)`` (the function every
``*Attention`` module of a model calls) and ``AttentionMaskInterface.register(name, sdpa_mask)``:
without a mask function of its own, transformers passes a custom implementation no mask at all, and
padding would be lost in silence. With SDPA's, the mask is None exactly when SDPA itself would rely
on ``is_causal``, and materialized otherwise — then it is served if it is the causal pattern or empty.

Calls the kernel cannot serve are counted with their reason (strict=False), or raise RoutingError
naming it (strict=True). A fallback keeps every argument the model passed: calls whose arguments
SDPA honours (masks, dropout, scaling, position bias) go to transformers' own SDPA function,
unchanged; calls with an argument SDPA would drop (attention sinks, logit softcapping, a request
for the attention weights, or an argument this glue does not know) go to the model's own eager
attention function, with the mask in the additive form eager expects.

Head dims: every (q and k, v) pair the final forward stage serves (its supports.head_dims: 64, 96,
128, 256, and q/k 192 with v 128 as DeepSeek's MLA prefill passes it); the output has v's head dim,
and the default scale is 1/sqrt(q's). Another head dim falls back with a reason naming those served.

Training (``model.train()``, a loss's ``.backward()``): a call that needs a gradient (grad mode on,
an input that requires grad) is served like any other where hopattn's backward serves its head dim
(kernels/attention_backward/, through hopattn.attention's autograd: head dim 128), and its gradients
come from that backward; at another head dim it goes to SDPA ("gradient needed at head dim N (the
backward serves 128)"), whose gradient it gets. What the forward cannot serve falls back as in
inference; so does attention dropout, which transformers passes only in training
(``attention_dropout`` > 0 with ``model.train()``): SDPA applies it, as the model asked. A fallback
that needs a gradient runs SDPA without its cuDNN backend, whose backward is wrong on torch 2.11 for
the strided q, k, v transformers passes when the output's gradient is laid out like the output
(``routing.sdpa_for_gradients``).
``register(deterministic=True)`` gives gradients identical bit for bit run to run (hopattn's
backward without atomics); the default, None, follows ``torch.use_deterministic_algorithms``, and a
model that passes ``deterministic=True`` to its attention gets it too. Gradient checkpointing works
(the recomputed forward is served again, and counted again). Double backward (``create_graph=True``
and then a backward through that gradient: gradient penalties, Hessian-vector products) is not
supported: hopattn's backward is not itself differentiable, and that second backward raises
PyTorch's "no autograd formula was registered" error for hopattn.attention_backward instead of
giving a wrong number. Such models need attn_implementation="eager".
"""

from __future__ import annotations

import math
import sys

import torch

from . import masks, routing
from .kernels import Kernel, hopattn_kernel

LIBRARY = "transformers"


def register(strict: bool = False, kernel: Kernel | None = None, name: str = "hopattn",
             deterministic: bool | None = None) -> str:
    """Make ``attn_implementation=name`` route to ``kernel`` (default: hopattn's final stage).

    ``deterministic``: True gives gradients identical bit for bit run to run, False the faster
    backward (dQ through atomics), None (default) follows ``torch.use_deterministic_algorithms``.
    Returns ``name``. Registering again replaces the earlier registration of that name.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    kernel = kernel or hopattn_kernel()
    routing.check_deterministic_option(deterministic, kernel)
    AttentionInterface.register(name, make_attention_function(kernel, strict, deterministic))
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def unregister(name: str = "hopattn") -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface._global_mapping.pop(name, None)
    AttentionMaskInterface._global_mapping.pop(name, None)


# Keyword arguments models pass (transformers 5.17) that change what attention computes and that SDPA
# ignores: only the model's own eager attention honours them. A value of None, 0 or False switches
# one off.
EAGER_ONLY = {"s_aux": "attention sinks", "softcap": "logit softcapping",
              "output_attentions": "attention weights requested"}
# Keyword arguments that say nothing the kernel, given the mask, would get wrong: positions and
# packed-sequence bounds (the mask already holds the packing), and the flags of the model's forward.
# (Sparse-attention indices, `indices` and `block_indices`, are not among them: they go to eager.)
# `deterministic` (flash-attention's flag, which some models pass) asks for the deterministic backward.
PASSIVE = {"position_ids", "cache_position", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
           "output_hidden_states", "use_cache", "past_key_values", "return_dict", "sliding_window", "position_bias",
           "layer_idx", "deterministic", "output_router_logits", "encoder_hidden_states"}
SDPA = "SDPA"
EAGER = "the model's eager attention"


def make_attention_function(kernel: Kernel, strict: bool, deterministic: bool | None = None):
    """The function transformers calls: (module, q, k, v, mask, ...) with BHSD q, k, v; returns
    (attention output BSHD, None), or what the fallback returns. Differentiable in q, k, v when the
    kernel has a backward (``deterministic`` as ``register`` takes it)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        causal, keys, reason, target = _plan(module, query, key, attention_mask, dropout, is_causal, kwargs)
        shape = routing.shape_of(LIBRARY, query, key[:, :, :keys], causal, "bhsd", v=value)
        grad = routing.needs_grad(query, key, value)
        exact = routing.wants_deterministic(deterministic) or bool(kwargs.get("deterministic"))
        reason = reason or kernel.unsupported(query, key, value, causal, grad=grad, deterministic=exact)
        if reason is None and scaling is not None and not (math.isfinite(scaling) and scaling > 0):
            reason = f"scale {scaling} (the kernel takes a positive scale)"
        if reason is not None:
            routing.refuse_or_record(kernel.name, shape, reason, strict, target=target)
            if target == EAGER:
                return _eager(module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs)
            with routing.sdpa_for_gradients(grad):  # not cuDNN's backward: see routing.sdpa_for_gradients
                return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                              scaling=scaling, is_causal=is_causal, **kwargs)
        if keys < key.shape[2]:
            key, value = key[:, :, :keys], value[:, :, :keys]
        scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
        out, mode = _run(kernel, query, key, value, causal, scale, exact)
        routing.record(shape, mode=mode, grad=grad, deterministic=exact)
        return out, None

    attention.__name__ = f"{kernel.name}_attention_forward"
    return attention


def _eager(module, query, key, value, mask, dropout, scaling, is_causal, kwargs):
    """The model's own eager attention (``eager_attention_forward`` of the module's modeling file),
    given what the model gave this call. The mask comes in SDPA's form (True = attend, or None for
    plain causal or full attention, which SDPA's is_causal rule decides): eager adds it to the scores."""
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None:
        raise routing.RoutingError(f"{type(module).__name__}: this attention call needs the model's eager attention "
                                   f"(an argument SDPA would drop), and {type(module).__module__} has none; use "
                                   f"attn_implementation='eager' for this model")
    q_len, k_len = query.shape[2], key.shape[2]
    if mask is None:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        if causal and q_len > 1:  # SDPA's is_causal: top-left aligned
            mask = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril()[None, None]
    if mask is not None and mask.dtype == torch.bool:
        additive = torch.zeros(mask.shape, dtype=query.dtype, device=query.device)
        mask = additive.masked_fill(~mask, torch.finfo(query.dtype).min)
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    extra = dict(kwargs) if is_causal is None else dict(kwargs, is_causal=is_causal)
    return eager(module, query, key, value, mask, scaling=scaling, dropout=dropout, **extra)


def _plan(module, query, key, mask, dropout, is_causal, kwargs) -> tuple[bool, int, str | None, str]:
    """(causal, keys to keep, reason the call cannot be served or None, where it goes if not: SDPA
    or EAGER, whichever honours every argument it carries)."""
    q_len, k_len = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    keys = k_len
    for arg, value in kwargs.items():
        if value is None or value is False or (isinstance(value, (int, float)) and value == 0):
            continue  # switched off
        if arg in EAGER_ONLY:
            return causal, keys, f"{EAGER_ONLY[arg]} ({arg})", EAGER
        if arg not in PASSIVE:
            return causal, keys, f"argument {arg} (not known to hopattn)", EAGER
    if dropout:
        return causal, keys, f"dropout {dropout} (the kernel has none)", SDPA
    position_bias = kwargs.get("position_bias")
    if position_bias is not None:
        return causal, keys, "position bias (position_bias)", SDPA
    window = kwargs.get("sliding_window")
    if window is not None and 0 < window < k_len:  # the mask holds the window: SDPA honours it
        return causal, keys, f"sliding window {window} over {k_len} keys", SDPA
    verdict = masks.classify(mask, q_len, k_len)
    if verdict == masks.OTHER:
        return causal, keys, "attention mask (padding or another pattern than causal)", SDPA
    if verdict == masks.CAUSAL:
        return True, keys, None, SDPA
    if mask is not None:
        return False, keys, None, SDPA  # a mask that masks nothing: SDPA too runs it as full attention
    # No mask: SDPA's rule (transformers' sdpa_attention): causal only for more than one query, top-left.
    causal = bool(causal) and q_len > 1
    if causal:
        keys, reason = masks.top_left_causal(q_len, k_len)
        if reason:
            return causal, k_len, reason, SDPA
    return causal, keys, None, SDPA


def _run(kernel: Kernel, query, key, value, causal: bool, scale: float, deterministic: bool = False):
    """The kernel on BHSD tensors; returns (BSHD output, mode). BSHD views are read in place when
    the model's tensors are laid out that way (a projection's output viewed as heads)."""
    as_bshd = [t.transpose(1, 2) for t in (query, key, value)]
    if all(kernel.accepts(t, "bshd") for t in as_bshd):
        return routing.serve(kernel, *as_bshd, causal=causal, scale=scale, layout="bshd", deterministic=deterministic)
    out, mode = routing.serve(kernel, query, key, value, causal=causal, scale=scale, layout="bhsd",
                              deterministic=deterministic)
    return out.transpose(1, 2), mode
