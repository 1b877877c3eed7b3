"""Softmax (Part II): ``softmax(x, *, stage=None)`` (also ``hopattn.softmax``) over the last axis and the op
``torch.ops.hopattn.softmax``, through the stages of kernels/softmax; its backward, the op
``torch.ops.hopattn.softmax_backward`` (``softmax_backward`` here), through the stages of
kernels/softmax_backward.

    y  = exp(x − max) / Σ exp(x − max)          (a row of −inf gives NaN, as torch.softmax does)
    dx = y · (dy − Σ y · dy)

in fp32, rounded once to x's dtype. Every input is checked here before a launch (``check``,
``check_backward``), for the Python functions and the ops alike: a bad input raises naming the
argument, what was expected and what to pass instead; nothing is silently copied, cast or clipped.
The ops are torch custom ops (``torch.library``) with fake implementations, so ``torch.compile``
(fullgraph) and CUDA graphs take them; the forward's autograd (``register_autograd``) saves y and runs
the final backward stage, so ``.backward()`` works and torch.compile traces the backward too.

The ops exist once this module is imported.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache

import torch

from . import build, rowwise, softmax_lineage
from .rmsnorm import DTYPE_CODES, MAX_COLS, _as_rows, _device, _native, _row_stride

_LOCK = threading.Lock()

# Read once at import: plain dicts keep softmax traceable by torch.compile (no file access).
_STAGES: dict[int, rowwise.RowStage] = {s.number: s for s in softmax_lineage.discover()}
_BACKWARD_STAGES: dict[int, rowwise.RowStage] = {s.number: s for s in softmax_lineage.discover_backward()}


def stages() -> list[rowwise.RowStage]:
    return list(_STAGES.values())


def backward_stages() -> list[rowwise.RowStage]:
    return list(_BACKWARD_STAGES.values())


def final_stage() -> int:
    return max(_STAGES)


def final_backward_stage() -> int:
    return max(_BACKWARD_STAGES)


def _pick(table: dict, stage, what: str) -> rowwise.RowStage:
    if stage is None:
        return table[max(table)]
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in table:
        raise ValueError(f"stage: expected None (the final {what}stage, {max(table):02d}) or one of "
                         f"{', '.join(str(n) for n in table)}, got {stage!r}")
    return table[stage]


@dataclass(frozen=True)
class Call:
    """A checked call: the rows as the kernel reads them (dy's too, for the backward)."""

    stage: rowwise.RowStage
    rows: int
    cols: int
    x_stride: int   # the forward's x, the backward's y
    dy_stride: int  # the backward's dy (the forward: x_stride)


def _rows_of(name: str, t, like=None) -> tuple[int, int, int]:
    """(rows, cols, row stride) of a tensor whose last axis is the one reduced, or the error naming it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if like is not None:
        if t.dtype != like.dtype:
            raise ValueError(f"{name}: expected y's dtype {like.dtype}, got {t.dtype}: pass {name}.to({like.dtype})")
        if t.device != like.device:
            raise ValueError(f"{name}: expected a tensor on y's device {like.device}, got {t.device}")
        if tuple(t.shape) != tuple(like.shape):
            raise ValueError(f"{name}: expected y's shape {tuple(like.shape)}, got {tuple(t.shape)}")
    if t.dtype not in DTYPE_CODES:
        raise ValueError(f"{name}: expected torch.bfloat16, torch.float16 or torch.float32, got {t.dtype}")
    if t.device.type != "cuda":
        raise ValueError(f"{name}: expected a CUDA tensor, got one on {t.device}: pass {name}.cuda()")
    if t.dim() < 1:
        raise ValueError(f"{name}: expected at least one axis (the one reduced, the last), got a 0-d tensor")
    cols = t.shape[-1]
    if cols == 0:
        raise ValueError(f"{name}: the last axis is empty (shape {tuple(t.shape)}): a softmax of no elements")
    if cols > MAX_COLS:
        raise ValueError(f"{name}: rows of at most {MAX_COLS} elements, got {cols}")
    rows = t.numel() // cols
    if rows == 0:
        return 0, cols, cols
    if t.stride(-1) != 1:
        raise ValueError(f"{name}: the last axis must be contiguous (stride 1), got strides {t.stride()}: "
                         f"pass {name}.contiguous()")
    stride = _row_stride(t, cols)
    if stride is None:
        raise ValueError(f"{name}: the leading axes of shape {tuple(t.shape)} and strides {t.stride()} do not fold "
                         f"into rows a single stride apart: pass {name}.contiguous()")
    if rows > 1 and stride < cols:
        raise ValueError(f"{name}: rows overlap (a row stride of {stride} elements for rows of {cols}): "
                         f"pass {name}.contiguous()")
    return rows, cols, stride


def check(x, stage) -> Call:
    s = _pick(_STAGES, stage, "")
    rows, cols, stride = _rows_of("x", x)
    return Call(s, rows, cols, stride, stride)


def check_backward(dy, y, stage) -> Call:
    s = _pick(_BACKWARD_STAGES, stage, "backward ")
    rows, cols, y_stride = _rows_of("y", y)
    _, _, dy_stride = _rows_of("dy", dy, like=y)
    return Call(s, rows, cols, y_stride, dy_stride)


@lru_cache(maxsize=None)
def _library(lineage: str, number: int):
    table = _BACKWARD_STAGES if lineage == "softmax_backward" else _STAGES
    with _LOCK:
        result = build.compile_stage(table[number])
        return _native().SoftmaxLibrary(str(result.library), lineage == "softmax_backward")


def _on_hopper(t: torch.Tensor) -> None:
    major, minor, name, _ = _device(t.device)
    if (major, minor) != (9, 0):
        raise RuntimeError(f"stage: the softmax stages are compiled for sm_90a (Hopper, compute capability 9.0); "
                           f"{name} is {major}.{minor}")


def _run(call: Call, x: torch.Tensor, y: torch.Tensor) -> None:
    if call.rows == 0:
        return
    _on_hopper(x)
    lib = _library("softmax", call.stage.number)
    with torch.cuda.device(x.device):
        lib.launch(x.data_ptr(), y.data_ptr(), call.rows, call.cols, call.x_stride, call.cols, DTYPE_CODES[x.dtype],
                   _device(x.device)[3], torch.cuda.current_stream(x.device).cuda_stream)


def _run_backward(call: Call, dy: torch.Tensor, y: torch.Tensor, dx: torch.Tensor) -> None:
    if call.rows == 0:
        return
    _on_hopper(y)
    lib = _library("softmax_backward", call.stage.number)
    with torch.cuda.device(y.device):
        lib.launch_backward(y.data_ptr(), dy.data_ptr(), dx.data_ptr(), call.rows, call.cols, call.x_stride,
                            call.dy_stride, call.cols, DTYPE_CODES[y.dtype], _device(y.device)[3],
                            torch.cuda.current_stream(y.device).cuda_stream)


@torch.library.custom_op("hopattn::softmax", mutates_args=())
def _softmax_op(x: torch.Tensor, stage: int | None = None) -> torch.Tensor:
    call = check(x, stage)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _run(call, x, y)
    return y


@_softmax_op.register_fake
def _(x, stage=None):
    check(x, stage)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.custom_op("hopattn::softmax_backward", mutates_args=())
def _softmax_backward_op(dy: torch.Tensor, y: torch.Tensor, stage: int | None = None) -> torch.Tensor:
    call = check_backward(dy, y, stage)
    dx = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    _run_backward(call, dy, y, dx)
    return dx


@_softmax_backward_op.register_fake
def _(dy, y, stage=None):
    check_backward(dy, y, stage)
    return torch.empty(y.shape, dtype=y.dtype, device=y.device)


def _setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(output)  # y: the backward needs the output, not x


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return torch.ops.hopattn.softmax_backward(_as_rows(dy), y, None), None


torch.library.register_autograd("hopattn::softmax", _backward, setup_context=_setup)


def softmax(x: torch.Tensor, *, stage: int | None = None) -> torch.Tensor:
    """exp(x − max) / Σ exp(x − max) over the last axis of x, in fp32, rounded once to x's dtype.

    x: bf16, fp16 or fp32 on a CUDA device (Hopper), its last axis contiguous, the leading axes rows a
    single stride apart (a column slice of a wider tensor is read in place). stage: a stage of
    kernels/softmax (default: the final one). Returns a new contiguous tensor shaped like x.
    Differentiable (the final stage of kernels/softmax_backward).
    """
    check(x, stage)  # here too: the op's schema would read stage=True as 1
    return torch.ops.hopattn.softmax(x, stage)


def softmax_backward(dy: torch.Tensor, y: torch.Tensor, *, stage: int | None = None) -> torch.Tensor:
    """dx = y · (dy − Σ y · dy) over the last axis: the gradient of softmax at its output y for the
    gradient dy of y (dy shaped and typed as y). stage: a stage of kernels/softmax_backward."""
    check_backward(dy, y, stage)
    return torch.ops.hopattn.softmax_backward(dy, y, stage)


def stage_info(stage=None, cols: int = 4096, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Which kernel a forward stage runs for rows of ``cols`` elements (16-byte aligned, contiguous)."""
    s = _pick(_STAGES, stage, "")
    return _library("softmax", s.number).describe(16, 16, 1, cols, cols, cols, DTYPE_CODES[dtype])


def backward_stage_info(stage=None, cols: int = 4096, dtype: torch.dtype = torch.bfloat16) -> dict:
    s = _pick(_BACKWARD_STAGES, stage, "backward ")
    return _library("softmax_backward", s.number).describe_backward(16, 16, 16, 1, cols, cols, cols, cols,
                                                                     DTYPE_CODES[dtype])


def _softmax_into(x, y, stage=None) -> None:
    """The forward's launch into a given y (contiguous, x's shape and dtype): for the tests, which
    poison it first."""
    call = check(x, stage)
    if y.shape != x.shape or y.dtype != x.dtype or not y.is_contiguous():
        raise ValueError(f"y: expected a contiguous {x.dtype} tensor of shape {tuple(x.shape)}")
    _run(call, x, y)


def _softmax_backward_into(dy, y, dx, stage=None) -> None:
    call = check_backward(dy, y, stage)
    if dx.shape != y.shape or dx.dtype != y.dtype or not dx.is_contiguous():
        raise ValueError(f"dx: expected a contiguous {y.dtype} tensor of shape {tuple(y.shape)}")
    _run_backward(call, dy, y, dx)
