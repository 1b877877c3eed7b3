"""The Python API: ``attention(q, k, v, *, causal=False, scale=None, stage=None, layout="bhsd")``.

Every bad input raises an error that names the argument and what was expected, before anything is
launched. The launch itself goes through a torch custom op (``torch.ops.hopattn.attention``), so
``torch.compile`` can trace calls to it.
"""

from __future__ import annotations

import math
import threading
from functools import lru_cache

import torch

from . import build, lineage

HEAD_DIM = 128
_GRID_LIMIT = 65535  # heads and batch map to grid.y and grid.z
_LOCK = threading.Lock()


# Read once at import: a plain dict keeps `attention` traceable by torch.compile (no file access).
_STAGES: dict[int, lineage.Stage] = {s.number: s for s in lineage.discover()}


def _stages() -> dict[int, lineage.Stage]:
    return _STAGES


def stages() -> list[lineage.Stage]:
    """The stages of the lineage, in order."""
    return list(_stages().values())


def final_stage() -> int:
    return max(_stages())


def _stage(stage) -> lineage.Stage:
    table = _stages()
    if stage is None:
        return table[final_stage()]
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in table:
        raise ValueError(f"stage: expected one of {sorted(table)} (an int), got {stage!r}")
    return table[stage]


@lru_cache(maxsize=1)
def _native():
    import importlib.machinery
    import importlib.util

    path = build.build_native()
    loader = importlib.machinery.ExtensionFileLoader("hopattn._native", str(path))
    spec = importlib.util.spec_from_file_location("hopattn._native", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@lru_cache(maxsize=None)
def _library(number: int):
    with _LOCK:  # one nvcc per stage even when several threads ask at once
        result = build.compile_stage(_stages()[number])
        return _native().StageLibrary(str(result.library))


def stage_info(stage=None) -> dict:
    """What the compiled kernel of a stage needs: threads, shared memory, registers, tile."""
    s = _stage(stage)
    return _library(s.number).describe()


def _check_device_supports(s: lineage.Stage, device: torch.device) -> None:
    major, minor = torch.cuda.get_device_capability(device)
    name = torch.cuda.get_device_name(device)
    if s.arch == "sm_90a" and (major, minor) != (9, 0):
        raise RuntimeError(f"stage: stage {s.id} uses sm_90a instructions (wgmma, setmaxnreg), which only "
                           f"Hopper (compute capability 9.0) has; {name} is {major}.{minor}")
    if s.arch == "sm_80" and major < 8:
        raise RuntimeError(f"stage: stage {s.id} needs compute capability 8.0 or newer; {name} is {major}.{minor}")


def _validate(q, k, v, causal, scale, s: lineage.Stage, layout: str) -> float:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.bfloat16:
            raise TypeError(f"{name}: expected dtype torch.bfloat16, got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-d tensor {layout.upper()}, got {t.dim()}-d of shape {tuple(t.shape)}")
        if t.device.type != "cuda" and t.device.type != "meta":
            raise ValueError(f"{name}: expected a CUDA tensor, got device {t.device}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"k, v: expected the device of q ({q.device}), got {k.device} and {v.device}")
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout: expected 'bhsd' or 'bshd', got {layout!r}")
    if layout not in s.layouts:
        raise ValueError(f"layout: stage {s.id} supports {', '.join(repr(x) for x in s.layouts)} only, got {layout!r}")
    seq_axis, head_axis = (2, 1) if layout == "bhsd" else (1, 2)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[3] != HEAD_DIM:
            raise ValueError(f"{name}: expected head dim {HEAD_DIM} (last axis), got {t.shape[3]}")
        if t.stride(3) != 1:
            raise ValueError(f"{name}: expected the head-dim axis to be contiguous (stride 1), got strides {t.stride()}")
        if t.shape[seq_axis] == 0:
            raise ValueError(f"{name}: expected a non-empty sequence, got length 0 in shape {tuple(t.shape)}")
        if "bshd" not in s.layouts and not t.is_contiguous():
            raise ValueError(f"{name}: stage {s.id} expects a contiguous BHSD tensor, got strides {t.stride()}")
        if "bshd" in s.layouts and layout == "bshd" and t.stride(2) != HEAD_DIM:
            raise ValueError(f"{name}: expected BSHD with the heads of a row packed (stride(2) == {HEAD_DIM}), "
                             f"got strides {t.stride()}")
    if k.shape != v.shape:
        raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[head_axis] != k.shape[head_axis]:
        raise ValueError(f"k: expected batch {q.shape[0]} and heads {q.shape[head_axis]} as in q, got shape "
                         f"{tuple(k.shape)}")
    if q.shape[0] > _GRID_LIMIT or q.shape[head_axis] > _GRID_LIMIT:
        raise ValueError(f"q: batch and heads must each be at most {_GRID_LIMIT}, got shape {tuple(q.shape)}")
    len_q, len_k = q.shape[seq_axis], k.shape[seq_axis]
    if not s.tails:
        if len_q % s.block_m:
            raise ValueError(f"q: stage {s.id} needs the query length to be a multiple of {s.block_m}, got {len_q}")
        if len_k % s.block_n:
            raise ValueError(f"k: stage {s.id} needs the key length to be a multiple of {s.block_n}, got {len_k}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    if causal and not s.causal:
        raise ValueError(f"causal: stage {s.id} is non-causal only (causal masking arrives in stage 17)")
    if scale is None:
        return 1.0 / math.sqrt(HEAD_DIM)
    # Positive, because from stage 06 on the running maximum is taken over unscaled scores.
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale: expected a finite positive number, got {scale!r}")
    return float(scale)


def _validate_out(out, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out: expected a torch.Tensor, got {type(out).__name__}")
    if out.dtype != q.dtype or out.shape != q.shape or out.device != q.device:
        raise ValueError(f"out: expected a {q.dtype} tensor of shape {tuple(q.shape)} on {q.device}, got "
                         f"{out.dtype} {tuple(out.shape)} on {out.device}")
    if not out.is_contiguous():
        raise ValueError(f"out: expected a contiguous tensor, got strides {out.stride()}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if _overlaps(out, t):
            raise ValueError(f"out: must not share memory with {name} (the kernel reads {name} while writing out)")


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the bytes a and b span intersect (a conservative test: strided gaps count as used)."""
    if a.device != b.device or a.device.type == "meta" or a.numel() == 0 or b.numel() == 0:
        return False

    def byte_range(t: torch.Tensor) -> tuple[int, int]:
        last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
        return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()

    (a0, a1), (b0, b1) = byte_range(a), byte_range(b)
    return a0 < b1 and b0 < a1


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: float | None = None, stage: int | None = None, layout: str = "bhsd",
              out: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(scale · q kᵀ) v for bf16 CUDA tensors with head dim 128.

    q: [B, H, Lq, 128], k and v: [B, H, Lk, 128] (layout "bhsd"), or [B, L, H, 128] (layout "bshd",
    for stages that support it). ``scale`` (positive) defaults to 1/sqrt(128); ``stage`` to the
    final stage. Returns a new tensor shaped like q, or writes into ``out`` (contiguous, shaped
    like q, sharing no memory with q, k or v) and returns it.
    """
    s = _stage(stage)
    scale = _validate(q, k, v, causal, scale, s, layout)
    if out is None:
        return torch.ops.hopattn.attention(q, k, v, causal, scale, s.number, layout)
    _validate_out(out, q, k, v)
    torch.ops.hopattn.attention_out(q, k, v, out, causal, scale, s.number, layout)
    return out


def _strides(t: torch.Tensor, layout: str) -> tuple[int, int, int]:
    b, x, y, _ = t.stride()
    return (b, x, y) if layout == "bhsd" else (b, y, x)  # (batch, head, row)


def _launch(q, k, v, out, causal: bool, scale: float, stage: int, layout: str) -> None:
    if q.device.type != "cuda":  # meta tensors (shape checks) launch nothing
        return
    _check_device_supports(_STAGES[stage], q.device)
    seq_axis, head_axis = (2, 1) if layout == "bhsd" else (1, 2)
    lib = _library(stage)
    with torch.cuda.device(q.device):
        lib.launch(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), _strides(q, layout), _strides(k, layout),
                   _strides(v, layout), _strides(out, layout), q.shape[0], q.shape[head_axis], q.shape[seq_axis],
                   k.shape[seq_axis], q.shape[3], scale, causal,
                   torch.cuda.get_device_properties(q.device).multi_processor_count,
                   torch.cuda.current_stream(q.device).cuda_stream)


@torch.library.custom_op("hopattn::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, stage: int,
                  layout: str) -> torch.Tensor:
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    _launch(q, k, v, out, causal, scale, stage, layout)
    return out


@torch.library.custom_op("hopattn::attention_out", mutates_args=("out",))
def _attention_out_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, causal: bool,
                      scale: float, stage: int, layout: str) -> None:
    _launch(q, k, v, out, causal, scale, stage, layout)


@_attention_op.register_fake
def _(q, k, v, causal, scale, stage, layout):
    return torch.empty_like(q, memory_format=torch.contiguous_format)
