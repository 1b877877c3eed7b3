"""What a stage can read, checked before anything is launched: the one place every entry point goes
through (``hopattn.attention`` and the custom ops ``torch.ops.hopattn.*``, eager, traced and
compiled alike).

Two passes:

- ``check_call`` looks only at what a traced (fake) tensor has too — dtype, device, rank, shape,
  strides — so ``torch.compile`` reports a bad call while it traces, and the fake implementation of
  the op agrees with the real one;
- ``check_memory`` looks at the real pointers just before a launch: alignment for the 16-byte loads
  and the copy engine, and an ``out`` that overlaps an input.

Each error names the argument, what was expected, and what to pass instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .lineage import Stage

HEAD_DIM = 128  # the head dim of stages 01-23 and of the backward lineage (a stage's supports.head_dims)
ALIGN_BYTES = 16  # 16-byte vector loads (stages 01-06), cp.async (05-06), the TMA (07 on)
_STRIDE_ELEMS = ALIGN_BYTES // 2  # bf16: strides in multiples of 8 elements keep every row aligned
_GRID_LIMIT = 65535  # non-persistent stages put heads and batch on grid.y and grid.z
_INT_LIMIT = 2**31 - 1  # lengths, batch and heads travel as int32
DEVICE_TYPES = ("cuda", "meta")  # meta: traced (fake) tensors; research/host_cost.py adds "cpu" to time the checks


@dataclass(frozen=True)
class Call:
    """A checked call: the stage, the axes of the layout, and the sizes the kernel is launched with."""

    stage: Stage
    layout: str
    causal: bool
    scale: float
    batch: int
    heads: int  # query heads
    kv_heads: int
    len_q: int
    len_k: int
    head_dim: int = HEAD_DIM  # q's and k's (the last axis)
    head_dim_v: int = HEAD_DIM  # v's and the output's
    # strides(): (shape, strides) -> the kernel's strides, worked out once per call shape (not compared)
    _strides: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    # api._prepared: (library, SMs, the four tensors' strides) -> the binding's PreparedLaunch (not compared)
    _prepared: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def seq_axis(self) -> int:
        return 2 if self.layout == "bhsd" else 1

    @property
    def head_axis(self) -> int:
        return 1 if self.layout == "bhsd" else 2

    @property
    def nothing_to_compute(self) -> bool:
        """No output element (an empty batch, no heads or no queries): nothing is launched."""
        return self.batch == 0 or self.heads == 0 or self.len_q == 0

    @property
    def no_keys(self) -> bool:
        """len_k = 0: every row sees no key, so the output is 0 (the causal convention's empty row)."""
        return self.len_k == 0

    def strides(self, t: torch.Tensor) -> tuple[int, int, int]:
        """(batch, head, row) strides in elements for the kernel. An axis of size 1 is never stepped
        along, so its stride is whatever torch left there; it is replaced by a valid one (the copy
        engine checks every stride, used or not)."""
        shape, stride = t.shape, t.stride()
        key = (shape, stride)
        found = self._strides.get(key)
        if found is None:
            found = _kernel_strides(shape, stride, self.head_axis, self.seq_axis)
            if len(self._strides) < _MEMO_SIZE:
                self._strides[key] = found
        return found


def _kernel_strides(shape, stride, head_axis: int, seq_axis: int) -> tuple[int, int, int]:
    sizes = (shape[0], shape[head_axis], shape[seq_axis])
    strides = [stride[0], stride[head_axis], stride[seq_axis]]
    for i in (2, 1, 0):  # innermost first, so a replacement can build on the one inside it
        if sizes[i] == 1:
            inner = strides[i + 1] * sizes[i + 1] if i < 2 else shape[3]
            strides[i] = max(inner, _STRIDE_ELEMS)
    return tuple(strides)


# Checked calls by everything check_call reads of them: a model makes the same few calls over and
# over (LTX-2: two shapes, 48 layers, every step), and checking one costs ~10 µs of Python. A call
# whose tensors differ in any dtype, device, shape or stride, or whose stage or arguments differ,
# has another key, so it is checked in full (and an error is never cached: a bad call raises each time).
_MEMO_SIZE = 256
_CHECKED: dict[tuple, Call] = {}


def clear_caches() -> None:
    """Forget every checked call (tests, and research/host_cost.py when it restores the device checks)."""
    _CHECKED.clear()
    _SPANS.clear()


def _meta(t) -> tuple:
    return (t.dtype, t.device, t.shape, t.stride())


def stage_choices(stages: dict[int, Stage]) -> str:
    return f"one of {sorted(stages)} (an int), or None for the final stage"


def check_call(q, k, v, *, causal, scale, stage: Stage, layout, out=None, lse: bool = False,
               lineage: dict[int, Stage] | None = None) -> Call:
    """Every check that needs no data pointer. Raises TypeError or ValueError naming the argument.
    ``lineage``: the stages of the lineage by number, for naming the one that serves a head dim
    this stage does not (it changes only the text of an error, so a passing call does not depend on it).

    A call seen before with the same stage, arguments and tensors (dtype, device, shape, strides:
    all the checks read of a tensor) returns the Call it got then; only exact types take that path
    (bools, a float or None scale, str layout, plain torch.Tensor), anything else is checked in full."""
    T = torch.Tensor
    if ((causal is True or causal is False) and (lse is True or lse is False) and type(layout) is str
            and (scale is None or type(scale) is float) and type(q) is T and type(k) is T and type(v) is T
            and (out is None or type(out) is T)):
        key = (id(stage), DEVICE_TYPES, layout, causal, scale, lse, _meta(q), _meta(k), _meta(v),
               None if out is None else _meta(out))
        found = _CHECKED.get(key)
        if found is not None and found.stage is stage:
            return found
        call = _check_call(q, k, v, causal=causal, scale=scale, stage=stage, layout=layout, out=out, lse=lse,
                           lineage=lineage)
        if len(_CHECKED) >= _MEMO_SIZE:
            _CHECKED.clear()
        _CHECKED[key] = call  # the Call holds its stage: id(stage) is not reused while the entry lives
        return call
    return _check_call(q, k, v, causal=causal, scale=scale, stage=stage, layout=layout, out=out, lse=lse,
                       lineage=lineage)


def _check_call(q, k, v, *, causal, scale, stage: Stage, layout, out=None, lse: bool = False,
                lineage: dict[int, Stage] | None = None) -> Call:
    if lse and not stage.lse:
        raise ValueError(f"return_lse: stage {stage.id} does not compute the log-sum-exp (stage 20 and later do)")
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout: expected 'bhsd' ([B, H, L, D]) or 'bshd' ([B, L, H, D]), got {layout!r}")
    if layout not in stage.layouts:
        raise ValueError(f"layout: stage {stage.id} reads {' and '.join(repr(x) for x in stage.layouts)} only, got "
                         f"{layout!r}: pass tensors in BHSD order, or use stage 17 or later, which reads BSHD in place")
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    if causal and not stage.causal:
        raise ValueError(f"causal: stage {stage.id} is non-causal only (the causal mask arrives in stage 17)")
    names = {"q": q, "k": k, "v": v} if out is None else {"q": q, "k": k, "v": v, "out": out}
    for name, t in names.items():
        _check_tensor(name, t, layout)
    if not (q.device == k.device == v.device):
        raise ValueError(f"k, v: expected the device of q ({q.device}), got {k.device} and {v.device}")
    head_dim, head_dim_v = _check_head_dims(q, k, v, stage, lineage)
    seq_axis, head_axis = (2, 1) if layout == "bhsd" else (1, 2)
    batch, heads, len_q = q.shape[0], q.shape[head_axis], q.shape[seq_axis]
    kv_heads, len_k = k.shape[head_axis], k.shape[seq_axis]
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"v: expected the shape of k {(*k.shape[:3], head_dim_v)}, got {tuple(v.shape)}")
    if k.shape[0] != batch:
        raise ValueError(f"k: expected batch {batch} as in q, got shape {tuple(k.shape)}")
    if kv_heads != heads:
        if not getattr(stage, "gqa", False):
            raise ValueError(f"k: expected {heads} heads as in q, got shape {tuple(k.shape)} ({layout.upper()}); "
                             f"stage {stage.id} has no grouped-query attention: repeat k and v to {heads} heads "
                             f"(repeat_interleave on the head axis), or use stage 20 or later, which reads them as "
                             f"they are")
        if kv_heads == 0 or heads % kv_heads:
            raise ValueError(f"k: grouped-query attention needs q's {heads} heads to be a multiple of k's and v's, "
                             f"got {kv_heads} in shape {tuple(k.shape)}")
    for name, t in names.items():
        _check_strides(name, t, stage, layout)
    if out is not None:
        expected = (*q.shape[:3], head_dim_v)
        if tuple(out.shape) != expected or out.device != q.device:
            raise ValueError(f"out: expected a torch.bfloat16 tensor of shape {expected} on {q.device}, got "
                             f"{tuple(out.shape)} on {out.device}")
        if _self_overlapping(out):
            raise ValueError(f"out: its elements overlap each other (strides {out.stride()} for shape "
                             f"{tuple(out.shape)}): pass a contiguous out")
    for what, value in (("batch", batch), ("heads", heads), ("len_q", len_q), ("len_k", len_k)):
        if value > _INT_LIMIT:
            raise ValueError(f"q: {what} must be below 2^31, got {value}")
    if not stage.persistent and (batch > _GRID_LIMIT or heads > _GRID_LIMIT):
        which = f"backward stage {stage.id}" if stage.backward else f"stage {stage.id}"
        later = "" if stage.backward else " (stages 14 and later have no such limit)"
        raise ValueError(f"q: {which} launches one block row per (batch, head): batch and heads must each "
                         f"be at most {_GRID_LIMIT}, got shape {tuple(q.shape)}{later}")
    if not stage.tails:
        if len_q % stage.block_m:
            raise ValueError(f"q: stage {stage.id} needs the query length to be a multiple of {stage.block_m}, got "
                             f"{len_q} (stage 17 and later take any length)")
        if len_k % stage.block_n:
            raise ValueError(f"k: stage {stage.id} needs the key length to be a multiple of {stage.block_n}, got "
                             f"{len_k} (stage 17 and later take any length)")
    return Call(stage, layout, causal, check_scale(scale, head_dim), batch, heads, kv_heads, len_q, len_k, head_dim,
                head_dim_v)


