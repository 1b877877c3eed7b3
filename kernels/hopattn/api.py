"""The Python API: ``attention(q, k, v, *, causal=False, scale=None, stage=None, layout="bhsd", out=None)``.

The launch goes through torch custom ops (``torch.ops.hopattn.attention`` and ``attention_out``), so
``torch.compile`` (fullgraph) and CUDA graphs can take calls to it. Both ops, and so this function,
check every input through ``contract`` before anything is launched: a bad input raises an error
that names the argument and what was expected, whichever entry point it came through.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import torch

from . import backward, build, contract, lineage

HEAD_DIM = contract.HEAD_DIM
attention_backward = backward.attention_backward
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
        return table[max(table)]  # final_stage()
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in table:
        raise ValueError(f"stage: expected {contract.stage_choices(table)}, got {stage!r}")
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


@lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@lru_cache(maxsize=None)  # per device: it never changes, and asking costs host time in every call
def _device_capability(device: torch.device) -> tuple[int, int, str]:
    return (*torch.cuda.get_device_capability(device), torch.cuda.get_device_name(device))


def _check_device_supports(s: lineage.Stage, device: torch.device) -> None:
    major, minor, name = _device_capability(device)
    if s.arch == "sm_90a" and (major, minor) != (9, 0):
        raise RuntimeError(f"stage: stage {s.id} uses sm_90a instructions (wgmma, setmaxnreg), which only "
                           f"Hopper (compute capability 9.0) has; {name} is {major}.{minor}")
    if s.arch == "sm_80" and major < 8:
        raise RuntimeError(f"stage: stage {s.id} needs compute capability 8.0 or newer; {name} is {major}.{minor}")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: float | None = None, stage: int | None = None, layout: str = "bhsd",
              out: torch.Tensor | None = None, return_lse: bool = False, deterministic: bool = False,
              backward_stage: int | None = None):
    """softmax(scale · q kᵀ) v for bf16 CUDA tensors, differentiable in q, k and v (at head dim 128).

    Layouts: ``layout="bhsd"``: q [B, H, Lq, D], k [B, H, Lk, D] and v [B, H, Lk, Dv];
    ``layout="bshd"`` (stages 17 on): q [B, Lq, H, D], k [B, Lk, H, D], v [B, Lk, H, Dv]. Head dims:
    D = Dv = 128 on stages 01-23; stage 24 on, the stage's supports.head_dims (64, 96, 128, 256, and
    D 192 with Dv 128, DeepSeek's MLA prefill); a head dim the stage does not serve is refused with
    an error naming the stage that does. The backward is head dim 128 only. Stages 17 on read any strides whose
    head-dim axis is contiguous and whose other strides are multiples of 8 elements (16 bytes):
    slices of wider tensors, packed qkv views, BSHD, all in place; stages 01-16 need contiguous
    BHSD. Every data pointer must be 16-byte aligned.

    ``causal``: bottom-right aligned, as FlashAttention: query i sees keys j <= i + Lk - Lq. A query
    that sees no key (causal with Lq > Lk, or Lk = 0) gets an output of 0. Empty batch, heads or
    queries give an empty result.

    ``scale`` (positive) defaults to 1/sqrt(D); ``stage`` to the final stage. Grouped-query and
    multi-query attention: on stages with ``gqa`` (20 on), k and v may have fewer heads than q, a
    divisor of q's; query head h reads K/V head h // (H_q / H_kv), as torch's SDPA with
    enable_gqa=True. Earlier stages refuse such inputs with an error that names the fix.

    Returns a new tensor shaped like q with v's head dim (contiguous), or writes into ``out`` (that
    shape, laid out as the stage can write, sharing no memory with q, k or v) and returns it. With
    ``return_lse=True`` (stages with ``lse``, 20 on; not with ``out``) it returns ``(out, lse)``,
    lse the natural log-sum-exp of each row's scaled scores, fp32 [B, H_q, Lq] (-inf for a row that
    sees no key).

    Gradients: when q, k or v require grad, the forward keeps its log-sum-exp and ``.backward()``
    runs the backward lineage (``hopattn.backward``; ``backward_stage`` picks a stage of it, default
    its final one) — lse included, when the loss used it. At a head dim the backward does not serve
    the forward runs and ``.backward()`` raises the backward's error naming what it serves
    (hopattn.integrations send such calls to SDPA instead). ``deterministic=True``: gradients identical
    bit for bit run to run (no atomics in the backward). ``out=`` refuses inputs that require grad
    while grad mode is on (a result written in place would carry no gradient).
    """
    # The op's schema would refuse a wrong type too, with the dispatcher's wording; these say what to pass.
    spec = _stage(stage)
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    if not isinstance(layout, str):
        raise TypeError(f"layout: expected 'bhsd' or 'bshd', got {type(layout).__name__}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse: expected a bool, got {type(return_lse).__name__}")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic: expected a bool, got {type(deterministic).__name__}")
    backward._stage(backward_stage)
    contract.check_scale(scale)
    T = torch.Tensor
    needs_grad = torch.is_grad_enabled() and ((isinstance(q, T) and q.requires_grad) or
                                              (isinstance(k, T) and k.requires_grad) or
                                              (isinstance(v, T) and v.requires_grad))
    if return_lse or (needs_grad and out is None):
        if out is not None:
            raise ValueError("return_lse: not with out= (the log-sum-exp comes with a new output tensor)")
        # With a gradient to come, the forward keeps the log-sum-exp the backward recomputes P from.
        result = torch.ops.hopattn.attention_lse(q, k, v, causal, scale, stage, layout, deterministic, backward_stage)
        return result if return_lse else result[0]
    if out is None:
        if not needs_grad and type(q) is T and type(k) is T and type(v) is T and _plain_eager(q):
            return _forward(q, k, v, causal, scale, spec, layout)  # what the op's dispatch would run
        return torch.ops.hopattn.attention(q, k, v, causal, scale, stage, layout, deterministic, backward_stage)
    if needs_grad:
        raise RuntimeError("out: a result written into out= carries no gradient, which would drop it silently; "
                           "leave out unset to train through hopattn.attention, or call it under torch.no_grad() "
                           "(or torch.inference_mode())")
    torch.ops.hopattn.attention_out(q, k, v, out, causal, scale, stage, layout)
    return out


def _checked(q, k, v, out, causal, scale, stage, layout, lse=False) -> contract.Call:
    return contract.check_call(q, k, v, causal=causal, scale=scale, stage=_stage(stage), layout=layout, out=out,
                               lse=lse, lineage=_stages())


def _run(call: contract.Call, q, k, v, out, lse=None, fresh_out: bool = False) -> None:
    """The real implementation behind the ops: pointer checks, the empty cases, then the launch.
    ``fresh_out``: out (and lse) were allocated for this call, so they share no memory with q, k, v."""
    contract.check_memory(call, q, k, v, out, fresh_out)
    if call.batch == 0 or call.heads == 0 or call.len_q == 0:  # call.nothing_to_compute
        return
    if call.len_k == 0:  # call.no_keys: every row sees no key
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return
    s = call.stage
    device = q.device
    _check_device_supports(s, device)
    lib = _library(s.number)
    # torch.cuda.device(device) and torch.cuda.current_stream(device), without their Python objects:
    # the same device switch and the same stream, a few µs less per call.
    index = device.index
    previous = torch.cuda._exchange_device(index)
    try:
        lib.launch_prepared(_prepared(call, lib, q, k, v, out, _sm_count(device)), q.data_ptr(), k.data_ptr(),
                            v.data_ptr(), out.data_ptr(), 0 if lse is None else lse.data_ptr(),
                            torch._C._cuda_getCurrentRawStream(index))
    finally:
        torch.cuda._maybe_exchange_device(previous)


def _prepared(call: contract.Call, lib, q, k, v, out, sms: int):
    """The launch's arguments but for its pointers, converted by the binding once per (library, SM count,
    strides of q, k, v and out) of a checked call; the shapes are the call's. Passing them every call
    cost the binding's argument conversion, most of its time (research/host_cost.md)."""
    key = (lib, sms, q.stride(), k.stride(), v.stride(), out.stride())
    found = call._prepared.get(key)
    if found is None:
        found = lib.prepare(call.strides(q), call.strides(k), call.strides(v), call.strides(out), call.batch,
                            call.heads, call.len_q, call.len_k, call.head_dim, call.scale, call.causal, sms,
                            call.kv_heads)
        if len(call._prepared) < 16:  # a call meets few stride patterns; more are converted each time
            call._prepared[key] = found
    return found


