"""hopattn as a diffusers attention backend (diffusers 0.42).

    from hopattn.integrations import diffusers as hop
    hop.register()                                    # once: "hopattn" becomes an attention backend
    pipe.transformer.set_attention_backend("hopattn")  # or: with attention_backend("hopattn"): pipe(...)

diffusers' models call ``dispatch_attention_fn`` (diffusers.models.attention_dispatch) with BSHD
query/key/value; it looks the backend up in ``_AttentionBackendRegistry`` by an
``AttentionBackendName`` member. The registry's own ``register`` decorator takes the function; the
name has to be a member of that enum, which lists diffusers' built-in backends only, so ``register``
adds a member for ``name`` (a str-valued Enum member like the others) before registering the
function under it. ``set_attention_backend`` and ``attention_backend`` then accept the name.

The tensors are passed to the kernel in place (layout "bshd"), at every head dim the final forward
stage serves (its supports.head_dims: 64 as SD3's, CogVideoX's and LTX-2's audio attention, 128,
256, ...; v's head dim may differ from q's where the stage serves the pair, and the output has v's).
Calls it cannot serve (a padding mask, a head dim the stage does not serve, fp16/fp32, dropout,
context parallelism) go to diffusers' native SDPA backend with every argument the model passed, and
are counted (strict=False) or raise RoutingError (strict=True).

Training: a call that needs a gradient (a transformer whose parameters require grad, grad mode on)
is served where hopattn's backward serves its head dim (128; at another, "gradient needed at head
dim N ..." sends it to the native backend, whose gradient it gets, run without SDPA's cuDNN
backend: ``routing.sdpa_for_gradients``), and its gradients come from hopattn's backward. ``register(deterministic=True)`` gives gradients identical bit for bit run to
run; None (default) follows ``torch.use_deterministic_algorithms``. Double backward is not
supported (the second backward raises, see hopattn.integrations.transformers).

``unregister`` takes the name out of ``AttentionBackendName`` again, so ``set_attention_backend``
refuses it with diffusers' own error; a model that was switched to it before keeps a backend that
raises an error naming the fix.
"""

from __future__ import annotations

import math

from . import masks, routing
from .kernels import Kernel, hopattn_kernel

LIBRARY = "diffusers"
NATIVE = "diffusers' native backend"


def backend_name(name: str):
    """The ``AttentionBackendName`` member whose value is ``name``, added to the enum if missing."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    return _add_member(AttentionBackendName, name)


def _add_member(enum_cls, value: str):
    """A member of the str-valued Enum ``enum_cls`` with ``value`` (name: value upper-cased), added
    as EnumType adds a member declared in the class body: found by value, by name and in iteration."""
    if value in enum_cls._value2member_map_:
        return enum_cls._value2member_map_[value]
    member = str.__new__(enum_cls, value)
    member._name_, member._value_ = value.upper(), value
    member.__objclass__ = enum_cls
    enum_cls._member_map_[member._name_] = member
    enum_cls._value2member_map_[value] = member
    enum_cls._member_names_.append(member._name_)
    return member


def register(strict: bool = False, kernel: Kernel | None = None, name: str = "hopattn",
             deterministic: bool | None = None) -> str:
    """Make the diffusers attention backend ``name`` route to ``kernel`` (default: hopattn's final
    stage). ``deterministic``: True, gradients identical bit for bit run to run; False, the faster
    backward; None (default), as ``torch.use_deterministic_algorithms`` says. Returns ``name``;
    registering again replaces the earlier function."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    kernel = kernel or hopattn_kernel()
    routing.check_deterministic_option(deterministic, kernel)
    # No constraints: the backend checks its inputs itself, and falls back or refuses with a reason.
    _AttentionBackendRegistry.register(backend_name(name), constraints=[])(make_backend(kernel, strict,
                                                                                        deterministic))
    return name


def unregister(name: str = "hopattn") -> None:
    from diffusers.models.attention_dispatch import AttentionBackendName as Names
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry as registry

    member = Names._value2member_map_.get(name)
    if member is None:
        return
    # Attention processors keep the member they were set to: their next call gets this error, not a
    # bare KeyError from the registry.
    registry.register(member, constraints=[])(_unregistered(name))
    registry._supports_context_parallel.discard(member.value)
    if registry._active_backend == member:
        registry._active_backend = Names.NATIVE
    _remove_member(Names, member)


def _unregistered(name: str):
    def attention(**kwargs):
        raise RuntimeError(f"the diffusers attention backend {name!r} was unregistered "
                           f"(hopattn.integrations.diffusers.unregister()); switch the model to another backend "
                           f"(model.set_attention_backend('native')) or register it again "
                           f"(hopattn.integrations.diffusers.register())")
    return attention