def _check_head_dims(q, k, v, stage: Stage, lineage: dict[int, Stage] | None) -> tuple[int, int]:
    """(q's and k's head dim, v's): a pair the stage serves (its supports.head_dims)."""
    head_dim, head_dim_v = q.shape[3], v.shape[3]
    which = f"backward stage {stage.id}" if stage.backward else f"stage {stage.id}"
    if k.shape[3] != head_dim:
        raise ValueError(f"k: expected head dim {head_dim} as q's (the last axis), got {k.shape[3]}")
    served_v = stage.head_dim_v(head_dim)
    if served_v is None:
        raise ValueError(f"q: head dim {head_dim} (the last axis): {which} serves head dim {stage.head_dims_text()}"
                         f"{_serving_hint(head_dim, head_dim_v, stage, lineage)}")
    if head_dim_v != served_v:
        raise ValueError(f"v: expected head dim {served_v} with q's and k's {head_dim} ({which} serves "
                         f"{stage.head_dims_text()}), got {head_dim_v}{_serving_hint(head_dim, head_dim_v, stage, lineage)}")
    return head_dim, head_dim_v


def _serving_hint(head_dim: int, head_dim_v: int, stage: Stage, lineage: dict[int, Stage] | None) -> str:
    """'; use stage NN or later, which serves ...' when a stage of the lineage serves the pair."""
    for number in sorted(lineage or {}):
        other = lineage[number]
        if other.number != stage.number and other.head_dim_v(head_dim) == head_dim_v:
            return f"; use stage {other.id} or later, which serves head dim {other.head_dims_text()}"
    return ""