def _reset_caches() -> None:
    """Forget the checked calls (research/host_cost.py, when it stubs the device checks and after)."""
    contract.clear_caches()


def _new_out(q: torch.Tensor, call: contract.Call) -> torch.Tensor:
    """Shaped like q with v's head dim (the last axis), contiguous."""
    return q.new_empty((*q.shape[:3], call.head_dim_v))


def _new_lse(q: torch.Tensor, call: contract.Call) -> torch.Tensor:
    return torch.empty((call.batch, call.heads, call.len_q), dtype=torch.float32, device=q.device)


# deterministic and backward_stage change nothing in the forward: they are the backward's, which
# autograd reaches through the op's inputs.
def _attention_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None, stage: int | None = None, layout: str = "bhsd",
                    deterministic: bool = False, backward_stage: int | None = None) -> torch.Tensor:
    return _forward(q, k, v, causal, scale, _stage(stage), layout)


def _forward(q, k, v, causal, scale, spec: lineage.Stage, layout) -> torch.Tensor:
    """The op's implementation for a stage already looked up (the direct eager path has done so)."""
    call = contract.check_call(q, k, v, causal=causal, scale=scale, stage=spec, layout=layout, lineage=_stages())
    out = _new_out(q, call)
    _run(call, q, k, v, out, fresh_out=True)
    return out


