"""Which attention calls hopattn served, and why the others fell back.

    with routing.track(strict=True) as report:
        model(**inputs)
    print(report.summary())   # "80 attention calls: 80 served by hopattn"

Every call that reaches an integration (transformers' AttentionInterface, diffusers' attention
dispatch) is recorded in each active report: served (directly, or after repeating K/V heads for a
kernel without GQA, or after a copy into a layout the kernel reads) or sent, with its reason, to an
implementation that honours every argument of the call (SDPA, or the model's eager attention).
A served call that needs a gradient (grad mode on, an input that requires grad: a model in
training) is counted as served with a backward too: its gradients come from the kernel's backward
when the loss's ``.backward()`` runs (``deterministic``: the bitwise reproducible one).
A strict report refuses, at the call, anything the kernel cannot serve, and fails on exit if any call
fell back or if no call came through at all (the model was never switched to hopattn).
"""

from __future__ import annotations

import threading
from collections import Counter
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch

# How a served call reached the kernel.
DIRECT = "direct"  # the tensors as the model made them
REPEAT_KV = "repeat_kv"  # K/V heads repeated for a kernel that cannot read GQA in place
COPIED = "copied"  # made contiguous (or transposed) into a layout the kernel reads


class RoutingError(RuntimeError):
    """A strict run met an attention call the kernel cannot serve (``reason`` says why)."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class CallShape:
    """One attention call, as the benchmark replays it: logical BHSD sizes plus the mask."""

    library: str
    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    k_len: int
    head_dim: int
    causal: bool
    layout: str
    dtype: str
    head_dim_v: int | None = None  # v's (and the output's) head dim; None: head_dim's (normalised so)

    def __post_init__(self):
        if self.head_dim_v == self.head_dim:
            object.__setattr__(self, "head_dim_v", None)

    def describe(self) -> str:
        heads = f"{self.q_heads}" if self.q_heads == self.kv_heads else f"{self.q_heads}/{self.kv_heads}"
        dims = f"D={self.head_dim}" if self.head_dim_v is None else f"D={self.head_dim} Dv={self.head_dim_v}"
        return (f"B={self.batch} H={heads} Lq={self.q_len} Lk={self.k_len} {dims} "
                f"{'causal' if self.causal else 'non-causal'} {self.dtype} {self.layout}")

    def to_dict(self) -> dict:
        return {"library": self.library, "batch": self.batch, "q_heads": self.q_heads, "kv_heads": self.kv_heads,
                "q_len": self.q_len, "k_len": self.k_len, "head_dim": self.head_dim, "causal": self.causal,
                "layout": self.layout, "dtype": self.dtype,
                "head_dim_v": self.head_dim if self.head_dim_v is None else self.head_dim_v}


@dataclass(eq=False)  # compared by identity: track() removes exactly its own report
class RoutingReport:
    strict: bool = False
    kernel: str = "hopattn"
    calls: int = 0
    served: int = 0
    modes: Counter = field(default_factory=Counter)  # DIRECT / REPEAT_KV / COPIED -> served calls
    fallbacks: Counter = field(default_factory=Counter)  # reason -> calls sent elsewhere
    shapes: Counter = field(default_factory=Counter)  # (CallShape, reason or None) -> calls
    targets: dict = field(default_factory=dict)  # reason -> where those calls went (SDPA, eager, ...)
    backward: int = 0  # served calls that needed a gradient: the kernel's backward computes it
    deterministic: int = 0  # ... of them, with the deterministic backward

    @property
    def fell_back(self) -> int:
        return sum(self.fallbacks.values())

    def _add(self, shape: CallShape, mode: str | None, reason: str | None, target: str, grad: bool,
             deterministic: bool) -> None:
        self.calls += 1
        self.shapes[(shape, reason)] += 1
        if reason is None:
            self.served += 1
            self.modes[mode] += 1
            self.backward += bool(grad)
            self.deterministic += bool(grad and deterministic)
        else:
            self.fallbacks[reason] += 1
            self.targets[reason] = target

    def summary(self) -> str:
        text = f"{self.calls} attention calls: {self.served} served by {self.kernel}"
        notes = []
        repeated = self.modes.get(REPEAT_KV, 0)
        if repeated:
            notes.append(f"{repeated} after repeating K/V heads")
        if self.backward == self.deterministic > 0:
            notes.append(f"{self.backward} with a gradient through its deterministic backward")
        elif self.backward:
            notes.append(f"{self.backward} with a gradient through its backward" +
                         (f", {self.deterministic} of them deterministic" if self.deterministic else ""))
        if notes:
            text += f" ({'; '.join(notes)})"
        for reason, n in sorted(self.fallbacks.items(), key=lambda kv: (-kv[1], kv[0])):
            text += f"; {n} sent to {self.targets.get(reason, 'SDPA')}: {reason}"
        return text

    def to_dict(self) -> dict:
        """Plain JSON data (the model records store it)."""
        return {"strict": self.strict, "kernel": self.kernel, "calls": self.calls, "served": self.served,
                "modes": dict(sorted(self.modes.items())), "fallbacks": dict(sorted(self.fallbacks.items())),
                "backward": self.backward, "deterministic": self.deterministic}

    def check(self) -> None:
        """Raise RoutingError if this is a strict report and something was not served by the kernel."""
        if not self.strict:
            return
        if self.calls == 0:
            raise RoutingError(f"strict routing: no attention call went through {self.kernel}; is the model "
                               f"switched to it (attn_implementation / set_attention_backend)?")
        if self.fallbacks:
            raise RoutingError(f"strict routing: {self.summary()}", next(iter(self.fallbacks)))


_LOCK = threading.Lock()
_ACTIVE: list[RoutingReport] = []


@contextmanager
def track(strict: bool = False, kernel: str = "hopattn"):
    """Count the attention calls made inside the block; strict=True also refuses every fallback."""
    report = RoutingReport(strict=strict, kernel=kernel)
    with _LOCK:
        _ACTIVE.append(report)
    try:
        yield report
    finally:
        with _LOCK:
            _ACTIVE.remove(report)
    report.check()  # only when the block itself succeeded: a refusal already raised inside


def strict_active() -> bool:
    """Whether some active report demands strict routing."""
    with _LOCK:
        return any(r.strict for r in _ACTIVE)


# CallShapes made lately, by what they are made of: a model makes the same few calls over and over,
# and building one (a frozen dataclass, the dtype's name) costs more than looking it up. They are
# frozen, and reports count them by value, so one instance serves every call of its shape.
_SHAPES_SIZE = 256
_shapes: dict[tuple, CallShape] = {}


def shape_of(library: str, q: torch.Tensor, k: torch.Tensor, causal: bool, layout: str,
             v: torch.Tensor | None = None) -> CallShape:
    """The CallShape of logical BHSD tensors q, k (and v, whose head dim may differ from q's)."""
    causal = bool(causal)
    key = (library, q.shape, k.shape, None if v is None else v.shape[3], causal, layout, q.dtype)
    found = _shapes.get(key)
    if found is None:
        found = CallShape(library=library, batch=q.shape[0], q_heads=q.shape[1], kv_heads=k.shape[1],
                          q_len=q.shape[2], k_len=k.shape[2], head_dim=q.shape[3], causal=causal, layout=layout,
                          dtype=str(q.dtype).removeprefix("torch."), head_dim_v=None if v is None else v.shape[3])
        if len(_shapes) >= _SHAPES_SIZE:
            _shapes.clear()
        _shapes[key] = found
    return found


def record(shape: CallShape, mode: str | None = None, reason: str | None = None, target: str = "SDPA",
           grad: bool = False, deterministic: bool = False) -> None:
    """Count one call in every active report: served (``mode``; ``grad``: with a backward to come,
    ``deterministic``: the bitwise reproducible one) or sent to ``target`` for ``reason``."""
    if not _ACTIVE:  # no report is counting (a list's truth needs no lock)
        return
    with _LOCK:
        reports = list(_ACTIVE)
    for r in reports:
        r._add(shape, mode, reason, target, grad, deterministic)


def needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd would record this call: grad mode on and some input that requires grad."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def sdpa_for_gradients(grad: bool):
    """The context a fallback to torch SDPA runs in. A call that needs a gradient runs without SDPA's
    cuDNN backend: torch 2.11's cuDNN attention backward returns gradients 1.4 (relative) from
    float64 for q, k, v given as BHSD views of BSHD memory (the layout transformers passes) with an
    output gradient laid out like the output (research/accuracy/README.md; the models measured so far
    do not give it that gradient, but a caller's loss can); the flash, memory-efficient and math
    backends are right there.
    Those three keep torch's order of preference and the caller's own switches (one turned off stays
    off); a caller who left SDPA nothing but cuDNN keeps it, as asked. Inference calls keep SDPA's
    choice: its forward is right everywhere."""
    if not grad:
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    enabled = [(SDPBackend.FLASH_ATTENTION, torch.backends.cuda.flash_sdp_enabled()),
               (SDPBackend.EFFICIENT_ATTENTION, torch.backends.cuda.mem_efficient_sdp_enabled()),
               (SDPBackend.MATH, torch.backends.cuda.math_sdp_enabled())]
    allowed = [backend for backend, on in enabled if on]
    return sdpa_kernel(allowed) if allowed else nullcontext()


def wants_deterministic(option: bool | None) -> bool:
    """An integration's ``deterministic`` option at call time: True or False as given, None follows
    torch.use_deterministic_algorithms (torch.are_deterministic_algorithms_enabled())."""
    return torch.are_deterministic_algorithms_enabled() if option is None else bool(option)


def check_deterministic_option(option, kernel) -> None:
    """Refuse, when registering, a ``deterministic`` option that is not a bool or None, or True for
    a kernel that has no deterministic backward (it could only be honoured by falling back)."""
    if option is not None and not isinstance(option, bool):
        raise TypeError(f"deterministic: expected True, False or None (follow torch.use_deterministic_algorithms), "
                        f"got {type(option).__name__}")
    if option and not kernel.deterministic:
        raise ValueError(f"deterministic: {kernel.label or kernel.name} has no deterministic backward; register "
                         f"with deterministic=None to follow torch.use_deterministic_algorithms (calls that need "
                         f"such a gradient then go elsewhere, counted)")


def refuse_or_record(kernel_name: str, shape: CallShape, reason: str, strict: bool, target: str = "SDPA") -> None:
    """A call the kernel cannot serve: raise in strict mode, else count it (the caller runs `target`,
    an implementation that honours every argument of the call)."""
    if strict or strict_active():
        raise RoutingError(
            f"{kernel_name} (strict) cannot serve this {shape.library} attention call [{shape.describe()}]: "
            f"{reason}. Register with strict=False to send such calls to {target}, counted in "
            f"hopattn.integrations.routing.track() reports.", reason)
    record(shape, reason=reason, target=target)


def serve(kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float,
          layout: str, deterministic: bool = False) -> tuple[torch.Tensor, str]:
    """Call ``kernel`` on q, k, v given in ``layout``; returns (out in ``layout``, how it was served).

    K/V heads are repeated only for a kernel without GQA; tensors are copied only when the kernel
    cannot read their strides (or layout) in place. The repeats, copies and transposes are torch
    operations: a gradient flows back through them to the tensors the model gave. ``deterministic``
    reaches a kernel that has a deterministic backward (for any other it is False).
    """
    head_axis = 1 if layout == "bhsd" else 2
    mode = DIRECT
    if k.shape[head_axis] != q.shape[head_axis] and not kernel.gqa:
        groups = q.shape[head_axis] // k.shape[head_axis]
        k, v = (t.repeat_interleave(groups, dim=head_axis) for t in (k, v))
        mode = REPEAT_KV
    run_layout = layout
    if layout not in kernel.layouts:  # an older stage reads BHSD only
        run_layout = kernel.layouts[0]
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if not all(kernel.accepts(t, run_layout) for t in (q, k, v)):
        q, k, v = (t if kernel.accepts(t, run_layout) else t.contiguous() for t in (q, k, v))
        if mode == DIRECT:
            mode = COPIED
    if run_layout != layout and mode == DIRECT:
        mode = COPIED
    out = kernel.call(q, k, v, causal=causal, scale=scale, layout=run_layout,
                      deterministic=bool(deterministic and kernel.deterministic))
    if run_layout != layout:
        out = out.transpose(1, 2)
    return out, mode
