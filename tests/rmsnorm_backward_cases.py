"""The RMSNorm backward's GPU cases, run inside the watchdog's worker process (gpu_watchdog.py,
cases="rmsnorm_backward_cases"), never in pytest's.

Every check is against float64 on fresh inputs drawn from the case's seed: x laid out as the case's
view (rmsnorm_cases.make_input), dy in the same view, rstd the float64 forward's rounded to fp32 (as
the forward hands it over; both the kernel and the references use that value), drstd when the case
asks. dx, dw and the stage's fp32 workspace are poisoned (NaN) before the launch, so an element
never written, or a partial row of dw never written and still summed, fails. The bounds follow
rmsnorm_cases: twice a float32 computation's own error against float64 (torch, its summation
order), one unit of the output's rounding, the products' roundings (2^-20 of the terms), the row's
dot — 4·sqrt(cols) fp32 roundings of Σ|x · g|, carried into dx through m — and, for dw, the sum
down the columns (4·sqrt(rows) roundings of Σ|dy · x̂|), plus the output's smallest subnormal step.
"""

from __future__ import annotations

import math

import torch
from gpu_cases import healthy, initialise  # noqa: F401  (the worker's)
from hopattn import rmsnorm
from rmsnorm_cases import PRECISION, make_input

PRODUCTS = 2.0**-20  # a few fp32 roundings of each product, relative to its terms


def inputs(case: dict, gen):
    """x, dy (the case's view), weight, rstd (fp32, from a float64 forward), drstd (or None)."""
    x = make_input(case, gen)
    dy = make_input(dict(case, magnitude=1.0), gen)
    dtype, cols = x.dtype, case["cols"]
    weight = (1.0 + 0.5 * torch.randn(cols, generator=gen, device="cuda")).to(dtype) if case["weight"] else None
    xd = x.double()
    rstd = torch.rsqrt(xd.square().mean(-1) + case["eps"]).float()
    drstd = None
    if case.get("drstd"):  # of the size of Σ x · g, so that both parts of m matter
        scale = math.sqrt(cols) * case["magnitude"]
        drstd = torch.randn(rstd.shape, generator=gen, device="cuda", dtype=torch.float64).mul(scale).float()
    return x, dy, weight, rstd, drstd


def reference(x, dy, weight, rstd, drstd, dtype=torch.float64):
    """(dx, dw, and the bounds' scales) of the backward, computed in ``dtype`` from the same inputs."""
    cols = x.shape[-1]
    xd, d, r = x.to(dtype), dy.to(dtype), rstd.to(dtype).unsqueeze(-1)
    g = d * weight.to(dtype) if weight is not None else d
    dot = (xd * g).sum(-1, keepdim=True)
    m = r * (dot + (drstd.to(dtype).unsqueeze(-1) if drstd is not None else 0.0)) / cols
    xhat = xd * r
    dx = r * (g - xhat * m)
    dw = (d * xhat).reshape(-1, cols).sum(0)
    return dx, dw, dict(g=g, xhat=xhat, m=m, r=r, dot_abs=(xd * g).abs().sum(-1, keepdim=True),
                        dw_abs=(d * xhat).abs().reshape(-1, cols).sum(0))


def _first_bad(name, got, ref, bound) -> None:
    bad = ~((got.double() - ref).abs() <= bound)  # NaN (never written) counts as bad
    if bad.any():
        i = tuple(bad.nonzero()[0].tolist())
        raise AssertionError(f"{name}{list(i)}: {got[i].item()!r} vs float64 {ref[i].item()!r} (bound "
                             f"{bound[i].item():.3g}); {int(bad.sum())} of {bad.numel()} elements off")