def check_memory(call: Call, q, k, v, out, fresh_out: bool = False) -> None:
    """The checks that need the real tensors: alignment, and an out that overlaps an input.
    ``fresh_out``: out was allocated for this call (the op's own), so it cannot share memory with
    a live input and the overlap test is skipped; its alignment is still checked."""
    if (q.data_ptr() % ALIGN_BYTES or k.data_ptr() % ALIGN_BYTES or v.data_ptr() % ALIGN_BYTES
            or out.data_ptr() % ALIGN_BYTES):
        for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
            if t.numel() and t.data_ptr() % ALIGN_BYTES:
                raise ValueError(f"{name}: the kernels read and write rows with {ALIGN_BYTES}-byte accesses and need "
                                 f"a {ALIGN_BYTES}-byte aligned data pointer, got one {t.data_ptr() % ALIGN_BYTES} "
                                 f"bytes past a boundary (a view at element offset {t.storage_offset()}?): pass "
                                 f"{name}.clone()")
    if fresh_out:
        return
    for name, t in (("q", q), ("k", k), ("v", v)):
        if _overlaps(out, t):
            raise ValueError(f"out: must not share memory with {name} (the kernel reads {name} while writing out)")


def _check_tensor(name: str, t, layout: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.bfloat16:
        raise TypeError(f"{name}: expected dtype torch.bfloat16, got {t.dtype} (pass {name}.bfloat16(); the "
                        f"kernels are bf16 only)")
    if t.device.type not in DEVICE_TYPES:
        raise ValueError(f"{name}: expected a CUDA tensor, got device {t.device} (pass {name}.cuda())")
    if t.dim() != 4:
        raise ValueError(f"{name}: expected a 4-d tensor {layout.upper()}, got {t.dim()}-d of shape {tuple(t.shape)}")


def _check_strides(name: str, t: torch.Tensor, stage: Stage, layout: str) -> None:
    if t.stride(3) != 1:
        raise ValueError(f"{name}: expected the head-dim axis (the last) to be contiguous (stride 1), got strides "
                         f"{t.stride()}: pass {name}.contiguous()")
    if not stage.strided:
        if not t.is_contiguous():
            raise ValueError(f"{name}: stage {stage.id} reads contiguous tensors only, got strides {t.stride()} for "
                             f"shape {tuple(t.shape)}: pass {name}.contiguous(), or use stage 17 or later, which "
                             f"reads strided views in place")
        return
    for axis in range(3):
        if t.shape[axis] > 1 and (t.stride(axis) <= 0 or t.stride(axis) % _STRIDE_ELEMS):
            raise ValueError(f"{name}: the copy engine needs every stride but the head dim's to be a positive "
                             f"multiple of {_STRIDE_ELEMS} elements ({ALIGN_BYTES} bytes), got strides {t.stride()} "
                             f"for shape {tuple(t.shape)} ({layout.upper()}): pass {name}.contiguous()")


def check_scale(scale, head_dim: int = HEAD_DIM) -> float:
    """The softmax scale: ``scale`` checked, or 1/sqrt(head_dim) (q's) when None."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    # Positive, because from stage 06 on the running maximum is taken over unscaled scores.
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale: expected a finite positive number (default 1/sqrt(head dim)), got {scale!r}")
    return float(scale)


def _self_overlapping(t: torch.Tensor) -> bool:
    """Whether two elements of t can share an address. Sufficient test: with the axes of size > 1
    sorted by stride, each stride must reach past the whole extent of the axes inside it (a strided
    view with gaps, like one slice of a packed tensor, passes; an expanded or folded view does not)."""
    axes = sorted((st, n) for n, st in zip(t.shape, t.stride()) if n > 1)
    extent = 1
    for stride, size in axes:
        if stride < extent:
            return True
        extent = stride * (size - 1) + extent
    return False


# (shape, strides, element size) -> the bytes a tensor's elements span (0 when it has none)
_SPANS: dict[tuple, int] = {}


def _span(t: torch.Tensor) -> int:
    key = (t.shape, t.stride(), t.element_size())
    found = _SPANS.get(key)
    if found is None:
        if t.numel() == 0:
            found = 0
        else:
            last = sum((n - 1) * st for n, st in zip(key[0], key[1]))
            found = (last + 1) * key[2]
        if len(_SPANS) >= _MEMO_SIZE:
            _SPANS.clear()
        _SPANS[key] = found
    return found


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the bytes a and b span intersect (conservative: strided gaps count as used)."""
    span_a, span_b = _span(a), _span(b)
    if span_a == 0 or span_b == 0 or a.device != b.device:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + span_b and b0 < a0 + span_a
