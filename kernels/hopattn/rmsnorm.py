"""RMSNorm (Part II): ``rms_norm(x, weight=None, eps=1e-6, *, stage=None, return_rstd=False)`` and
the op ``torch.ops.hopattn.rms_norm``, through the stages of kernels/rmsnorm; its backward, the op
``torch.ops.hopattn.rms_norm_backward`` (``rms_norm_backward`` here), through the stages of
kernels/rmsnorm_backward.

    out = x · rstd · weight,   rstd = 1 / sqrt(mean(x², last axis) + eps)
    dx  = rstd · (g − x̂ · m),  dw = Σ_rows dy · x̂     (x̂ = x · rstd, g = weight · dy,
                                                      m = rstd · (Σ x · g + drstd) / cols)

in fp32, rounded once to x's dtype. Every input is checked here before a launch (``check``,
``check_backward``), for the Python functions and the ops alike: a bad input raises naming the
argument, what was expected and what to pass instead; nothing is silently copied, cast or clipped.
The ops are torch custom ops (``torch.library``) with fake implementations, so ``torch.compile``
(fullgraph) and CUDA graphs take them; the forward's autograd (``register_autograd``) runs the final
backward stage, so ``.backward()`` works and torch.compile traces the backward too. The gradient of
the rstd output (``return_rstd``) is honoured (drstd). dw is summed in a fixed order: the same bits
on every run.

The ops exist once this module is imported (``hopattn.rms_norm`` imports it on first use).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from functools import lru_cache

import torch

from . import build, rowwise, rowwise_backward, rowwise_build

DEFAULT_EPS = 1e-6  # Llama's, Liger's and QuACK's default (torch's F.rms_norm defaults to the dtype's eps)
DTYPE_CODES = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}  # RmsDtype in abi_rmsnorm.h
MAX_COLS = 2**31 - 1
_LOCK = threading.Lock()

# Read once at import: a plain dict keeps rms_norm traceable by torch.compile (no file access).
_STAGES: dict[int, rowwise.RowStage] = {s.number: s for s in rowwise.discover()}
_BACKWARD_STAGES: dict[int, rowwise.RowStage] = {s.number: s for s in rowwise_backward.discover()}


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


def backward_stages() -> list[rowwise.RowStage]:
    """The RMSNorm backward stages, in order."""
    return list(_BACKWARD_STAGES.values())


def final_backward_stage() -> int:
    return max(_BACKWARD_STAGES)


def _backward_stage(stage) -> rowwise.RowStage:
    if stage is None:
        return _BACKWARD_STAGES[final_backward_stage()]
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in _BACKWARD_STAGES:
        raise ValueError(f"stage: expected None (the final backward stage, {final_backward_stage():02d}) or one of "
                         f"{', '.join(str(n) for n in _BACKWARD_STAGES)}, got {stage!r}")
    return _BACKWARD_STAGES[stage]


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


@dataclass(frozen=True)
class BackwardCall:
    """A checked backward call: the rows of x and dy as the kernel reads them."""

    stage: rowwise.RowStage
    rows: int
    cols: int
    x_stride: int
    dy_stride: int
    weight_grad: bool


def check_backward(dy, x, weight, rstd, drstd, weight_grad, stage) -> BackwardCall:
    """Every rule of the backward's contract, before anything is launched: x and weight as the
    forward's, dy shaped and typed as x (its rows a single stride apart), rstd (and drstd, when
    given) fp32, shaped x.shape[:-1], contiguous."""
    s = _backward_stage(stage)
    fwd = check(x, weight, 0.0, None)
    if not isinstance(dy, torch.Tensor):
        raise TypeError(f"dy: expected a torch.Tensor, got {type(dy).__name__}")
    if dy.dtype != x.dtype:
        raise ValueError(f"dy: expected x's dtype {x.dtype}, got {dy.dtype}: pass dy.to({x.dtype})")
    if dy.device != x.device:
        raise ValueError(f"dy: expected a tensor on x's device {x.device}, got {dy.device}")
    if tuple(dy.shape) != tuple(x.shape):
        raise ValueError(f"dy: expected x's shape {tuple(x.shape)}, got {tuple(dy.shape)}")
    if fwd.rows > 0 and dy.stride(-1) != 1:
        raise ValueError(f"dy: the last axis must be contiguous (stride 1), got strides {dy.stride()}: "
                         f"pass dy.contiguous()")
    dy_stride = fwd.cols if fwd.rows == 0 else _row_stride(dy, fwd.cols)
    if dy_stride is None or (fwd.rows > 1 and dy_stride < fwd.cols):
        raise ValueError(f"dy: its rows, of shape {tuple(dy.shape)} and strides {dy.stride()}, are not a single stride "
                         f"of at least {fwd.cols} elements apart: pass dy.contiguous()")
    for name, t in (("rstd", rstd), ("drstd", drstd)):
        if t is None and name == "drstd":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor{' or None' if name == 'drstd' else ''}, "
                            f"got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise ValueError(f"{name}: expected torch.float32 (the forward's rstd), got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name}: expected a tensor on x's device {x.device}, got {t.device}")
        if tuple(t.shape) != tuple(x.shape[:-1]):
            raise ValueError(f"{name}: expected shape {tuple(x.shape[:-1])} (x's leading axes), got {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor: pass {name}.contiguous()")
    if not isinstance(weight_grad, bool):
        raise TypeError(f"weight_grad: expected a bool, got {type(weight_grad).__name__}")
    return BackwardCall(stage=s, rows=fwd.rows, cols=fwd.cols, x_stride=fwd.x_stride, dy_stride=dy_stride,
                        weight_grad=weight_grad and weight is not None)


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


@lru_cache(maxsize=None)
def _backward_library(number: int):
    with _LOCK:
        result = build.compile_stage(_BACKWARD_STAGES[number])
        return _native().RmsNormBackwardLibrary(str(result.library))


def stage_info(stage=None, cols: int = 4096, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Which kernel a stage runs for rows of ``cols`` elements of ``dtype`` (16-byte aligned,
    contiguous), and what it needs: threads, rows per CTA, cluster, registers, spills."""
    s = _stage(stage)
    return _library(s.number).describe(16, 0, 16, 1, cols, cols, cols, DTYPE_CODES[dtype])


