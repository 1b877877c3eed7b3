"""The backward's arms: each stage of kernels/attention_backward (its deterministic mode, where the
stage has one, an arm of its own) and the peers' backwards, FlashAttention-3 and -4 (BSHD) and the
torch SDPA backends cuDNN and FlashAttention-2 (BHSD). A launcher returns (dq, dk, dv); what it times
is the backward alone: each arm's forward runs once, in prepare_backward, outside the events.

A peer that cannot be imported, or whose build has no backward (the FA3 build in shared/tools is
inference-only), is reported missing with the reason, never estimated.
"""

from __future__ import annotations

from bench.arms import Arm, Launch
from bench.peers import FA_HINT, _why
from bench.peers import LABELS as FORWARD_LABELS
from bench.stages import StageArm

ORDER = ("fa3", "fa4", "cudnn", "fa2")  # hopattn.records.results.BACKWARD_PEERS
LABELS = {name: FORWARD_LABELS[name] for name in ORDER}


def forward_for(stages):
    """The forward stage whose out and log-sum-exp a backward stage reads: the last one that returns
    the log-sum-exp (what hopattn.attention runs when a gradient is to come). None if none does."""
    with_lse = [s for s in stages if s.lse]
    return with_lse[-1] if with_lse else None


def _grads(torch, out, leaves, dout):
    """The timed call of a peer: its backward alone, through autograd.

    The forward ran once, in prepare_backward, untimed. retain_graph keeps what it saved (q, k, v, out
    and its log-sum-exp), so every timed call is one whole backward from the same saved tensors: the
    peer's preprocess (D = rowsum(dO∘O)), its main kernel and its dQ postprocess, all that
    loss.backward() runs for attention in training, and no forward inside the events (re-running the
    forward untimed every round would time the very same kernels, at the cost of a forward per
    launch). torch.autograd.grad returns the gradients without accumulating them into .grad, so no
    kernel is timed that the backward itself does not need. The autograd engine's host work (under
    0.1 ms) overlaps the previous launch's GPU time: the timed launches are queued back to back.
    """
    def fn():
        with torch.enable_grad():
            return torch.autograd.grad(out, leaves, dout, retain_graph=True)

    return fn


def _to_bhsd(grads):
    return tuple(g.transpose(1, 2) for g in grads)


class BackwardStageArm(StageArm):
    """A stage of the backward lineage in its default mode or (``deterministic``) its deterministic
    one. Its out and lse come from the forward stage ``forward``, run once per shape and untimed, as
    a training step's forward gives them to its backward."""

    def __init__(self, stage, capability, gpu_name, build_error=None, deterministic=False, forward=None,
                 forward_error=None):
        super().__init__(stage, capability, gpu_name, build_error)
        self.deterministic, self.forward, self.forward_error = deterministic, forward, forward_error
        if deterministic:
            self.label = f"{stage.title} (deterministic mode)"

    @property
    def key(self) -> str:
        return f"stage:{self.name}" + (":deterministic" if self.deterministic else "")

    @property
    def default_key(self) -> str:
        """The key of this stage's default mode (a deterministic entry's speed is also given over it)."""
        return f"stage:{self.name}"

    @property
    def short(self) -> str:
        return f"stage {self.name}" + (" det" if self.deterministic else "")

    def applies(self, shape, causal):
        if self.deterministic and not self.stage.deterministic:
            return ("skipped", "stage has no deterministic mode (stage.toml supports.deterministic = false)")
        pre = super().applies(shape, causal)
        if pre is not None:
            return pre
        f = self.forward
        if f is None:
            return ("failed", "no stage of the forward lineage returns the log-sum-exp the backward reads")
        if f.arch == "sm_90a" and tuple(self.capability) != (9, 0):
            return ("skipped", f"the backward reads out and lse from forward stage {f.id}, which uses sm_90a "
                               f"instructions (Hopper); {self.gpu_name} is {self.capability[0]}.{self.capability[1]}")
        if self.forward_error:
            return ("failed", f"forward stage {f.id} (it gives the backward out and lse): {self.forward_error}")
        return None

    def prepare(self, q, k, v, causal, scale):
        raise TypeError("a backward stage is prepared with prepare_backward(q, k, v, dout, causal, scale)")

    def prepare_backward(self, q, k, v, dout, causal, scale) -> Launch:
        import hopattn
        from hopattn import backward

        number, deterministic, layout = self.stage.number, self.deterministic, self.layout
        if layout == "bshd":  # stored so, read in place (the copies are made here, untimed)
            q, k, v, dout = (t.transpose(1, 2).contiguous() for t in (q, k, v, dout))
        # the forward, once, untimed: the out and lse a training step's backward receives
        out, lse = hopattn.attention(q, k, v, causal=causal, scale=scale, stage=self.forward.number, layout=layout,
                                     return_lse=True)

        def fn():
            return backward.attention_backward(dout, q, k, v, out, lse, causal=causal, scale=scale, layout=layout,
                                               deterministic=deterministic, stage=number)

        return Launch(fn=fn, to_bhsd=_to_bhsd if layout == "bshd" else tuple)


