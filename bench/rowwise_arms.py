"""The arms of the RMSNorm benchmark (python -m bench.rowwise): each a launcher over preallocated
inputs and outputs, or the reason it cannot run here. The stages of kernels/rmsnorm; the copy
ceiling (the same bytes read and written by torch's device-to-device copy); eager
torch.nn.functional.rms_norm; torch.compile of it; Liger (liger_kernel, Triton) and QuACK (quack,
CuTe DSL) where importable."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

PEERS = ("eager", "compile", "liger", "quack")


@dataclass
class Arm:
    key: str                       # "stage 05", "copy", "eager", ...
    kind: str                      # stage, ceiling, peer
    launch: Callable[[], object] | None
    output: Callable[[], object] | None = None  # the output of the last launch (None: not checkable)
    reason: str | None = None      # why launch is None
    variant: str | None = None     # which kernel configuration ran (stages)


def stage_arm(torch, rmsnorm, number: int, x, w, eps: float) -> Arm:
    out, rstd = torch.empty_like(x), torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    info = rmsnorm.stage_info(number, x.shape[-1], x.dtype)
    return Arm(f"stage {number:02d}", "stage", lambda: rmsnorm._rms_norm_into(x, w, eps, out, rstd, stage=number),
               lambda: out, variant=info["variant"])


def copy_arm(torch, x) -> Arm:
    out = torch.empty_like(x)
    return Arm("copy", "ceiling", lambda: out.copy_(x), None)


def peer_arm(torch, name: str, x, w, eps: float) -> Arm:
    """One peer, ready to launch, or an Arm with the reason it cannot run."""
    import torch.nn.functional as F

    cols = x.shape[-1]
    result = {}

    def keep(fn):
        def run():
            value = fn()
            result["out"] = value[0] if isinstance(value, tuple) else value
        return run

    try:
        if name == "eager":
            fn = keep(lambda: F.rms_norm(x, (cols,), w, eps))
        elif name == "compile":
            compiled = torch.compile(lambda a, b: F.rms_norm(a, (cols,), b, eps), dynamic=False, fullgraph=True)
            fn = keep(lambda: compiled(x, w))
        elif name == "liger":
            from liger_kernel.transformers.functional import liger_rms_norm

            fn = keep(lambda: liger_rms_norm(x, w, eps))
        elif name == "quack":
            from quack.rmsnorm import rmsnorm as quack_rmsnorm

            fn = keep(lambda: quack_rmsnorm(x, w, eps=eps))
        else:
            raise ValueError(f"unknown peer {name!r}; expected one of {', '.join(PEERS)}")
    except ImportError as err:
        return Arm(name, "peer", None, reason=f"not importable: {err}")
    return Arm(name, "peer", fn, lambda: result.get("out"))