def backward_stage_info(stage=None, cols: int = 4096, dtype: torch.dtype = torch.bfloat16, rows: int = 32768,
                        weight_grad: bool = True) -> dict:
    """Which kernels a backward stage runs for ``rows`` rows of ``cols`` elements of ``dtype``
    (16-byte aligned, contiguous, with a weight) on the current GPU, and what they need: threads,
    rows per CTA, cluster, the grid, the partial rows of dw, registers, spills."""
    s = _backward_stage(stage)
    device = torch.device("cuda", torch.cuda.current_device())
    args = _native().backward_args(16, 16, 16, 16, 0, 16, 16 if weight_grad else 0, 0, 0, rows, cols, cols, cols,
                                   cols, DTYPE_CODES[dtype], _device(device)[3])
    with torch.cuda.device(device):
        return _backward_library(s.number).describe(args)


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


# --- the backward ----------------------------------------------------------------------------------

def _new_grads(x: torch.Tensor, call: BackwardCall) -> tuple[torch.Tensor, torch.Tensor]:
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dw = torch.empty((call.cols,) if call.weight_grad else (0,), dtype=x.dtype, device=x.device)
    return dx, dw


def _backward_args(call: BackwardCall, dy, x, weight, rstd, drstd, dx, dw, workspace: int, workspace_bytes: int):
    return _native().backward_args(
        x.data_ptr(), 0 if weight is None else weight.data_ptr(), dy.data_ptr(), rstd.data_ptr(),
        0 if drstd is None else drstd.data_ptr(), dx.data_ptr(), dw.data_ptr() if call.weight_grad else 0,
        workspace, workspace_bytes, call.rows, call.cols, call.x_stride, call.dy_stride, call.cols,
        DTYPE_CODES[x.dtype], _device(x.device)[3])


