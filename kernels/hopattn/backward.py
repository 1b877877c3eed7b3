"""The backward pass (Act V): ``attention_backward`` and the op ``torch.ops.hopattn.attention_backward``.

    dq, dk, dv = attention_backward(dout, q, k, v, out, lse, causal=..., scale=..., layout=...)

computes the gradients of ``out = attention(q, k, v)`` for the upstream gradient ``dout``, from the
forward's output and its log-sum-exp (``attention(..., return_lse=True)``). ``hopattn.api`` registers
it as the backward of its forward ops, so ``hopattn.attention`` is differentiable; this module is the
direct entry (the benchmark times it alone, and callers that keep out and lse themselves use it).

Every input is checked before a launch, through the same contract as the forward's: the forward's
rules for q, k and v (bf16, head dim 128, both layouts, strides in multiples of 8 elements, grouped
K/V heads), and for out, dout, lse and dlse their shapes and dtypes. ``dout`` and ``dlse`` arrive
from autograd in whatever strides the loss left them (an expanded tensor of ones, for a sum): ones
the kernel cannot read are copied, which changes no value.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import torch

from . import build, contract, lineage

_LOCK = threading.Lock()

# Read once at import, as the forward's stages are (no file access while torch.compile traces).
_STAGES: dict[int, lineage.Stage] = {s.number: s for s in lineage.discover(lineage.BACKWARD_DIR)}


def stages() -> list[lineage.Stage]:
    """The stages of the backward lineage, in order."""
    return list(_STAGES.values())


def final_stage() -> int:
    return max(_STAGES)


def _stage(stage) -> lineage.Stage:
    if stage is None:
        return _STAGES[final_stage()]
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in _STAGES:
        raise ValueError(f"backward_stage: expected {contract.stage_choices(_STAGES)}, got {stage!r}")
    return _STAGES[stage]


@lru_cache(maxsize=None)
def _library(number: int):
    from .api import _native

    with _LOCK:
        result = build.compile_stage(_STAGES[number])
        return _native().BackwardLibrary(str(result.library))


def stage_info(stage=None) -> dict:
    """What the main kernel of a backward stage needs: threads, shared memory, registers, tile."""
    return _library(_stage(stage).number).describe()


def _check(dout, q, k, v, out, lse, dlse, causal, scale, layout, deterministic, stage) -> contract.Call:
    s = _stage(stage)
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic: expected a bool, got {type(deterministic).__name__}")
    if deterministic and not s.deterministic:
        raise ValueError(f"deterministic: backward stage {s.id} has no deterministic mode")
    call = contract.check_call(q, k, v, causal=causal, scale=scale, stage=s, layout=layout)
    for name, t in (("out", out), ("dout", dout)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.bfloat16 or t.shape != q.shape or t.device != q.device:
            raise ValueError(f"{name}: expected a torch.bfloat16 tensor of q's shape {tuple(q.shape)} on {q.device}, "
                             f"got {t.dtype} {tuple(t.shape)} on {t.device}")
    if out.stride(3) != 1 or not _strides_ok(out):
        raise ValueError(f"out: expected the forward's output, head-dim axis contiguous and the other strides "
                         f"multiples of 8 elements, got strides {out.stride()}: pass out.contiguous()")
    rows = (call.batch, call.heads, call.len_q)
    for name, t in (("lse", lse), ("dlse", dlse)):
        if t is None and name == "dlse":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32 or tuple(t.shape) != rows or t.device != q.device:
            raise ValueError(f"{name}: expected a torch.float32 tensor of shape {rows} (batch, heads, len_q) on "
                             f"{q.device}, as attention(..., return_lse=True) returns, got {t.dtype} "
                             f"{tuple(t.shape)} on {t.device}")
    if not lse.is_contiguous():
        raise ValueError(f"lse: expected a contiguous tensor, got strides {lse.stride()}: pass lse.contiguous()")
    return call


def _strides_ok(t: torch.Tensor) -> bool:
    return all(t.shape[a] <= 1 or (t.stride(a) > 0 and t.stride(a) % 8 == 0) for a in range(3))


def _readable(t: torch.Tensor) -> torch.Tensor:
    """t as the kernel can read it: itself, or a contiguous copy (same values, same layout)."""
    if t.stride(3) == 1 and _strides_ok(t) and t.data_ptr() % contract.ALIGN_BYTES == 0:
        return t
    return t.contiguous()


def _new_grads(q, k, v):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _run(call: contract.Call, dout, q, k, v, out, lse, dlse, deterministic: bool, grads=None):
    dq, dk, dv = _new_grads(q, k, v) if grads is None else grads
    if call.batch == 0 or call.heads == 0:
        return dq, dk, dv
    if call.len_q == 0 or call.len_k == 0:  # no score at all: every gradient is 0
        return dq.zero_(), dk.zero_(), dv.zero_()
    dout = _readable(dout)
    dlse = None if dlse is None else dlse.contiguous()
    contract.check_memory(call, q, k, v, dq)
    for name, t in (("out", out), ("lse", lse)):
        if t.data_ptr() % contract.ALIGN_BYTES:
            raise ValueError(f"{name}: expected a 16-byte aligned data pointer: pass {name}.clone()")
    from .api import _check_device_supports, _sm_count

    s = call.stage
    _check_device_supports(s, q.device)
    lib = _library(s.number)
    stats_n, accum_n = lib.workspace(call.batch, call.heads, call.kv_heads, call.len_q, deterministic)
    row_stats = torch.empty(stats_n, dtype=torch.float32, device=q.device)
    dq_accum = torch.empty(accum_n, dtype=torch.float32, device=q.device) if accum_n else None
    tensors = (q, k, v, out, dout, dq, dk, dv)
    with torch.cuda.device(q.device):
        lib.launch([t.data_ptr() for t in tensors], [call.strides(t) for t in tensors], lse.data_ptr(),
                   0 if dlse is None else dlse.data_ptr(), row_stats.data_ptr(),
                   0 if dq_accum is None else dq_accum.data_ptr(), call.batch, call.heads, call.kv_heads,
                   call.len_q, call.len_k, contract.HEAD_DIM, call.scale, call.causal, deterministic,
                   _sm_count(q.device), torch.cuda.current_stream(q.device).cuda_stream)
    return dq, dk, dv


@torch.library.custom_op("hopattn::attention_backward", mutates_args=())
def _backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, dlse: torch.Tensor | None = None, causal: bool = False,
                 scale: float | None = None, layout: str = "bhsd", deterministic: bool = False,
                 stage: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    call = _check(dout, q, k, v, out, lse, dlse, causal, scale, layout, deterministic, stage)
    return _run(call, dout, q, k, v, out, lse, dlse, deterministic)


@_backward_op.register_fake
def _(dout, q, k, v, out, lse, dlse=None, causal=False, scale=None, layout="bhsd", deterministic=False, stage=None):
    _check(dout, q, k, v, out, lse, dlse, causal, scale, layout, deterministic, stage)
    return _new_grads(q, k, v)


def attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, *, dlse: torch.Tensor | None = None, causal: bool = False,
                       scale: float | None = None, layout: str = "bhsd", deterministic: bool = False,
                       stage: int | None = None):
    """(dq, dk, dv) of out = attention(q, k, v, causal=causal, scale=scale, layout=layout) for the
    upstream gradient dout, from the forward's out and lse (fp32 [B, H_q, Lq]); ``dlse``: the
    gradient with respect to lse, when the loss used it. Shapes as q, k and v (contiguous, in the
    layout's order). ``deterministic=True``: gradients identical bit for bit run to run (no
    atomics). ``stage``: a stage of the backward lineage (default: its final one)."""
    _stage(stage)
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    if not isinstance(layout, str):
        raise TypeError(f"layout: expected 'bhsd' or 'bshd', got {type(layout).__name__}")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic: expected a bool, got {type(deterministic).__name__}")
    contract.check_scale(scale)
    return torch.ops.hopattn.attention_backward(dout, q, k, v, out, lse, dlse, causal, scale, layout,
                                                deterministic, stage)


def _backward_into(grads, dout, q, k, v, out, lse, *, dlse=None, causal=False, scale=None, layout="bhsd",
                   deterministic=False, stage=None):
    """The op's launch into given (dq, dk, dv), contiguous and shaped as q, k and v: for the tests,
    which poison them first, so an element the kernels never wrote shows."""
    call = _check(dout, q, k, v, out, lse, dlse, causal, scale, layout, deterministic, stage)
    for name, g, t in zip(("dq", "dk", "dv"), grads, (q, k, v)):
        if g.shape != t.shape or not g.is_contiguous() or g.dtype != torch.bfloat16:
            raise ValueError(f"{name}: expected a contiguous bf16 tensor of shape {tuple(t.shape)}")
    return _run(call, dout, q, k, v, out, lse, dlse, deterministic, grads)
