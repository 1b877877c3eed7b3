"""The attention kernels the integrations route to, described by what they can serve.

A ``Kernel`` pairs a call of one contract — ``call(q, k, v, *, causal, scale, layout,
deterministic) -> out`` with q, k, v in ``layout`` ("bhsd" = [B, H, L, D], "bshd" = [B, L, H, D]),
causal bottom-right aligned, a query row that sees no key giving 0 — with the limits the routing
checks before calling it. The hopattn kernel is the one users get; the benchmark builds others
(FlashAttention-3/-4) of the same shape, and the tests a float64 reference, so every kernel goes
through the same glue.

Head dims: ``head_dims`` lists the (q and k head dim, v head dim) pairs a kernel serves — for hopattn
its stage's ``supports.head_dims`` (stage 24: 64, 96, 128, 256, and q/k 192 with v 128, DeepSeek's
MLA prefill); an int d stands for (d, d). The output has v's head dim; the default scale is
1/sqrt(q's head dim). ``backward_head_dims``: the pairs its backward serves (hopattn: the backward
lineage's stage, 128 today); a call that needs a gradient at another head dim goes elsewhere, with
the reason "gradient needed at head dim N (the backward serves ...)", so its gradient is never lost.

Training: a kernel with ``backward=True`` is differentiable in q, k and v (autograd reaches its
backward through the tensors ``call`` returns), so calls that need a gradient are served; one
without a backward is sent such calls' way elsewhere (``unsupported(..., grad=True)`` says why).
``deterministic=True`` asks for gradients identical bit for bit run to run; a call that needs a
gradient asks it only of a kernel with ``deterministic=True`` (a backward without atomics). It
changes nothing in a forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch


def _pairs(dims) -> tuple[tuple[int, int], ...]:
    """Head dims as (q and k, v) pairs: an int d is (d, d)."""
    return tuple((d, d) if isinstance(d, int) else (int(d[0]), int(d[1])) for d in dims)


def head_dims_text(pairs) -> str:
    """The pairs for messages, as hopattn's own errors name them (lineage.Stage.head_dims_text):
    '128', or '64, 96, 128, 192 (v 128) and 256'."""
    parts = [f"{d}" if d == dv else f"{d} (v {dv})" for d, dv in pairs]
    if not parts:
        return "none"
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


def _dims_of(d: int, dv: int) -> str:
    return f"head dim {d}" if d == dv else f"head dims q/k {d}, v {dv}"


@dataclass(frozen=True)
class Kernel:
    name: str
    call: Callable = field(repr=False)
    # (q and k head dim, v head dim) pairs served; an int d stands for (d, d) (normalised on construction)
    head_dims: tuple[tuple[int, int], ...] = ((128, 128),)
    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,)
    devices: tuple[str, ...] = ("cuda",)
    gqa: bool = False  # reads k/v with fewer heads than q (Hq a multiple of Hkv) without copies
    causal: bool = True
    layouts: tuple[str, ...] = ("bhsd", "bshd")
    strided: bool = True  # reads any strides with a contiguous head dim
    bshd_packed_heads: bool = True  # "bshd" also needs the heads of a row packed (stride(2) == head dim)
    label: str = ""
    backward: bool = False  # differentiable in q, k, v: calls that need a gradient are served
    deterministic: bool = False  # has a backward whose gradients are identical bit for bit run to run
    # the pairs its backward serves (None: all of head_dims); a call that needs a gradient at another goes elsewhere
    backward_head_dims: tuple[tuple[int, int], ...] | None = None

    def __post_init__(self):
        object.__setattr__(self, "head_dims", _pairs(self.head_dims))
        if self.backward_head_dims is not None:
            object.__setattr__(self, "backward_head_dims", _pairs(self.backward_head_dims))

    @property
    def trained_head_dims(self) -> tuple[tuple[int, int], ...]:
        """The pairs a call that needs a gradient is served at: none without a backward."""
        if not self.backward:
            return ()
        return self.head_dims if self.backward_head_dims is None else self.backward_head_dims

    def unsupported(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, grad: bool = False,
                    deterministic: bool = False) -> str | None:
        """Why this kernel cannot take these tensors (logical BHSD shapes), or None when it can;
        ``grad``: the call needs a gradient, ``deterministic``: a bitwise reproducible one."""
        if q.device.type not in self.devices:
            return f"device {q.device.type} ({self.name} runs on {'/'.join(self.devices)})"
        for t in (q, k, v):
            if t.dtype not in self.dtypes:
                wanted = "/".join(str(d).removeprefix("torch.") for d in self.dtypes)
                return f"dtype {str(t.dtype).removeprefix('torch.')} ({self.name} serves {wanted})"
        dim, dim_k, dim_v = q.shape[-1], k.shape[-1], v.shape[-1]
        if dim != dim_k:
            return f"head dims of q and k differ (q {dim}, k {dim_k})"
        if (dim, dim_v) not in self.head_dims:
            return f"{_dims_of(dim, dim_v)} ({self.name} serves {head_dims_text(self.head_dims)})"
        hq, hkv = q.shape[1], k.shape[1]
        if hkv == 0 or hq % hkv:
            return f"{hq} query heads are not a multiple of {hkv} key/value heads"
        if causal and not self.causal:
            return f"causal mask ({self.name} is non-causal only)"
        if grad and not self.backward:
            return f"gradient needed ({self.label or self.name} has no backward)"
        if grad and (dim, dim_v) not in self.trained_head_dims:
            return (f"gradient needed at {_dims_of(dim, dim_v)} (the backward serves "
                    f"{head_dims_text(self.trained_head_dims)})")
        if grad and deterministic and not self.deterministic:
            return f"deterministic algorithms requested ({self.label or self.name} has no deterministic backward)"
        return None

    def accepts(self, t: torch.Tensor, layout: str) -> bool:
        """Whether ``t`` (in ``layout``) can be read in place, without a copy."""
        if layout not in self.layouts or t.stride(-1) != 1:
            return False
        if not self.strided:
            return t.is_contiguous()
        return layout == "bhsd" or not self.bshd_packed_heads or t.stride(2) == t.shape[3]


def hopattn_kernel(stage: int | None = None, backward_stage: int | None = None) -> Kernel:
    """The hopattn kernel of ``stage`` (default: the final stage), with that stage's limits; its
    gradients come from ``backward_stage`` of the backward lineage (default: its final stage).

    It has a backward when the forward stage keeps the log-sum-exp the backward recomputes P from
    (stages with ``lse``, 20 on) and the backward stage reads what the forward stage does (layouts,
    grouped K/V heads; the routing checks the forward's limits only).

    Head dims: the forward stage's ``supports.head_dims`` pairs. A gradient is served only at the
    pairs the backward stage accepts: its own head dims (``Stage.head_dims``: its stage.toml's
    ``supports.head_dims``, else its ``tile.head_dim`` — what hopattn.backward's contract checks q, k
    and v against) with v's head dim equal to q's (it takes out and dout of q's shape)."""
    from hopattn import api
    from hopattn import backward as bwd

    spec = api._stage(stage)  # validates `stage`, names it in the error
    back = bwd._stage(backward_stage)  # and `backward_stage`
    number, back_number = spec.number, back.number
    trains = (spec.lse and back.causal >= spec.causal and back.gqa >= spec.gqa and back.tails >= spec.tails
              and set(spec.layouts) <= set(back.layouts))
    trained_dims = tuple(p for p in back.head_dims if p[0] == p[1] and p in spec.head_dims) if trains else ()

    def call(q, k, v, *, causal, scale, layout, deterministic=False):
        # looked up at call time, so tests can stand a CPU reference in for the CUDA kernel
        return api.attention(q, k, v, causal=causal, scale=scale, stage=number, layout=layout,
                             deterministic=deterministic, backward_stage=back_number)

    return Kernel(name="hopattn", label=f"hopattn stage {spec.id}", call=call, head_dims=spec.head_dims,
                  gqa=spec.gqa, causal=spec.causal, layouts=tuple(spec.layouts), strided=spec.strided,
                  bshd_packed_heads=not spec.strided,  # the strided stages read any head stride too
                  backward=trains, deterministic=trains and back.deterministic,
                  backward_head_dims=trained_dims)


def reference_attention(q, k, v, *, causal=False, scale=None, layout="bhsd", gqa=True):
    """The kernel contract computed in float64: bottom-right causal, GQA, rows with no key give 0.

    Checks its inputs as the kernels do (a glue bug that sends a kernel what it cannot read fails
    here, on CPU, instead of on the GPU). v may have another head dim than q and k (MLA's 192/128):
    the output has v's; the default scale is 1/sqrt(q's). Returns a contiguous tensor in ``layout``
    and q's dtype.
    Differentiable in q, k and v through torch's own operations.
    """
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout: expected 'bhsd' or 'bshd', got {layout!r}")
    if layout == "bshd":  # any strides with a contiguous head dim, as the strided stages read them
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4 or t.stride(-1) != 1:
            raise ValueError(f"{name}: expected a 4-d tensor with a contiguous head dim, got {tuple(t.shape)}")
    batch, hq, len_q, dim = q.shape
    hkv, len_k = k.shape[1], k.shape[2]
    if k.shape[:3] != v.shape[:3] or k.shape[0] != batch or k.shape[3] != dim:
        raise ValueError(f"k, v: expected the same batch ({batch}), heads and length, and k of q's head dim ({dim}); "
                         f"got {tuple(k.shape)} and {tuple(v.shape)}")
    if hkv != hq and (not gqa or hq % hkv):
        raise ValueError(f"k: expected {hq} heads{' (or a divisor)' if gqa else ''}, got {hkv}")
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    qf, kf, vf = (t.to(torch.float64) for t in (q, k, v))
    if hkv != hq:
        kf, vf = (t.repeat_interleave(hq // hkv, dim=1) for t in (kf, vf))
    scores = (qf @ kf.transpose(-1, -2)) * scale
    if causal:
        rows = torch.arange(len_q, device=q.device)[:, None]
        cols = torch.arange(len_k, device=q.device)[None, :]
        scores = scores.masked_fill(cols > rows + (len_k - len_q), float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row of -inf only: no key seen -> 0
    out = (probs @ vf).to(q.dtype)
    return (out.transpose(1, 2) if layout == "bshd" else out).contiguous()


def reference_kernel(gqa: bool = True, devices: tuple[str, ...] = ("cpu", "cuda"), head_dims=((128, 128),),
                     backward_head_dims=None) -> Kernel:
    """hopattn's limits (bf16; head dims ``head_dims``, default 128, its gradient at
    ``backward_head_dims``, default all of them) with the float64 reference as its call
    (differentiable at every head dim)."""

    def call(q, k, v, *, causal, scale, layout, deterministic=False):  # torch's CPU ops: no atomics to avoid
        return reference_attention(q, k, v, causal=causal, scale=scale, layout=layout, gqa=gqa)

    return Kernel(name="reference", label="float64 reference", call=call, gqa=gqa, devices=devices, backward=True,
                  deterministic=True, head_dims=head_dims, backward_head_dims=backward_head_dims)