def check(stage: int, case: dict, seed: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x, dy, weight, rstd, drstd = inputs(case, gen)
    dtype, cols = x.dtype, case["cols"]
    rows = x.numel() // cols
    weight_grad = weight is not None and case.get("weight_grad", True)
    dx = torch.full(x.shape, float("nan"), dtype=dtype, device="cuda")
    dw = torch.full((cols,), float("nan"), dtype=dtype, device="cuda") if weight_grad else None
    need = rmsnorm.backward_workspace_bytes(dy, x, weight, rstd, drstd, dx, weight_grad, stage)
    workspace = torch.full((max(1, need // 4),), float("nan"), dtype=torch.float32, device="cuda")
    rmsnorm._rms_norm_backward_into(dy, x, weight, rstd, drstd, dx, dw, workspace, stage=stage)
    torch.cuda.synchronize()

    ref, ref_dw, s = reference(x, dy, weight, rstd, drstd)
    ref32, ref32_dw, _ = reference(x, dy, weight, rstd, drstd, torch.float32)
    unit = 2.0 ** (1 - PRECISION[dtype])
    tiny = torch.finfo(dtype).tiny * torch.finfo(dtype).eps
    dot_order = 4 * math.sqrt(cols) * 2.0**-24 + PRODUCTS
    drstd_abs = drstd.double().abs().unsqueeze(-1) if drstd is not None else 0.0
    m_err = s["r"] * (s["dot_abs"] * dot_order + drstd_abs * PRODUCTS) / cols
    bound = (2 * (ref32.double() - ref).abs() + ref.abs() * unit
             + (s["r"] * s["g"].abs() + s["r"] * (s["xhat"] * s["m"]).abs()) * PRODUCTS
             + s["r"] * s["xhat"].abs() * m_err + tiny)
    _first_bad("dx", dx, ref, bound)
    out = {"max_err": (dx.double() - ref).abs().max().item() / (ref.abs().max().item() or 1.0)}
    if weight_grad:
        dw_bound = (2 * (ref32_dw.double() - ref_dw).abs() + ref_dw.abs() * unit
                    + s["dw_abs"] * (4 * math.sqrt(max(rows, 1)) * 2.0**-24 + PRODUCTS) + tiny)
        _first_bad("dw", dw, ref_dw, dw_bound)
        out["dw_err"] = (dw.double() - ref_dw).abs().max().item() / (ref_dw.abs().max().item() or 1.0)
    return out


def no_rows(stage: int) -> None:
    """No rows: dx is empty and dw, a sum of nothing, is zeros (written, not left as it was)."""
    x = torch.empty(0, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(64, device="cuda", dtype=torch.bfloat16)
    dx = torch.empty_like(x)
    dw = torch.full((64,), float("nan"), device="cuda", dtype=torch.bfloat16)
    rstd = torch.empty(0, device="cuda")
    need = rmsnorm.backward_workspace_bytes(x, x, w, rstd, None, dx, True, stage)
    workspace = torch.full((max(1, need // 4),), float("nan"), device="cuda")
    rmsnorm._rms_norm_backward_into(x, x, w, rstd, None, dx, dw, workspace, stage=stage)
    torch.cuda.synchronize()
    assert torch.equal(dw, torch.zeros_like(dw)), "dw of no rows is not zeros"


def repeats_bit_for_bit(stage: int, seed: int) -> None:
    """Two runs give the same bits: dw is summed in a fixed order, whatever the timing."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for rows, cols in ((2048, 4096), (64, 65536), (24, 262144)):
        x = torch.randn(rows, cols, generator=gen, device="cuda").to(torch.bfloat16)
        dy = torch.randn(rows, cols, generator=gen, device="cuda").to(torch.bfloat16)
        w = torch.randn(cols, generator=gen, device="cuda").to(torch.bfloat16)
        rstd = torch.rsqrt(x.float().square().mean(-1) + 1e-6)
        a = rmsnorm.rms_norm_backward(dy, x, w, rstd, stage=stage)
        b = rmsnorm.rms_norm_backward(dy, x, w, rstd, stage=stage)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), f"{rows}x{cols}: two runs differ"


def autograd_matches(seed: int) -> dict:
    """hopattn.rms_norm(...).backward() against float64 autograd, with rstd in the loss too (drstd),
    for a weight that needs a gradient and one that does not; and F.rms_norm's autograd as a peer."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(3, 5, 4096, generator=gen, device="cuda").to(dtype)
        w = (1 + 0.5 * torch.randn(4096, generator=gen, device="cuda")).to(dtype)
        dy = torch.randn(3, 5, 4096, generator=gen, device="cuda").to(dtype)
        for rstd_in_loss in (False, True):
            xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
            y, rstd = rmsnorm.rms_norm(xa, wa, 1e-6, return_rstd=True)
            loss = (y.float() * dy.float()).sum() + (rstd.sum() if rstd_in_loss else 0.0)
            loss.backward()
            xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
            r = torch.rsqrt(xd.square().mean(-1, keepdim=True) + 1e-6)
            ref_loss = (xd * r * wd * dy.double()).sum() + (r.sum() if rstd_in_loss else 0.0)
            ref_loss.backward()
            for name, got, ref in (("dx", xa.grad, xd.grad), ("dw", wa.grad, wd.grad)):
                err = ((got.double() - ref).abs().max() / ref.abs().max()).item()
                assert err < (2e-2 if dtype == torch.bfloat16 else 1e-5), f"{dtype} {name}: relative error {err:.3g}"
                out[f"{dtype}-{rstd_in_loss}-{name}"] = err
        xa = x.clone().requires_grad_()
        rmsnorm.rms_norm(xa, w).float().mul(dy.float()).sum().backward()  # a weight that needs no gradient
        assert xa.grad is not None and xa.grad.shape == x.shape
        xp, wp = x.clone().requires_grad_(), w.clone().requires_grad_()
        torch.nn.functional.rms_norm(xp, (4096,), wp, 1e-6).float().mul(dy.float()).sum().backward()
        for name, got, peer in (("dx", xa.grad, xp.grad), ("dw", None, wp.grad)):
            if got is not None:
                rel = ((got.double() - peer.double()).abs().max() / peer.double().abs().max()).item()
                assert rel < (3e-2 if dtype == torch.bfloat16 else 1e-4), f"{dtype} {name} vs F.rms_norm: {rel:.3g}"
    return out


def compiled_and_graphed(seed: int) -> None:
    """torch.compile (fullgraph) traces the backward, and gives eager autograd's bits; a CUDA graph of
    the backward op replays them."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(64, 8192, generator=gen, device="cuda").to(torch.bfloat16)
    w = torch.randn(8192, generator=gen, device="cuda").to(torch.bfloat16)
    dy = torch.randn(64, 8192, generator=gen, device="cuda").to(torch.bfloat16)

    def grads(fn):
        xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
        fn(xa, wa).backward(dy)
        return xa.grad, wa.grad

    eager = grads(lambda a, b: rmsnorm.rms_norm(a, b) * 2)
    compiled = grads(torch.compile(lambda a, b: rmsnorm.rms_norm(a, b) * 2, fullgraph=True))
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1]), "torch.compile differs from eager"
    rstd = torch.rsqrt(x.float().square().mean(-1) + 1e-6)
    ref = rmsnorm.rms_norm_backward(dy, x, w, rstd)
    dx, dw = torch.empty_like(x), torch.empty_like(w)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        a, b = rmsnorm.rms_norm_backward(dy, x, w, rstd)
        dx.copy_(a)
        dw.copy_(b)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(dx, ref[0]) and torch.equal(dw, ref[1]), "the CUDA graph's replay differs from eager"


def opcheck(seed: int) -> None:
    """torch.library.opcheck of both ops: schema, fake tensors, the autograd registration, AOT dispatch."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(8, 1024, generator=gen, device="cuda").to(torch.bfloat16)
    w = torch.randn(1024, generator=gen, device="cuda").to(torch.bfloat16)
    dy = torch.randn(8, 1024, generator=gen, device="cuda").to(torch.bfloat16)
    rstd = torch.rsqrt(x.float().square().mean(-1) + 1e-6)
    torch.library.opcheck(torch.ops.hopattn.rms_norm_backward.default, (dy, x, w, rstd, None, True, None))
    torch.library.opcheck(torch.ops.hopattn.rms_norm.default, (x.clone().requires_grad_(), w, 1e-6, None))


def rejects(stage: int) -> None:
    """Bad inputs raise before a launch, naming the argument, and the context still works after them."""
    x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(64, device="cuda", dtype=torch.bfloat16)
    rstd = torch.ones(4, device="cuda")
    for call, message in (
            (lambda: rmsnorm.rms_norm_backward(x[:, :32], x, w, rstd, stage=stage), "dy: expected x's shape"),
            (lambda: rmsnorm.rms_norm_backward(x.float(), x, w, rstd, stage=stage), "dy: expected x's dtype"),
            (lambda: rmsnorm.rms_norm_backward(x, x, w, rstd.double(), stage=stage), "rstd: expected torch.float32"),
            (lambda: rmsnorm.rms_norm_backward(x, x, w, rstd[:3], stage=stage), "rstd: expected shape"),
            (lambda: rmsnorm.rms_norm_backward(x.t(), x.t(), None, torch.ones(64, device="cuda"), stage=stage),
             "contiguous"),
            (lambda: rmsnorm.rms_norm_backward(x, x, w, rstd, stage=99), "stage: expected None")):
        try:
            call()
        except (ValueError, TypeError) as err:
            assert message in str(err), str(err)
        else:
            raise AssertionError(f"no error for the {message!r} case")
    dx, dw = rmsnorm.rms_norm_backward(x, x, w, rstd, stage=stage)
    torch.cuda.synchronize()
    assert torch.isfinite(dx).all() and torch.isfinite(dw).all()


def stage_info(stage: int) -> dict:
    """What each configuration of the stage compiled to (no local memory, in either kernel), for a few
    row lengths and every dtype, with and without dw."""
    out = {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for rows, cols in ((32768, 1024), (32768, 4096), (16384, 16384), (4096, 65536), (1024, 262144)):
            for weight_grad in (True, False):
                info = rmsnorm.backward_stage_info(stage, cols, dtype, rows, weight_grad)
                assert info["local_bytes"] == 0, f"{info['variant']}: {info['local_bytes']} bytes of local memory"
                assert info["sum_local_bytes"] == 0, f"{info['variant']}: the partial sum uses local memory"
                assert info["threads"] <= info["max_threads"], info
                out[f"{dtype}-{cols}-{weight_grad}"] = info["registers"]
    return out