_attention_op = torch.library.custom_op("hopattn::attention", mutates_args=())(_attention_impl)

# The device types whose eager calls may run the op's implementation directly (research/host_cost.py adds "cpu").
DIRECT_DEVICE_TYPES = ("cuda",)


def _plain_eager(q: torch.Tensor) -> bool:
    """Whether torch.ops.hopattn.attention, called now on plain tensors of q's device that need no
    gradient, would do nothing but run _attention_impl: no torch.compile, jit trace or functorch
    transform (vmap, grad) is tracing, no torch function or dispatch mode (FakeTensorMode, a
    FlopCounter, ...) is active, no profiler is recording (it shows the op), and no kernel of the
    op was replaced or disabled (torch.library's register_kernel, register_torch_dispatch, ...).
    Then the op's dispatch — ~10 µs of torch's Python per call — is skipped; anything else takes it."""
    C = torch._C
    op = _attention_op
    try:  # torch's private state: a torch without one of these takes the op's dispatch, as before
        return (q.device.type in DIRECT_DEVICE_TYPES and not torch.compiler.is_compiling()
                and C._len_torch_function_stack() == 0 and C._len_torch_dispatch_stack() == 0
                and C._functorch.peek_interpreter_stack() is None and C._get_tracing_state() is None
                and not C._autograd._profiler_enabled() and len(op._backend_fns) == 1 and not op._torch_dispatch_fns
                and not op._disabled_kernel and op._vmap_fn is None and not _autocast_registered(op))
    except AttributeError:
        return False


def _autocast_registered(op) -> bool:
    """Whether an autocast rule was registered on the op (torch.library.register_autocast). Torch
    keeps it under a name that changed between versions (2.13: ``_autocast_dtype``, a dict per device
    type; 2.11 has no such attribute, and the H200 machine's torch 2.11 made the direct path
    unreachable until this read every ``_autocast*`` attribute instead). The names are those the op
    had when first asked (torch's constructor sets them all), kept per op; None of them set: no rule."""
    entry = _AUTOCAST_NAMES.get(id(op))
    if entry is None or entry[0] is not op:  # (an id can be reused once its object is gone)
        entry = _AUTOCAST_NAMES[id(op)] = (op, tuple(n for n in vars(op) if n.startswith("_autocast")))
    for name in entry[1]:
        if getattr(op, name):
            return True
    return False


