"""RMSNorm (Part II): ``rms_norm(x, weight=None, eps=1e-6, *, stage=None, return_rstd=False)`` and
the op ``torch.ops.hopattn.rms_norm``, through the stages of kernels/rmsnorm.

    out = x · rstd · weight,   rstd = 1 / sqrt(mean(x², last axis) + eps)

in fp32, rounded once to x's dtype. Every input is checked here before a launch (``check``), for
the Python function and the op alike: a bad input raises naming the argument, what was expected
and what to pass instead; nothing is silently copied, cast or clipped. The op is a torch custom op
(``torch.library``) with a fake implementation, so ``torch.compile`` (fullgraph) and CUDA graphs
take it. There is no backward yet: a call that would need a gradient raises, saying so.

The op exists once this module is imported (``hopattn.rms_norm`` imports it on first use).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from functools import lru_cache

import torch

from . import build, rowwise, rowwise_build

DEFAULT_EPS = 1e-6  # Llama's, Liger's and QuACK's default (torch's F.rms_norm defaults to the dtype's eps)
DTYPE_CODES = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}  # RmsDtype in abi_rmsnorm.h
MAX_COLS = 2**31 - 1
_LOCK = threading.Lock()

# Read once at import: a plain dict keeps rms_norm traceable by torch.compile (no file access).
_STAGES: dict[int, rowwise.RowStage] = {s.number: s for s in rowwise.discover()}


def stages() -> list[rowwise.RowStage]:
    """The RMSNorm stages, in order."""
    return list(_STAGES.values())


def final_stage() -> int:
    return max(_STAGES)


def _stage(stage) -> rowwise.RowStage:
    if stage is None:
        return _STAGES[final_stage()]
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in _STAGES:
        raise ValueError(f"stage: expected None (the final stage, {final_stage():02d}) or one of "
                         f"{', '.join(str(n) for n in _STAGES)}, got {stage!r}")
    return _STAGES[stage]


@dataclass(frozen=True)
class Call:
    """A checked call: the rows as the kernel reads them."""

    stage: rowwise.RowStage
    rows: int
    cols: int
    x_stride: int  # elements between rows of x (the leading axes folded into one)
    eps: float


def _row_stride(x: torch.Tensor, cols: int) -> int | None:
    """The one stride, in elements, that steps through x's rows with its leading axes folded
    together; None when the leading axes cannot fold (a view that needs a copy to become rows)."""
    lead = [(n, s) for n, s in zip(x.shape[:-1], x.stride()[:-1]) if n != 1]
    if not lead:
        return cols
    for (_, outer), (n_inner, inner) in zip(lead, lead[1:]):
        if outer != inner * n_inner:
            return None
    return lead[-1][1]


def check(x, weight, eps, stage) -> Call:
    """Every rule of the contract, before anything is launched (ValueError / TypeError naming the
    argument)."""
    s = _stage(stage)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPE_CODES:
        raise ValueError(f"x: expected torch.bfloat16, torch.float16 or torch.float32, got {x.dtype}")
    if x.device.type != "cuda":
        raise ValueError(f"x: expected a CUDA tensor, got one on {x.device}: pass x.cuda()")
    if x.dim() < 1:
        raise ValueError("x: expected at least one axis (the one normalized, the last), got a 0-d tensor")
    cols = x.shape[-1]
    if cols == 0:
        raise ValueError(f"x: the last axis is empty (shape {tuple(x.shape)}): the mean of no squares is undefined")
    if cols > MAX_COLS:
        raise ValueError(f"x: rows of at most {MAX_COLS} elements, got {cols}")
    rows = x.numel() // cols
    if x.stride(-1) != 1 and rows > 0:
        raise ValueError(f"x: the last axis must be contiguous (stride 1), got strides {x.stride()}: "
                         f"pass x.contiguous()")
    x_stride = _row_stride(x, cols)
    if x_stride is None:
        raise ValueError(f"x: the leading axes of shape {tuple(x.shape)} and strides {x.stride()} do not fold into "
                         f"rows a single stride apart: pass x.contiguous() (or x.reshape(-1, {cols}))")
    if rows > 1 and x_stride < cols:
        raise ValueError(f"x: rows overlap (a row stride of {x_stride} elements for rows of {cols}): pass x.contiguous()")
    if weight is not None:
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"weight: expected a torch.Tensor or None, got {type(weight).__name__}")
        if weight.dtype != x.dtype:
            raise ValueError(f"weight: expected x's dtype {x.dtype}, got {weight.dtype}: pass weight.to({x.dtype})")
        if weight.device != x.device:
            raise ValueError(f"weight: expected a tensor on x's device {x.device}, got {weight.device}")
        if tuple(weight.shape) != (cols,):
            raise ValueError(f"weight: expected shape ({cols},) (x's last axis), got {tuple(weight.shape)}")
        if weight.stride(0) != 1 and cols > 1:
            raise ValueError(f"weight: expected a contiguous tensor, got stride {weight.stride(0)}: "
                             f"pass weight.contiguous()")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps: expected a float, got {type(eps).__name__}")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps: expected a finite number >= 0, got {eps!r}")
    return Call(stage=s, rows=rows, cols=cols, x_stride=x_stride, eps=float(eps))


@lru_cache(maxsize=1)
def _native():
    import importlib.machinery
    import importlib.util

    path = rowwise_build.build_native()
    loader = importlib.machinery.ExtensionFileLoader("hopattn._rowwise_native", str(path))
    spec = importlib.util.spec_from_file_location("hopattn._rowwise_native", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@lru_cache(maxsize=None)
def _library(number: int):
    with _LOCK:  # one nvcc per stage even when several threads ask at once
        result = build.compile_stage(_STAGES[number])
        return _native().RmsNormLibrary(str(result.library))


@lru_cache(maxsize=None)
def _device(device: torch.device) -> tuple[int, int, str, int]:
    props = torch.cuda.get_device_properties(device)
    return props.major, props.minor, props.name, props.multi_processor_count


def stage_info(stage=None, cols: int = 4096, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Which kernel a stage runs for rows of ``cols`` elements of ``dtype`` (16-byte aligned,
    contiguous), and what it needs: threads, rows per CTA, cluster, registers, spills."""
    s = _stage(stage)
    return _library(s.number).describe(16, 0, 16, 1, cols, cols, cols, DTYPE_CODES[dtype])


