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

Calls the kernel cannot serve go to transformers' own SDPA function, unchanged, and are counted
(strict=False), or raise RoutingError naming the reason (strict=True).
"""

from __future__ import annotations

import math

from . import masks, routing
from .kernels import Kernel, hopattn_kernel

LIBRARY = "transformers"


def register(strict: bool = False, kernel: Kernel | None = None, name: str = "hopattn") -> str:
    """Make ``attn_implementation=name`` route to ``kernel`` (default: hopattn's final stage).

    Returns ``name``. Registering again replaces the earlier registration of that name.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    kernel = kernel or hopattn_kernel()
    AttentionInterface.register(name, make_attention_function(kernel, strict))
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def unregister(name: str = "hopattn") -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface._global_mapping.pop(name, None)
    AttentionMaskInterface._global_mapping.pop(name, None)


def make_attention_function(kernel: Kernel, strict: bool):
    """The function transformers calls: (module, q, k, v, mask, ...) with BHSD q, k, v; returns
    (attention output BSHD, None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        causal, keys, reason = _plan(module, query, key, attention_mask, dropout, is_causal, kwargs)
        shape = routing.shape_of(LIBRARY, query, key[:, :, :keys], causal, "bhsd")
        reason = reason or kernel.unsupported(query, key, value, causal)
        if reason is None and scaling is not None and not (math.isfinite(scaling) and scaling > 0):
            reason = f"scale {scaling} (the kernel takes a positive scale)"
        if reason is not None:
            routing.refuse_or_record(kernel.name, shape, reason, strict)
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, is_causal=is_causal, **kwargs)
        if keys < key.shape[2]:
            key, value = key[:, :, :keys], value[:, :, :keys]
        scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
        out, mode = _run(kernel, query, key, value, causal, scale)
        routing.record(shape, mode=mode)
        return out, None

    attention.__name__ = f"{kernel.name}_attention_forward"
    return attention


def _plan(module, query, key, mask, dropout, is_causal, kwargs) -> tuple[bool, int, str | None]:
    """(causal, keys to keep, reason the call cannot be served or None)."""
    q_len, k_len = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    keys = k_len
    if dropout:
        return causal, keys, f"dropout {dropout} (the kernel has none)"
    for arg, what in (("softcap", "logit softcapping"), ("s_aux", "attention sinks"),
                      ("position_bias", "position bias")):
        value = kwargs.get(arg)
        if value is not None and not (isinstance(value, (int, float)) and value == 0):  # 0: switched off
            return causal, keys, f"{what} ({arg})"
    window = kwargs.get("sliding_window")
    if window is not None and 0 < window < k_len:
        return causal, keys, f"sliding window {window} over {k_len} keys"
    verdict = masks.classify(mask, q_len, k_len)
    if verdict == masks.OTHER:
        return causal, keys, "attention mask (padding or another pattern than causal)"
    if verdict == masks.CAUSAL:
        return True, keys, None
    if mask is not None:
        return False, keys, None  # a mask that masks nothing: SDPA too runs it as full attention
    # No mask: SDPA's rule (transformers' sdpa_attention): causal only for more than one query, top-left.
    causal = bool(causal) and q_len > 1
    if causal:
        keys, reason = masks.top_left_causal(q_len, k_len)
        if reason:
            return causal, k_len, reason
    return causal, keys, None


def _run(kernel: Kernel, query, key, value, causal: bool, scale: float):
    """The kernel on BHSD tensors; returns (BSHD output, mode). BSHD views are read in place when
    the model's tensors are laid out that way (a projection's output viewed as heads)."""
    as_bshd = [t.transpose(1, 2) for t in (query, key, value)]
    if all(kernel.accepts(t, "bshd") for t in as_bshd):
        return routing.serve(kernel, *as_bshd, causal=causal, scale=scale, layout="bshd")
    out, mode = routing.serve(kernel, query, key, value, causal=causal, scale=scale, layout="bhsd")
    return out.transpose(1, 2), mode
