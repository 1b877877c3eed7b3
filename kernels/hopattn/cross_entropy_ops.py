"""Cross-entropy (Part II; its stages passed their GPU tests on the H200, 2026-12-02T1938): ``cross_entropy(logits, targets, *,
ignore_index=-100, label_smoothing=0.0, reduction="mean", stage=None)`` over the last axis of logits,
and the ops ``torch.ops.hopattn.cross_entropy`` (the fused forward: loss, lse and, when asked for, the
gradient in one launch) and ``torch.ops.hopattn.cross_entropy_backward`` (the gradient alone, for a
given per-row dloss, m and s recomputed from the logits), through the stages of
kernels/cross_entropy (hopattn.cross_entropy_lineage).

Per row r (V classes, t = targets[r], ε = label_smoothing), in fp32 (abi_cross_entropy.h has the
contract the kernels keep):

    lse[r]  = log Σ_c exp(x[r, c])
    loss[r] = (1 − ε) · (lse[r] − x[r, t]) + ε · (lse[r] − mean_c x[r, c])        (0 where t = ignore_index)
    dlogits = g[r] · (softmax(x[r]) − (1 − ε) · onehot(t) − ε / V)               (0 where t = ignore_index)

torch.nn.functional.cross_entropy(logits, targets, ignore_index=, label_smoothing=, reduction=) for
2-D logits [N, V]; here any leading axes, the classes the LAST axis (torch takes them on axis 1 for
more than two axes), targets shaped logits.shape[:-1]. reduction "mean" divides by the rows not
ignored (NaN when every row is, as torch). A target outside [0, V) that is not ignore_index cannot be
seen on the host without a synchronisation: the kernel makes that row's loss NaN (and its gradient),
where torch raises a device-side assert; pass ``check_targets=True`` to have it refused here instead
(one synchronisation).

The gradient is computed in the forward when logits requires it (QuACK's return_dx, Liger's forward):
one read of the logits and one write of dlogits (stage 03 on, for rows it holds); the mean's 1/n is
folded in on the device (no synchronisation). The backward is then a scale of the saved dlogits by the
incoming gradient (an element-wise multiply by torch: a read and a write; skipping it when that
gradient is exactly 1 would need a synchronisation, which this op leaves out).

Every input is checked before a launch (``check``): a bad input raises naming the argument. The ops
are torch custom ops with fake implementations and autograd (register_autograd).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import math
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from . import build, cross_entropy_lineage, rowwise
from .rmsnorm import DTYPE_CODES, _device, _row_stride

_LOCK = threading.Lock()
REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}
MAX_CLASSES = 2**31 - 2**20  # HOPATTN_CROSS_ENTROPY_MAX_COLS (abi_cross_entropy.h): int32 column indices

# Read once at import: plain dicts keep cross_entropy traceable by torch.compile (no file access).
_STAGES: dict[int, rowwise.RowStage] = {s.number: s for s in cross_entropy_lineage.discover()}


def stages() -> list[rowwise.RowStage]:
    return list(_STAGES.values())


def final_stage() -> int:
    return max(_STAGES)


def _pick(stage) -> rowwise.RowStage:
    if stage is None:
        return _STAGES[final_stage()]
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in _STAGES:
        raise ValueError(f"stage: expected None (the final stage, {final_stage():02d}) or one of "
                         f"{', '.join(str(n) for n in _STAGES)}, got {stage!r}")
    return _STAGES[stage]


@dataclass(frozen=True)
class Call:
    """A checked call: the rows as the kernel reads them, and the scalars as it takes them."""

    stage: rowwise.RowStage
    rows: int
    cols: int
    logits_stride: int
    ignore_index: int
    label_smoothing: float
    reduction: str


def _logits_rows(logits) -> tuple[int, int, int]:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits: expected a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in DTYPE_CODES:
        raise ValueError(f"logits: expected torch.bfloat16, torch.float16 or torch.float32, got {logits.dtype}")
    if logits.dim() < 1:
        raise ValueError("logits: expected at least one axis (the classes, the last), got a 0-d tensor")
    cols = logits.shape[-1]
    if cols == 0:
        raise ValueError(f"logits: the last axis (the classes) is empty (shape {tuple(logits.shape)})")
    if cols > MAX_CLASSES:
        raise ValueError(f"logits: rows of at most {MAX_CLASSES} classes (2^31 - 2^20), got {cols}")
    rows = logits.numel() // cols
    if rows == 0:
        return 0, cols, cols
    if logits.stride(-1) != 1:
        raise ValueError(f"logits: the last axis must be contiguous (stride 1), got strides {logits.stride()}: "
                         f"pass logits.contiguous()")
    stride = _row_stride(logits, cols)
    if stride is None:
        raise ValueError(f"logits: the leading axes of shape {tuple(logits.shape)} and strides {logits.stride()} do "
                         f"not fold into rows a single stride apart: pass logits.contiguous()")
    if rows > 1 and stride < cols:
        raise ValueError(f"logits: rows overlap (a row stride of {stride} elements for rows of {cols}): "
                         f"pass logits.contiguous()")
    return rows, cols, stride


def check(logits, targets, ignore_index=-100, label_smoothing=0.0, reduction="mean", stage=None) -> Call:
    """Every rule of the contract, before anything is launched (TypeError / ValueError naming the
    argument). The device is checked last, so that the other rules can be tested without a GPU."""
    s = _pick(stage)
    rows, cols, stride = _logits_rows(logits)
    if not isinstance(targets, torch.Tensor):
        raise TypeError(f"targets: expected a torch.Tensor, got {type(targets).__name__}")
    if targets.dtype != torch.int64:
        hint = ": pass targets.long()" if not targets.dtype.is_floating_point and targets.dtype != torch.bool else \
            " (class indices; class probabilities are not supported)"
        raise ValueError(f"targets: expected torch.int64 class indices, got {targets.dtype}{hint}")
    if tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"targets: expected shape {tuple(logits.shape[:-1])} (logits' shape without its last axis, "
                         f"the classes), got {tuple(targets.shape)}")
    if rows > 0 and not targets.is_contiguous():
        raise ValueError(f"targets: expected a contiguous tensor, got strides {targets.stride()}: "
                         f"pass targets.contiguous()")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index: expected an int, got {type(ignore_index).__name__}")
    if not -2**63 <= ignore_index < 2**63:
        raise ValueError(f"ignore_index: expected a 64-bit integer, got {ignore_index}")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)):
        raise TypeError(f"label_smoothing: expected a float, got {type(label_smoothing).__name__}")
    if not (0.0 <= label_smoothing <= 1.0):
        raise ValueError(f"label_smoothing: expected a number in [0, 1], got {label_smoothing!r}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction: expected one of {', '.join(repr(r) for r in REDUCTIONS)}, got {reduction!r}")
    if logits.device.type != "cuda":
        raise ValueError(f"logits: expected a CUDA tensor, got one on {logits.device}: pass logits.cuda()")
    if targets.device != logits.device:
        raise ValueError(f"targets: expected a tensor on logits' device {logits.device}, got {targets.device}")
    return Call(s, rows, cols, stride, int(ignore_index), float(label_smoothing), reduction)


def check_target_range(targets: torch.Tensor, cols: int, ignore_index: int) -> None:
    """Refuses a target outside [0, V) that is not ignore_index (one synchronisation: .item())."""
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= cols))
    if bool(bad.any().item()):
        i = tuple(bad.nonzero()[0].tolist())
        raise ValueError(f"targets: {list(i)} is {targets[i].item()}, outside [0, {cols}) and not ignore_index "
                         f"({ignore_index})")


# --- the binding ------------------------------------------------------------------------------------

NATIVE_SOURCE_NAME = "cross_entropy_native.cpp"


def _native_source() -> Path:
    return _STAGES[final_stage()].dir.parent / "common" / NATIVE_SOURCE_NAME


def native_path() -> Path:
    import pybind11

    source = _native_source()
    abi = source.parent / "abi_cross_entropy.h"
    rms_abi = rowwise.RMSNORM_DIR / "common" / "abi_rmsnorm.h"
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    key = build._key(source.read_text(), abi.read_text(), rms_abi.read_text(), pybind11.__version__, sys.version,
                     build.nvcc_version())
    return build.build_dir() / f"_cross_entropy_native-{key}{suffix}"


def build_native() -> Path:
    """Compile cross_entropy_native.cpp (host code only) into a Python extension, as
    rowwise_build.build_native does for the rowwise binding."""
    import pybind11

    target = native_path()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    source = _native_source()
    includes = [pybind11.get_include(), sysconfig.get_paths()["include"], str(source.parent)]
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        tmp_target = Path(tmp) / target.name
        cmd = [build.nvcc(), "-O2", "-std=c++17", "-shared", "-Xcompiler=-fPIC,-fvisibility=hidden",
               *[f"-I{i}" for i in includes], "-o", str(tmp_target), str(source), "-ldl"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise build.BuildError(f"cross-entropy binding: build failed ({' '.join(cmd)})\n{proc.stdout}{proc.stderr}")
        os.replace(tmp_target, target)
    return target


@lru_cache(maxsize=1)
def _native():
    path = build_native()
    name = "hopattn._cross_entropy_native"
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@lru_cache(maxsize=None)
def _library(number: int):
    with _LOCK:
        result = build.compile_stage(_STAGES[number])
        return _native().CrossEntropyLibrary(str(result.library))


def _on_hopper(t: torch.Tensor) -> None:
    major, minor, name, _ = _device(t.device)
    if (major, minor) != (9, 0):
        raise RuntimeError(f"stage: the cross-entropy stages are compiled for sm_90a (Hopper, compute capability "
                           f"9.0); {name} is {major}.{minor}")


def _launch(call: Call, logits, targets, loss, lse, dlogits, dloss=None, dloss_stride: int = 0,
            grad_scale: float = 1.0) -> None:
    if call.rows == 0:
        return
    _on_hopper(logits)
    lib = _library(call.stage.number)
    dl_stride = 0
    if dlogits is not None:
        dl_stride = call.logits_stride if dlogits.data_ptr() == logits.data_ptr() else _row_stride(dlogits, call.cols)
    with torch.cuda.device(logits.device):
        lib.launch(logits.data_ptr(), targets.data_ptr(), loss.data_ptr(), 0 if lse is None else lse.data_ptr(),
                   0 if dlogits is None else dlogits.data_ptr(), 0 if dloss is None else dloss.data_ptr(),
                   call.rows, call.cols, call.logits_stride, dl_stride, dloss_stride, call.ignore_index,
                   call.label_smoothing, grad_scale, DTYPE_CODES[logits.dtype], _device(logits.device)[3],
                   torch.cuda.current_stream(logits.device).cuda_stream)


def _reduce(loss_rows: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str):
    if reduction == "none":
        return loss_rows
    if reduction == "sum":
        return loss_rows.sum()
    return loss_rows.sum() / (targets.reshape(-1) != ignore_index).sum().to(torch.float32)


# --- the ops -----------------------------------------------------------------------------------------

@torch.library.custom_op("hopattn::cross_entropy", mutates_args=())
def _cross_entropy_op(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, label_smoothing: float,
                      reduction: str, stage: int | None, with_grad: bool
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    call = check(logits, targets, ignore_index, label_smoothing, reduction, stage)
    lead = tuple(logits.shape[:-1])
    loss_rows = torch.empty(lead, dtype=torch.float32, device=logits.device)
    lse = torch.empty(lead, dtype=torch.float32, device=logits.device)
    dlogits = torch.empty(logits.shape if with_grad else (0,), dtype=logits.dtype, device=logits.device)
    dloss = None
    if with_grad and reduction == "mean":  # 1 / (rows not ignored), on the device: g of every row (stride 0)
        dloss = 1.0 / (targets != ignore_index).sum().to(torch.float32).reshape(1)
    _launch(call, logits, targets, loss_rows, lse, dlogits if with_grad else None, dloss, 0)
    return _reduce(loss_rows, targets, ignore_index, reduction), lse, dlogits


@_cross_entropy_op.register_fake
def _(logits, targets, ignore_index, label_smoothing, reduction, stage, with_grad):
    check(logits, targets, ignore_index, label_smoothing, reduction, stage)
    lead = tuple(logits.shape[:-1])
    loss = logits.new_empty(lead if reduction == "none" else (), dtype=torch.float32)
    return (loss, logits.new_empty(lead, dtype=torch.float32),
            logits.new_empty(logits.shape if with_grad else (0,)))


def _setup(ctx, inputs, output) -> None:
    ctx.with_grad = inputs[6]
    ctx.reduction = inputs[4]
    ctx.save_for_backward(output[2])
    ctx.mark_non_differentiable(output[1], output[2])


def _backward(ctx, grad_loss, grad_lse, grad_dlogits):
    if not ctx.with_grad:
        raise RuntimeError("hopattn::cross_entropy: called with with_grad=False, so no gradient was computed; "
                           "call hopattn.cross_entropy_ops.cross_entropy, which asks for it when logits requires grad")
    (dlogits,) = ctx.saved_tensors
    # The scale: the incoming scalar (mean, sum) or row gradient (none), onto the saved gradient.
    # A 0-d fp32 g keeps dlogits' dtype (computed in fp32); a row gradient [N, 1] promotes, so round back.
    g = grad_loss if ctx.reduction != "none" else grad_loss.unsqueeze(-1)
    return (dlogits * g).to(dlogits.dtype), None, None, None, None, None, None


torch.library.register_autograd("hopattn::cross_entropy", _backward, setup_context=_setup)


@torch.library.custom_op("hopattn::cross_entropy_backward", mutates_args=())
def _cross_entropy_backward_op(logits: torch.Tensor, targets: torch.Tensor, dloss: torch.Tensor, ignore_index: int,
                               label_smoothing: float, stage: int | None) -> torch.Tensor:
    call = check(logits, targets, ignore_index, label_smoothing, "none", stage)
    _check_dloss(dloss, logits)
    loss_rows = torch.empty(tuple(logits.shape[:-1]), dtype=torch.float32, device=logits.device)
    dlogits = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    _launch(call, logits, targets, loss_rows, None, dlogits, dloss, 1)
    return dlogits


@_cross_entropy_backward_op.register_fake
def _(logits, targets, dloss, ignore_index, label_smoothing, stage):
    check(logits, targets, ignore_index, label_smoothing, "none", stage)
    _check_dloss(dloss, logits)
    return logits.new_empty(logits.shape)


def _check_dloss(dloss, logits) -> None:
    if not isinstance(dloss, torch.Tensor):
        raise TypeError(f"dloss: expected a torch.Tensor, got {type(dloss).__name__}")
    if dloss.dtype != torch.float32:
        raise ValueError(f"dloss: expected torch.float32 (the loss's dtype), got {dloss.dtype}: pass dloss.float()")
    if tuple(dloss.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"dloss: expected shape {tuple(logits.shape[:-1])} (one value a row), got {tuple(dloss.shape)}")
    if not dloss.is_contiguous():
        raise ValueError("dloss: expected a contiguous tensor: pass dloss.contiguous()")
    if dloss.device != logits.device:
        raise ValueError(f"dloss: expected a tensor on logits' device {logits.device}, got {dloss.device}")


# --- the functions -------------------------------------------------------------------------------------

def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, *, ignore_index: int = -100,
                  label_smoothing: float = 0.0, reduction: str = "mean", stage: int | None = None,
                  check_targets: bool = False) -> torch.Tensor:
    """torch.nn.functional.cross_entropy over the last axis of logits (see the module's docstring).

    logits: bf16, fp16 or fp32 on a CUDA device (Hopper), its last axis (the classes) contiguous, the
    leading axes rows a single stride apart. targets: int64, shaped logits.shape[:-1]. reduction: "mean"
    (over the rows not ignored), "sum" or "none" (fp32, shaped logits.shape[:-1]). Differentiable in
    logits: the gradient is computed in the forward when logits requires grad.
    """
    call = check(logits, targets, ignore_index, label_smoothing, reduction, stage)
    if check_targets and call.rows:
        check_target_range(targets, call.cols, ignore_index)
    with_grad = bool(logits.requires_grad and torch.is_grad_enabled())
    loss, _, _ = torch.ops.hopattn.cross_entropy(logits, targets, call.ignore_index, call.label_smoothing, reduction,
                                                 stage, with_grad)
    return loss


def cross_entropy_forward(logits, targets, *, ignore_index=-100, label_smoothing=0.0, stage=None,
                          with_grad=False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(loss per row, lse per row, dlogits or None): the fused forward, no autograd. dlogits (with_grad)
    is the gradient of the SUM of the row losses (g = 1 a row)."""
    call = check(logits, targets, ignore_index, label_smoothing, "none", stage)
    loss, lse, dl = torch.ops.hopattn.cross_entropy(logits.detach(), targets, call.ignore_index,
                                                    call.label_smoothing, "none", stage, bool(with_grad))
    return loss, lse, dl if with_grad else None


def cross_entropy_backward(logits, targets, dloss, *, ignore_index=-100, label_smoothing=0.0, stage=None):
    """dlogits = dloss[r] · ∂loss[r]/∂logits[r, :] (m and s recomputed from logits): the backward alone."""
    call = check(logits, targets, ignore_index, label_smoothing, "none", stage)
    _check_dloss(dloss, logits)
    return torch.ops.hopattn.cross_entropy_backward(logits, targets, dloss, call.ignore_index, call.label_smoothing,
                                                    stage)


def stage_info(stage=None, cols: int = 32768, dtype: torch.dtype = torch.bfloat16, with_grad: bool = True) -> dict:
    """Which kernel a stage runs for rows of ``cols`` classes (16-byte aligned, contiguous), with the
    gradient or without."""
    s = _pick(stage)
    return _library(s.number).describe(16, 16 if with_grad else 0, 1, cols, cols, cols, DTYPE_CODES[dtype])


def _cross_entropy_into(logits, targets, loss, lse, dlogits=None, *, ignore_index=-100, label_smoothing=0.0,
                        stage=None, dloss=None, grad_scale: float = 1.0) -> None:
    """One launch into given outputs (for the tests, which poison them first, and the bench): loss and
    lse fp32 contiguous shaped logits.shape[:-1]; dlogits None, logits itself (in place), or a tensor
    of logits' shape and dtype whose rows are a single stride apart; dloss None, one fp32 value (every
    row's) or one a row."""
    call = check(logits, targets, ignore_index, label_smoothing, "none", stage)
    lead = tuple(logits.shape[:-1])
    for name, t in (("loss", loss), ("lse", lse)):
        if t is None and name == "lse":
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) != lead or \
                not t.is_contiguous() or t.device != logits.device:
            raise ValueError(f"{name}: expected a contiguous torch.float32 tensor of shape {lead} on {logits.device}")
    if dlogits is not None:
        if not isinstance(dlogits, torch.Tensor) or dlogits.dtype != logits.dtype or dlogits.shape != logits.shape \
                or dlogits.device != logits.device:
            raise ValueError(f"dlogits: expected a {logits.dtype} tensor of shape {tuple(logits.shape)} on "
                             f"{logits.device}")
        if dlogits.data_ptr() == logits.data_ptr():
            if dlogits.stride() != logits.stride():
                raise ValueError("dlogits: in place of logits, it must be logits itself (the same strides)")
        elif call.rows and (dlogits.stride(-1) != 1 or _row_stride(dlogits, call.cols) is None or
                            (call.rows > 1 and _row_stride(dlogits, call.cols) < call.cols)):
            raise ValueError("dlogits: expected its last axis contiguous and its rows a single stride apart")
    stride = 0
    if dloss is not None:
        if not isinstance(dloss, torch.Tensor) or dloss.dtype != torch.float32 or dloss.device != logits.device:
            raise ValueError(f"dloss: expected a torch.float32 tensor on {logits.device}")
        if dloss.numel() == 1:
            stride = 0
        elif tuple(dloss.shape) == lead and dloss.is_contiguous():
            stride = 1
        else:
            raise ValueError(f"dloss: expected one value or a contiguous tensor of shape {lead}")
    if not (isinstance(grad_scale, (int, float)) and not isinstance(grad_scale, bool) and math.isfinite(grad_scale)):
        raise ValueError(f"grad_scale: expected a finite float, got {grad_scale!r}")
    _launch(call, logits, targets, loss, lse, dlogits, dloss, stride, float(grad_scale))