def _run_backward(call: BackwardCall, dy, x, weight, rstd, drstd, dx, dw, workspace=None) -> None:
    """Launches the backward stage into dx (contiguous, x's shape) and dw (when call.weight_grad);
    the fp32 scratch the stage asks for is allocated here, or is ``workspace`` (the tests poison it)."""
    if call.rows == 0 and not call.weight_grad:
        return
    major, minor, name, _ = _device(x.device)
    if (major, minor) != (9, 0):
        raise RuntimeError(f"stage: the RMSNorm backward stages are compiled for sm_90a (Hopper, compute capability "
                           f"9.0); {name} is {major}.{minor}")
    lib = _backward_library(call.stage.number)
    with torch.cuda.device(x.device):
        need = lib.workspace(_backward_args(call, dy, x, weight, rstd, drstd, dx, dw, 0, 0))
        if workspace is None:
            workspace = torch.empty(max(1, (need + 3) // 4), dtype=torch.float32, device=x.device)
        elif workspace.dtype != torch.float32 or workspace.numel() * 4 < need:
            raise ValueError(f"workspace: expected float32 of at least {need} bytes, got {workspace.numel() * 4}")
        args = _backward_args(call, dy, x, weight, rstd, drstd, dx, dw, workspace.data_ptr(), workspace.numel() * 4)
        lib.launch(args, torch.cuda.current_stream(x.device).cuda_stream)


@torch.library.custom_op("hopattn::rms_norm_backward", mutates_args=())
def _rms_norm_backward_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor,
                          drstd: torch.Tensor | None = None, weight_grad: bool = True,
                          stage: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    call = check_backward(dy, x, weight, rstd, drstd, weight_grad, stage)
    dx, dw = _new_grads(x, call)
    _run_backward(call, dy, x, weight, rstd, drstd, dx, dw)
    return dx, dw


@_rms_norm_backward_op.register_fake
def _(dy, x, weight, rstd, drstd=None, weight_grad=True, stage=None):
    return _new_grads(x, check_backward(dy, x, weight, rstd, drstd, weight_grad, stage))


def rms_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor,
                      drstd: torch.Tensor | None = None, *, weight_grad: bool = True, stage: int | None = None):
    """(dx, dw) of rms_norm at x (and weight) for the gradient dy of its output, from the forward's
    rstd (and drstd, the gradient of rstd, when it reached the loss): dx shaped as x, contiguous; dw
    shaped as weight (None without a weight or with weight_grad False). stage: a stage of
    kernels/rmsnorm_backward (default: the final one)."""
    check_backward(dy, x, weight, rstd, drstd, weight_grad, stage)  # here too: the op's schema reads True as 1
    dx, dw = torch.ops.hopattn.rms_norm_backward(dy, x, weight, rstd, drstd, weight_grad, stage)
    return dx, (dw if weight is not None and weight_grad else None)


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """t itself when its rows are a single stride apart with the last axis contiguous (as the
    backward reads them); otherwise a contiguous copy (autograd may hand over expanded or
    transposed gradients)."""
    cols = t.shape[-1]
    rows = t.numel() // cols if cols else 0
    if rows == 0:
        return t
    stride = _row_stride(t, cols)
    if t.stride(-1) != 1 or stride is None or (rows > 1 and stride < cols):
        return t.contiguous()
    return t


def _setup(ctx, inputs, output) -> None:
    x, weight = inputs[0], inputs[1] if len(inputs) > 1 else None
    ctx.save_for_backward(x, weight, output[1])
    ctx.has_weight = weight is not None


def _backward(ctx, dout, drstd):
    x, weight, rstd = ctx.saved_tensors
    want_x, want_w = ctx.needs_input_grad[0], ctx.has_weight and ctx.needs_input_grad[1]
    dy = torch.zeros_like(x) if dout is None else _as_rows(dout)  # None: only rstd reached the loss
    dx, dw = torch.ops.hopattn.rms_norm_backward(dy, x, weight if ctx.has_weight else None, rstd,
                                                 None if drstd is None else drstd.contiguous(), bool(want_w), None)
    # One gradient per input of the op: x, weight, then none for eps and stage.
    return (dx if want_x else None), (dw if want_w else None), None, None


torch.library.register_autograd("hopattn::rms_norm", _backward, setup_context=_setup)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = DEFAULT_EPS, *,
             stage: int | None = None, return_rstd: bool = False):
    """x · rstd · weight over the last axis of x, rstd = 1 / sqrt(mean(x²) + eps), computed in fp32.

    x: bf16, fp16 or fp32 on a CUDA device (Hopper), any shape with a last axis of length >= 1 that
    is contiguous; the leading axes are the rows and may be a stride apart (a slice of a wider
    tensor), as long as they fold into one row stride. weight: None or x's dtype, shape
    (x.shape[-1],), contiguous. eps >= 0 (default 1e-6). stage: a stage of kernels/rmsnorm
    (default: the final one). Returns a new contiguous tensor shaped like x; with return_rstd,
    (out, rstd), rstd fp32 shaped x.shape[:-1]. Differentiable in x and weight (the final stage of
    kernels/rmsnorm_backward; through rstd too, when it reaches the loss).
    """
    if not isinstance(return_rstd, bool):
        raise TypeError(f"return_rstd: expected a bool, got {type(return_rstd).__name__}")
    check(x, weight, eps, stage)
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


def _rms_norm_backward_into(dy, x, weight, rstd, drstd, dx, dw, workspace, stage=None) -> None:
    """The backward's launch into given outputs and scratch (dx contiguous shaped as x; dw None, or
    weight's shape and dtype; workspace fp32 of at least backward_workspace_bytes): for the tests,
    which poison all three first so that an element never written, or a partial row never written
    and still summed, shows."""
    call = check_backward(dy, x, weight, rstd, drstd, dw is not None, stage)
    if dx.shape != x.shape or dx.dtype != x.dtype or not dx.is_contiguous():
        raise ValueError(f"dx: expected a contiguous {x.dtype} tensor of shape {tuple(x.shape)}")
    if dw is not None and (weight is None or dw.shape != weight.shape or dw.dtype != x.dtype):
        raise ValueError("dw: expected None, or weight's shape and dtype (with a weight)")
    _run_backward(call, dy, x, weight, rstd, drstd, dx, dw if dw is not None else dx, workspace)


def backward_workspace_bytes(dy, x, weight, rstd, drstd, dx, weight_grad=True, stage=None) -> int:
    """Bytes of fp32 scratch the backward stage asks for with these inputs and this dx (on x's device;
    what it asks depends on whether every row is 16-byte aligned, dx's included)."""
    call = check_backward(dy, x, weight, rstd, drstd, weight_grad, stage)
    with torch.cuda.device(x.device):
        return _backward_library(call.stage.number).workspace(
            _backward_args(call, dy, x, weight, rstd, drstd, dx, dx, 0, 0))
