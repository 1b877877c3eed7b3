"""The attention kernels the model benchmark routes to besides hopattn, as integration Kernels:
FlashAttention-3 and -4 (BSHD, GQA natively), and SDPA itself under the kernel contract (for
capturing a step's calls without running hopattn, and for replaying the calls hopattn sends to SDPA).

A peer that cannot be imported is reported missing, with the reason, never estimated. The peers are
described without a backward (the FlashAttention-3 build on the GPU machine is inference-only):
the training workloads compare hopattn with SDPA only.
"""

from __future__ import annotations

import torch
from hopattn.integrations.kernels import Kernel

FA_HINT = "see shared/tools/peers-on-gpu-machine.md for getting it onto the GPU machine"


def _why(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:200] if lines else ''}".rstrip(": ")


def _first(result):
    return result[0] if isinstance(result, (tuple, list)) else result  # (out, lse) or out


def fa3_kernel() -> tuple[Kernel | None, str | None]:
    try:
        from flash_attn_interface import flash_attn_func
    except Exception as err:  # ImportError, or a broken build raising anything while importing
        return None, f"flash_attn_interface is not importable ({_why(err)}); {FA_HINT}"

    def call(q, k, v, *, causal, scale, layout, deterministic=False):
        return _first(flash_attn_func(q, k, v, softmax_scale=scale, causal=causal))

    return Kernel(name="fa3", label="FlashAttention-3", call=call, head_dims=(64, 96, 128, 192, 256),
                  dtypes=(torch.bfloat16, torch.float16), gqa=True, layouts=("bshd",), strided=True,
                  bshd_packed_heads=False), None


def fa4_kernel() -> tuple[Kernel | None, str | None]:
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as err:
        return None, f"flash_attn.cute is not importable ({_why(err)}); {FA_HINT}"

    def call(q, k, v, *, causal, scale, layout, deterministic=False):
        return _first(flash_attn_func(q, k, v, softmax_scale=scale, causal=causal))

    # contiguous BSHD only: the strides FA4 is known to take (other inputs are copied, and counted)
    return Kernel(name="fa4", label="FlashAttention-4", call=call, head_dims=(64, 96, 128),
                  dtypes=(torch.bfloat16, torch.float16), gqa=True, layouts=("bshd",), strided=False), None


def sdpa_contract(q, k, v, *, causal, scale, layout, deterministic=False):
    """torch SDPA computing the kernel contract (bottom-right causal, GQA); differentiable."""
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    len_q, len_k = q.shape[2], k.shape[2]
    mask = None
    if causal and len_q != len_k:  # SDPA's is_causal is top-left: say bottom-right with a mask
        rows = torch.arange(len_q, device=q.device)[:, None]
        mask = torch.arange(len_k, device=q.device)[None, :] <= rows + (len_k - len_q)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal and mask is None, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    return out.transpose(1, 2) if layout == "bshd" else out


def as_capture(kernel: Kernel, device_type: str) -> Kernel:
    """``kernel``'s limits (so a capture says which calls it would serve, with a gradient too) with
    SDPA doing the work."""
    from dataclasses import replace

    return replace(kernel, call=sdpa_contract, devices=tuple({*kernel.devices, device_type}))