# --- the float64 reference ---------------------------------------------------------------------------------

def reference(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100, label_smoothing: float = 0.0,
              dloss: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, lse, dlogits) per row in float64, on logits' device (a CPU tensor works), from the formulas
    of the module's docstring, written out (not through torch's cross_entropy, which the tests compare it
    with). dlogits: of the sum of the row losses, each row scaled by dloss[r] when given. Targets outside
    [0, V) that are not ignore_index: NaN, as the kernels."""
    x = logits.double()
    cols = x.shape[-1]
    t = targets.long()
    ignored = t == ignore_index
    valid = ~ignored & (t >= 0) & (t < cols)
    safe = torch.where(valid, t, torch.zeros_like(t))
    m = x.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # a row of −inf: lse −inf, loss NaN (as torch)
    s = torch.exp(x - m).sum(-1, keepdim=True)
    lse = (m + torch.log(s)).squeeze(-1)
    xt = torch.gather(x, -1, safe.unsqueeze(-1)).squeeze(-1)
    eps = float(label_smoothing)
    loss = (1 - eps) * (lse - xt)
    if eps:
        loss = loss + eps * (lse - x.mean(-1))
    loss = torch.where(valid, loss, torch.full_like(loss, math.nan))
    loss = torch.where(ignored, torch.zeros_like(loss), loss)
    prob = torch.exp(x - lse.unsqueeze(-1))
    onehot = torch.zeros_like(x).scatter_(-1, safe.unsqueeze(-1), 1.0)
    grad = prob - (1 - eps) * onehot - eps / cols
    g = torch.ones_like(lse) if dloss is None else dloss.double().expand_as(lse)
    grad = grad * torch.where(valid, g, torch.full_like(g, math.nan)).unsqueeze(-1)
    grad = torch.where(ignored.unsqueeze(-1), torch.zeros_like(grad), grad)
    return loss, lse, grad