def _new_outputs(x: torch.Tensor, call: Call) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    return out, rstd


def _run(call: Call, x: torch.Tensor, weight, out: torch.Tensor, rstd: torch.Tensor) -> None:
    if call.rows == 0:
        return
    major, minor, name, sms = _device(x.device)
    if (major, minor) != (9, 0):
        raise RuntimeError(f"stage: the RMSNorm stages are compiled for sm_90a (Hopper, compute capability 9.0); "
                           f"{name} is {major}.{minor}")
    lib = _library(call.stage.number)
    with torch.cuda.device(x.device):
        lib.launch(x.data_ptr(), 0 if weight is None else weight.data_ptr(), out.data_ptr(), rstd.data_ptr(),
                   call.rows, call.cols, call.x_stride, call.cols, call.eps, DTYPE_CODES[x.dtype], sms,
                   torch.cuda.current_stream(x.device).cuda_stream)


@torch.library.custom_op("hopattn::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = DEFAULT_EPS,
                 stage: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    call = check(x, weight, eps, stage)
    out, rstd = _new_outputs(x, call)
    _run(call, x, weight, out, rstd)
    return out, rstd


@_rms_norm_op.register_fake
def _(x, weight=None, eps=DEFAULT_EPS, stage=None):
    return _new_outputs(x, check(x, weight, eps, stage))


def _no_backward(ctx, dout, drstd):
    raise RuntimeError("hopattn.rms_norm has no backward yet (Part II's RMSNorm backward is still to come): "
                       "use torch.nn.functional.rms_norm where a gradient is needed")


def _setup(ctx, inputs, output) -> None:
    pass


torch.library.register_autograd("hopattn::rms_norm", _no_backward, setup_context=_setup)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = DEFAULT_EPS, *,
             stage: int | None = None, return_rstd: bool = False):
    """x · rstd · weight over the last axis of x, rstd = 1 / sqrt(mean(x²) + eps), computed in fp32.

    x: bf16, fp16 or fp32 on a CUDA device (Hopper), any shape with a last axis of length >= 1 that
    is contiguous; the leading axes are the rows and may be a stride apart (a slice of a wider
    tensor), as long as they fold into one row stride. weight: None or x's dtype, shape
    (x.shape[-1],), contiguous. eps >= 0 (default 1e-6). stage: a stage of kernels/rmsnorm
    (default: the final one). Returns a new contiguous tensor shaped like x; with return_rstd,
    (out, rstd), rstd fp32 shaped x.shape[:-1]. Not differentiable yet: raises if a gradient would
    be needed.
    """
    if not isinstance(return_rstd, bool):
        raise TypeError(f"return_rstd: expected a bool, got {type(return_rstd).__name__}")
    check(x, weight, eps, stage)
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (x, weight)):
        _no_backward(None, None, None)
    out, rstd = torch.ops.hopattn.rms_norm(x, weight, eps, stage)
    return (out, rstd) if return_rstd else out


def _rms_norm_into(x, weight, eps, out, rstd, stage=None) -> None:
    """The launch into given outputs (contiguous, shaped as rms_norm's): for the tests, which poison
    them first so that an element the kernel never wrote shows."""
    call = check(x, weight, eps, stage)
    if out.shape != x.shape or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"out: expected a contiguous {x.dtype} tensor of shape {tuple(x.shape)}")
    if tuple(rstd.shape) != tuple(x.shape[:-1]) or rstd.dtype != torch.float32 or not rstd.is_contiguous():
        raise ValueError(f"rstd: expected a contiguous float32 tensor of shape {tuple(x.shape[:-1])}")
    _run(call, x, weight, out, rstd)