_AUTOCAST_NAMES: dict[int, tuple[object, tuple[str, ...]]] = {}


@_attention_op.register_fake
def _(q, k, v, causal=False, scale=None, stage=None, layout="bhsd", deterministic=False, backward_stage=None):
    return _new_out(q, _checked(q, k, v, None, causal, scale, stage, layout))


@torch.library.custom_op("hopattn::attention_lse", mutates_args=())
def _attention_lse_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                      scale: float | None = None, stage: int | None = None, layout: str = "bhsd",
                      deterministic: bool = False,
                      backward_stage: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    call = _checked(q, k, v, None, causal, scale, stage, layout, lse=True)
    out, lse = _new_out(q, call), _new_lse(q, call)
    _run(call, q, k, v, out, lse, fresh_out=True)
    return out, lse


@_attention_lse_op.register_fake
def _(q, k, v, causal=False, scale=None, stage=None, layout="bhsd", deterministic=False, backward_stage=None):
    call = _checked(q, k, v, None, causal, scale, stage, layout, lse=True)
    return _new_out(q, call), _new_lse(q, call)


@torch.library.custom_op("hopattn::attention_out", mutates_args=("out",))
def _attention_out_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, causal: bool = False,
                      scale: float | None = None, stage: int | None = None, layout: str = "bhsd") -> None:
    call = _checked(q, k, v, out, causal, scale, stage, layout)
    _run(call, q, k, v, out)


@_attention_out_op.register_fake
def _(q, k, v, out, causal=False, scale=None, stage=None, layout="bhsd"):
    _checked(q, k, v, out, causal, scale, stage, layout)


# --- autograd: the backward lineage behind both forward ops --------------------------------------

_SAVED_ARGS = ("causal", "scale", "layout", "deterministic", "backward_stage")


def _setup(ctx, inputs, output) -> None:
    q, k, v, causal, scale, _stage_arg, layout, deterministic, backward_stage = _with_defaults(inputs)
    out, lse = (output, None) if isinstance(output, torch.Tensor) else output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.args = dict(zip(_SAVED_ARGS, (causal, scale, layout, deterministic, backward_stage)))


def _with_defaults(inputs) -> tuple:
    defaults = (False, None, None, "bhsd", False, None)  # causal, scale, stage, layout, deterministic, backward_stage
    return tuple(inputs) + defaults[len(inputs) - 3:]


def _backward_of_out(ctx, dout):
    q, k, v, out, _ = ctx.saved_tensors
    a = ctx.args
    # The op without the log-sum-exp (called directly, or under torch.no_grad() and differentiated
    # later): the final forward stage computes it again, one extra forward, the same gradient.
    _, lse = torch.ops.hopattn.attention_lse(q, k, v, a["causal"], a["scale"], None, a["layout"])
    return _grads(ctx, dout, None, q, k, v, out, lse)


def _backward_of_out_lse(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    return _grads(ctx, dout, dlse, q, k, v, out, lse)


def _grads(ctx, dout, dlse, q, k, v, out, lse):
    a = ctx.args
    if dout is None:  # only lse reached the loss
        dout = torch.zeros_like(out)
    dq, dk, dv = torch.ops.hopattn.attention_backward(dout, q, k, v, out, lse, dlse, a["causal"], a["scale"],
                                                      a["layout"], a["deterministic"], a["backward_stage"])
    # One gradient per input of the op: q, k, v, then none for its other arguments.
    return dq, dk, dv, None, None, None, None, None, None


torch.library.register_autograd("hopattn::attention", _backward_of_out, setup_context=_setup)
torch.library.register_autograd("hopattn::attention_lse", _backward_of_out_lse, setup_context=_setup)
