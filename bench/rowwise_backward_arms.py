"""The arms of the RMSNorm backward benchmark (python -m bench.rowwise_backward): each a launcher of one
backward over preallocated inputs and outputs, or the reason it cannot run here. The stages of
kernels/rmsnorm_backward (dx and dw, the partial sum included); the copy ceiling (torch's
device-to-device copy of as many bytes as the backward moves: x and dy read, dx written); and the
backward of eager torch.nn.functional.rms_norm, of torch.compile of it, of Liger (liger_kernel,
Triton) and of QuACK (quack, CuTe DSL) where importable, each the autograd graph of its own forward
differentiated again and again (torch.autograd.grad with retain_graph): the backward alone, as a
training step runs it."""

from __future__ import annotations

from bench.rowwise_arms import Arm

PEERS = ("eager", "compile", "liger", "quack")


def stage_arm(torch, rmsnorm, number: int, x, w, dy, rstd) -> Arm:
    dx, dw = torch.empty_like(x), torch.empty_like(w)
    need = rmsnorm.backward_workspace_bytes(dy, x, w, rstd, None, dx, True, number)
    workspace = torch.empty(max(1, need // 4), dtype=torch.float32, device=x.device)
    info = rmsnorm.backward_stage_info(number, x.shape[-1], x.dtype, x.shape[0])
    return Arm(f"stage {number:02d}", "stage",
               lambda: rmsnorm._rms_norm_backward_into(dy, x, w, rstd, None, dx, dw, workspace, stage=number),
               lambda: (dx, dw), variant=info["variant"])


def copy_arm(torch, x) -> Arm:
    """A copy of 1.5 times x's bytes: reads and writes what the backward reads (x, dy) and writes (dx)."""
    src = torch.empty(x.numel() * x.element_size() * 3 // 2, dtype=torch.uint8, device=x.device)
    out = torch.empty_like(src)
    return Arm("copy", "ceiling", lambda: out.copy_(src), None)


def peer_arm(torch, name: str, x, w, dy, eps: float) -> Arm:
    """One peer's backward, ready to launch, or an Arm with the reason it cannot run."""
    import torch.nn.functional as F

    cols = x.shape[-1]
    try:
        if name == "eager":
            forward = lambda a, b: F.rms_norm(a, (cols,), b, eps)  # noqa: E731
        elif name == "compile":
            forward = torch.compile(lambda a, b: F.rms_norm(a, (cols,), b, eps), dynamic=False, fullgraph=True)
        elif name == "liger":
            from liger_kernel.transformers.functional import liger_rms_norm

            def forward(a, b):
                try:
                    return liger_rms_norm(a, b, eps, in_place=False)  # in place, its dx would overwrite dy
                except TypeError:
                    return liger_rms_norm(a, b, eps)
        elif name == "quack":
            from quack.rmsnorm import rmsnorm as quack_rmsnorm

            forward = lambda a, b: quack_rmsnorm(a, b, eps=eps)  # noqa: E731
        else:
            raise ValueError(f"unknown peer {name!r}; expected one of {', '.join(PEERS)}")
    except ImportError as err:
        return Arm(name, "peer", None, reason=f"not importable: {err}")
    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    state = {}

    def launch():  # the first call (untimed: the benchmark checks its output) runs the peer's forward too
        if "out" not in state:
            out = forward(xr, wr)
            state["out"] = out[0] if isinstance(out, tuple) else out
        state["grads"] = torch.autograd.grad(state["out"], (xr, wr), dy, retain_graph=True)

    return Arm(name, "peer", launch, lambda: state.get("grads"))
