"""The peers, each called in its native layout: FlashAttention-3 and -4 (BSHD), torch SDPA backends
and FlexAttention (BHSD). A peer that cannot be imported is reported missing, never estimated. The
shapes beyond 4k/8k/16k (bench.shapes.USER_SHAPES) run on the reference peers only: FA3, FA4, cuDNN."""

from __future__ import annotations

from bench.arms import Arm, Launch
from bench.shapes import is_user_shape

LABELS = {
    "fa3": "FlashAttention-3 (Hopper, C++)",
    "fa4": "FlashAttention-4 (CuTe DSL)",
    "cudnn": "cuDNN (torch SDPA)",
    "fa2": "FlashAttention-2 (torch SDPA flash)",
    "flex": "FlexAttention (torch.compile, Triton)",
    "efficient": "memory-efficient (torch SDPA)",
}
ORDER = ("fa3", "fa4", "cudnn", "fa2", "flex", "efficient")
REFERENCE_PEERS = ("fa3", "fa4", "cudnn")  # the ones the stages are compared with, on every shape
FA_HINT = "see shared/tools/peers-on-gpu-machine.md for getting it onto the GPU machine"
USERS_ONLY_REFERENCES = ("skipped", "the shapes beyond 4k/8k/16k run on the reference peers (FA3, FA4, cuDNN) only")


def _why(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:300] if lines else ''}".rstrip(": ")


class FlashAttention(Arm):
    """FlashAttention-3 (`flash_attn_interface`, the Hopper C++ build) or -4 (`flash_attn.cute`):
    BSHD, K/V with fewer heads read as they are (grouped-query)."""

    MODULES = {"fa3": "flash_attn_interface", "fa4": "flash_attn.cute"}

    def __init__(self, torch, name):
        self.torch, self.name, self.label = torch, name, LABELS[name]
        try:
            module = __import__(self.MODULES[name], fromlist=["flash_attn_func"])
            func = module.flash_attn_func
        except Exception as err:  # ImportError, or a broken install raising anything while importing
            self.func, self.missing = None, f"{self.MODULES[name]} is not importable ({_why(err)}); {FA_HINT}"
        else:
            self.func, self.missing = func, None

    def applies(self, shape, causal):
        return ("missing", self.missing) if self.missing else None

    def prepare(self, q, k, v, causal, scale):
        # BSHD copies made here, outside timing: FA4's native layout
        qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        func = self.func

        def first(result):
            return result[0] if isinstance(result, (tuple, list)) else result  # (out, lse)

        return Launch(fn=lambda: func(qs, ks, vs, softmax_scale=scale, causal=causal),
                      to_bhsd=lambda result: first(result).transpose(1, 2))


class Sdpa(Arm):
    """torch.nn.functional.scaled_dot_product_attention restricted to one backend."""

    BACKENDS = {"cudnn": "CUDNN_ATTENTION", "fa2": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}

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
        if self.missing:
            return ("missing", self.missing)
        return USERS_ONLY_REFERENCES if is_user_shape(shape) and self.name not in REFERENCE_PEERS else None

    def prepare(self, q, k, v, causal, scale):
        sdpa = self.torch.nn.functional.scaled_dot_product_attention
        backend, sdpa_kernel = self.backend, self.sdpa_kernel
        if self.layout == "bshd":  # BSHD storage, seen as BHSD: what a model with BSHD tensors passes
            q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
        extra = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
        if causal and q.shape[2] != k.shape[2]:
            # SDPA's is_causal is aligned top-left; the stages (and FlashAttention) align bottom-right:
            # the same function needs the lower-right causal bias
            from torch.nn.attention.bias import causal_lower_right

            extra["attn_mask"] = causal_lower_right(q.shape[2], k.shape[2])
            causal = False
        return Launch(fn=lambda: sdpa(q, k, v, is_causal=causal, scale=scale, **extra),
                      context=lambda: sdpa_kernel([backend]))


class Flex(Arm):
    name = "flex"
    label = LABELS["flex"]
    _compiled = None

    def __init__(self, torch):
        self.torch = torch
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except ImportError as err:
            self.missing = f"torch {torch.__version__} has no FlexAttention ({_why(err)})"
            return
        self.missing = None
        self.create_block_mask = create_block_mask
        self.flex_attention = flex_attention

    def applies(self, shape, causal):
        if self.missing:
            return ("missing", self.missing)
        return USERS_ONLY_REFERENCES if is_user_shape(shape) else None

    def compiled(self):
        if self._compiled is None:
            dynamo = self.torch._dynamo.config
            for knob in ("recompile_limit", "cache_size_limit"):  # one static compile per shape and mask
                if hasattr(dynamo, knob):
                    setattr(dynamo, knob, max(getattr(dynamo, knob), 64))
            # dynamic=False: a kernel specialised to each shape, as a model with fixed lengths would get
            self._compiled = self.torch.compile(self.flex_attention, dynamic=False)
        return self._compiled

    def prepare(self, q, k, v, causal, scale):
        block_mask = None
        if causal:
            # built here, outside timing, as a model would build it once per sequence length
            block_mask = self.create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, q.shape[2], k.shape[2],
                                                device=q.device)
        flex = self.compiled()
        return Launch(fn=lambda: flex(q, k, v, block_mask=block_mask, scale=scale))


def make_peers(torch, names) -> list[Arm]:
    out = []
    for name in names:
        if name in FlashAttention.MODULES:
            out.append(FlashAttention(torch, name))
        elif name == "flex":
            out.append(Flex(torch))
        else:
            out.append(Sdpa(torch, name))
    return out