def _remove_member(enum_cls, member) -> None:
    """Undo _add_member: the value is no longer found by value, by name or in iteration."""
    enum_cls._value2member_map_.pop(member._value_, None)
    enum_cls._member_map_.pop(member._name_, None)
    if member._name_ in enum_cls._member_names_:
        enum_cls._member_names_.remove(member._name_)


def make_backend(kernel: Kernel, strict: bool, deterministic: bool | None = None):
    """The backend function dispatch_attention_fn calls (only the parameters it names are passed)."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    def native(**kwargs):  # looked up per call: diffusers' own SDPA backend as registered now
        return _AttentionBackendRegistry._backends[AttentionBackendName.NATIVE](**kwargs)

    # The kernel's verdict on a call depends on its tensors' shapes, dtypes and device and on the call's
    # flags, not on the data: kept per those (as contract.check_call keeps its own), it spares each
    # call the BHSD views, the CallShape lookup and kernel.unsupported (research/host_cost.md).
    verdicts: dict[tuple, tuple[routing.CallShape, str | None]] = {}

    def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
                  return_lse=False, _parallel_config=None):
        causal, keys, reason = _plan(query, key, attn_mask, dropout_p, is_causal, return_lse, _parallel_config)
        grad = routing.needs_grad(query, key, value)
        exact = routing.wants_deterministic(deterministic)
        # the keys the kernel reads (a top-left causal mask drops those no query sees); a fallback gets
        # the model's own key and value, with its mask
        k_run, v_run = (key, value) if keys == key.shape[1] else (key[:, :keys], value[:, :keys])
        seen = (query.shape, k_run.shape, v_run.shape, query.dtype, k_run.dtype, v_run.dtype, query.device, causal,
                grad, exact)
        verdict = verdicts.get(seen)
        if verdict is None:
            q_bhsd, k_bhsd, v_bhsd = (t.transpose(1, 2) for t in (query, k_run, v_run))
            verdict = (routing.shape_of(LIBRARY, q_bhsd, k_bhsd, causal, "bshd", v=v_bhsd),
                       kernel.unsupported(q_bhsd, k_bhsd, v_bhsd, causal, grad=grad, deterministic=exact))
            if len(verdicts) >= 256:
                verdicts.clear()
            verdicts[seen] = verdict
        shape = verdict[0]
        reason = reason or verdict[1]
        if reason is None and scale is not None and not (math.isfinite(scale) and scale > 0):
            reason = f"scale {scale} (the kernel takes a positive scale)"
        if reason is not None:
            routing.refuse_or_record(kernel.name, shape, reason, strict, target=NATIVE)
            with routing.sdpa_for_gradients(grad):  # not cuDNN's backward: see routing.sdpa_for_gradients
                return native(query=query, key=key, value=value, attn_mask=attn_mask, dropout_p=dropout_p,
                              is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, return_lse=return_lse,
                              _parallel_config=_parallel_config)
        scale = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
        out, mode = routing.serve(kernel, query, k_run, v_run, causal=causal, scale=scale, layout="bshd",
                                  deterministic=exact)
        routing.record(shape, mode=mode, grad=grad, deterministic=exact)
        return out

    attention.__name__ = f"{kernel.name}_diffusers_backend"
    return attention


def _plan(query, key, mask, dropout_p, is_causal, return_lse, parallel) -> tuple[bool, int, str | None]:
    """(causal, keys to keep, reason the call cannot be served or None) for BSHD query/key."""
    q_len, k_len = query.shape[1], key.shape[1]
    if return_lse:
        return is_causal, k_len, "log-sum-exp requested (return_lse)"
    if parallel is not None:
        return is_causal, k_len, "context parallelism"
    if dropout_p:
        return is_causal, k_len, f"dropout {dropout_p} (the kernel has none)"
    view = None
    if mask is not None and mask.dim() in (2, 3):
        # [B, Lk] key padding or [B, Lq, Lk]: the [B, H, Lq, Lk] broadcast the native backend uses
        # (a new view every call: the verdict is remembered for the model's own mask)
        view = mask[:, None, None, :] if mask.dim() == 2 else mask[:, None]
    verdict = masks.classify(mask, q_len, k_len, view=view)
    if verdict == masks.OTHER:
        return is_causal, k_len, "attention mask (padding or another pattern than causal)"
    if verdict == masks.CAUSAL:
        return True, k_len, None
    if is_causal:  # torch SDPA's is_causal, which the native backend uses, is top-left aligned
        keys, reason = masks.top_left_causal(q_len, k_len)
        return True, keys or k_len, reason
    return False, k_len, None