class BackwardFlashAttention(Arm):
    """FlashAttention-3 (`flash_attn_interface`) or -4 (`flash_attn.cute`): flash_attn_func on BSHD
    leaves that require grad, its backward through autograd."""

    MODULES = {"fa3": "flash_attn_interface", "fa4": "flash_attn.cute"}

    def __init__(self, torch, name):
        self.torch, self.name, self.label = torch, name, LABELS[name]
        self.module = self.MODULES[name]
        try:
            func = __import__(self.module, fromlist=["flash_attn_func"]).flash_attn_func
        except Exception as err:  # ImportError, or a broken install raising anything while importing
            self.func, self.missing = None, f"{self.module} is not importable ({_why(err)}); {FA_HINT}"
        else:
            self.func, self.missing = func, None

    def applies(self, shape, causal):
        return ("missing", self.missing) if self.missing else None

    def missing_reason(self, err):
        if "support backward" in str(err).lower():  # "This flash attention build does not support backward."
            return f"this {self.module} build has no backward (inference-only): {_why(err)}"
        return None

    def prepare_backward(self, q, k, v, dout, causal, scale) -> Launch:
        torch = self.torch
        # BSHD leaves made here, outside timing (FlashAttention's native layout); the gradients come back BSHD
        leaves = tuple(t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
        douts = dout.transpose(1, 2).contiguous()
        with torch.enable_grad():
            result = self.func(*leaves, softmax_scale=scale, causal=causal)
        out = result[0] if isinstance(result, (tuple, list)) else result  # (out, lse) or out
        return Launch(fn=_grads(torch, out, leaves, douts), to_bhsd=_to_bhsd)


class BackwardSdpa(Arm):
    """torch.nn.functional.scaled_dot_product_attention restricted to one backend, its backward
    through autograd (the backend is chosen at the forward; its context is entered around the
    backward's launches too)."""

    BACKENDS = {"cudnn": "CUDNN_ATTENTION", "fa2": "FLASH_ATTENTION"}

    def __init__(self, torch, name):
        self.torch, self.name, self.label = torch, name, LABELS[name]
        self.missing = None
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            self.backend = getattr(SDPBackend, self.BACKENDS[name])
            self.sdpa_kernel = sdpa_kernel
        except (ImportError, AttributeError) as err:
            self.missing = f"torch {torch.__version__} has no SDPA backend {self.BACKENDS[name]} ({_why(err)})"

    def applies(self, shape, causal):
        return ("missing", self.missing) if self.missing else None

    def prepare_backward(self, q, k, v, dout, causal, scale) -> Launch:
        torch = self.torch
        sdpa = torch.nn.functional.scaled_dot_product_attention
        backend, sdpa_kernel = self.backend, self.sdpa_kernel
        if self.layout == "bshd":  # BSHD storage, seen as BHSD: what a model with BSHD tensors passes
            q, k, v, dout = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, dout))
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))  # the same memory, as leaves
        extra = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
        if causal and q.shape[2] != k.shape[2]:  # SDPA's is_causal is top-left; the stages' is bottom-right
            from torch.nn.attention.bias import causal_lower_right

            extra["attn_mask"] = causal_lower_right(q.shape[2], k.shape[2])
            causal = False
        with sdpa_kernel([backend]), torch.enable_grad():
            out = sdpa(*leaves, is_causal=causal, scale=scale, **extra)
        return Launch(fn=_grads(torch, out, leaves, dout), context=lambda: sdpa_kernel([backend]))


def make_backward_peers(torch, names) -> list[Arm]:
    """The backward peers named (some of ORDER), in ORDER."""
    unknown = [n for n in names if n not in ORDER]
    if unknown:
        raise ValueError(f"no backward peer {unknown[0]!r}; expected some of {', '.join(ORDER)}")
    return [BackwardFlashAttention(torch, n) if n in BackwardFlashAttention.MODULES else BackwardSdpa(torch, n)
            for n in ORDER if n in names]


def make_backward_stage_arms(stages, capability, gpu_name, build_errors, modes=(False, True), forward=None,
                             forward_error=None) -> list[Arm]:
    """An arm per stage and mode: the default mode (False in ``modes``) and, for the stages that have
    one, the deterministic mode (True in ``modes``), each an entry of its own."""
    return [BackwardStageArm(s, capability, gpu_name, build_errors.get(s.number), deterministic=mode,
                             forward=forward, forward_error=forward_error)
            for s in stages for mode in modes if not mode or s.deterministic]
