"""The softmax lineages' GPU cases, run inside the watchdog's worker process (gpu_watchdog.py,
cases="softmax_cases"), never in pytest's.

Every check is against float64 on fresh inputs drawn from the case's seed (rmsnorm_cases.make_input:
its views and magnitudes), the output poisoned (NaN) before the launch. A masked case sets a random
half of each row's columns but the first to −inf (causal or padding masks). The forward's bound: twice
a float32 softmax's own error against float64 (torch, its order), one unit of the output's rounding,
the sum's order (4·sqrt(cols) fp32 roundings, relative), exp2's error and the rounding of (x − max) ·
log2 e (2^-22 of |x − max|, relative), plus the smallest subnormal step. The backward takes y from a
float64 softmax rounded to the dtype, dy ~ N(0, 1), and bounds dx the same way: twice float32's error,
a unit of rounding, the products (2^-20 of the terms) and the dot's order carried through y.
"""

from __future__ import annotations

import math

import torch
from gpu_cases import healthy, initialise  # noqa: F401  (the worker's)
from hopattn import softmax_ops as sm
from rmsnorm_cases import PRECISION, make_input


def inputs(case: dict, gen) -> torch.Tensor:
    x = make_input(case, gen)
    if case.get("masked"):
        keep = torch.rand(x.shape, generator=gen, device="cuda") < 0.5
        keep[..., 0] = True
        x = x.masked_fill(~keep, float("-inf"))  # a new contiguous tensor
    return x


def _first_bad(name, got, ref, bound) -> None:
    bad = ~((got.double() - ref).abs() <= bound)
    if bad.any():
        i = tuple(bad.nonzero()[0].tolist())
        raise AssertionError(f"{name}{list(i)}: {got[i].item()!r} vs float64 {ref[i].item()!r} (bound "
                             f"{bound[i].item():.3g}); {int(bad.sum())} of {bad.numel()} elements off")


def check(stage: int, case: dict, seed: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = inputs(case, gen)
    dtype, cols = x.dtype, case["cols"]
    y = torch.full(x.shape, float("nan"), dtype=dtype, device="cuda")
    sm._softmax_into(x, y, stage=stage)
    torch.cuda.synchronize()
    xd = x.double()
    ref = torch.softmax(xd, -1)
    ref32 = torch.softmax(x.float(), -1)
    spread = (xd - xd.amax(-1, keepdim=True)).abs()
    spread = torch.where(torch.isfinite(spread), spread, torch.zeros_like(spread))  # masked: y is 0 exactly
    unit = 2.0 ** (1 - PRECISION[dtype])
    tiny = torch.finfo(dtype).tiny * torch.finfo(dtype).eps
    bound = (2 * (ref32.double() - ref).abs() + ref * (unit + 4 * math.sqrt(cols) * 2.0**-24 + 2.0**-20
                                                       + spread * 2.0**-22) + tiny)
    _first_bad("y", y, ref, bound)
    return {"max_err": (y.double() - ref).abs().max().item()}


def check_backward(stage: int, case: dict, seed: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = inputs(case, gen)
    dtype, cols = x.dtype, case["cols"]
    y = torch.softmax(x.double(), -1).to(dtype)
    if case["view"] in ("wide", "offset", "odd-stride"):  # y in the case's view too: rows a stride apart
        wide = torch.zeros(y.shape[:-1] + (cols + 24,), dtype=dtype, device="cuda")
        shift = 1 if case["view"] == "offset" else 8
        wide[..., shift:shift + cols] = y
        y = wide[..., shift:shift + cols]
    dy = make_input(dict(case, magnitude=1.0), gen)
    dx = torch.full(x.shape, float("nan"), dtype=dtype, device="cuda")
    sm._softmax_backward_into(dy, y, dx, stage=stage)
    torch.cuda.synchronize()

    def reference(t):
        yd, g = y.to(t), dy.to(t)
        return yd * (g - (yd * g).sum(-1, keepdim=True))

    ref, ref32 = reference(torch.float64), reference(torch.float32)
    yd, g = y.double(), dy.double()
    dot = (yd * g).sum(-1, keepdim=True)
    dot_abs = (yd * g).abs().sum(-1, keepdim=True)
    unit = 2.0 ** (1 - PRECISION[dtype])
    tiny = torch.finfo(dtype).tiny * torch.finfo(dtype).eps
    bound = (2 * (ref32.double() - ref).abs() + ref.abs() * unit + yd.abs() * (g.abs() + dot.abs()) * 2.0**-20
             + yd.abs() * dot_abs * (4 * math.sqrt(cols) * 2.0**-24 + 2.0**-20) + tiny)
    _first_bad("dx", dx, ref, bound)
    return {"max_err": (dx.double() - ref).abs().max().item()}


def fully_masked_rows(stage: int, seed: int) -> None:
    """Rows of −inf give NaN, as torch.softmax does; the other rows of the same launch do not."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for cols in (100, 4096, 65536, 262144):
        x = torch.randn(6, cols, generator=gen, device="cuda").to(torch.bfloat16)
        x[2] = float("-inf")
        y = sm.softmax(x, stage=stage)
        torch.cuda.synchronize()
        assert torch.isnan(y[2]).all(), f"{cols}: a row of -inf is not NaN"
        assert torch.isfinite(y[[0, 1, 3, 4, 5]]).all(), f"{cols}: a finite row has a non-finite output"


def repeats_bit_for_bit(stage: int, backward: bool, seed: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for cols in (4096, 65536, 262144):
        x = torch.randn(16, cols, generator=gen, device="cuda").to(torch.bfloat16)
        if backward:
            y = torch.softmax(x.float(), -1).to(torch.bfloat16)
            a, b = sm.softmax_backward(x, y, stage=stage), sm.softmax_backward(x, y, stage=stage)
        else:
            a, b = sm.softmax(x, stage=stage), sm.softmax(x, stage=stage)
        assert torch.equal(a, b), f"{cols} columns: two runs differ"


def autograd_matches(seed: int) -> dict:
    """hopattn.softmax(x).backward() against float64 autograd and torch.softmax's."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for dtype in (torch.bfloat16, torch.float32):
        x = (4 * torch.randn(3, 5, 4096, generator=gen, device="cuda")).to(dtype)
        dy = torch.randn(3, 5, 4096, generator=gen, device="cuda").to(dtype)
        xa = x.clone().requires_grad_()
        sm.softmax(xa).float().mul(dy.float()).sum().backward()
        xd = x.double().requires_grad_()
        torch.softmax(xd, -1).mul(dy.double()).sum().backward()
        xt = x.clone().requires_grad_()
        torch.softmax(xt, -1).float().mul(dy.float()).sum().backward()
        err = ((xa.grad.double() - xd.grad).abs().max() / xd.grad.abs().max()).item()
        peer = ((xa.grad.double() - xt.grad.double()).abs().max() / xd.grad.abs().max()).item()
        limit = 3e-2 if dtype == torch.bfloat16 else 1e-5
        assert err < limit and peer < limit, f"{dtype}: relative error {err:.3g} (float64), {peer:.3g} (torch)"
        out[f"{dtype}"] = err
    return out


def compiled_and_graphed(seed: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(64, 8192, generator=gen, device="cuda").to(torch.bfloat16)
    dy = torch.randn(64, 8192, generator=gen, device="cuda").to(torch.bfloat16)

    def run(fn):
        xa = x.clone().requires_grad_()
        out = fn(xa)
        out.backward(dy)
        return out.detach(), xa.grad

    eager = run(lambda a: sm.softmax(a) * 2)
    compiled = run(torch.compile(lambda a: sm.softmax(a) * 2, fullgraph=True))
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1]), "torch.compile differs"
    y_ref = sm.softmax(x)
    y, dx = torch.empty_like(x), torch.empty_like(x)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        y.copy_(sm.softmax(x))
        dx.copy_(sm.softmax_backward(dy, y_ref))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, y_ref) and torch.equal(dx, sm.softmax_backward(dy, y_ref)), "the CUDA graph differs"


def opcheck(seed: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(8, 1024, generator=gen, device="cuda").to(torch.bfloat16)
    y = torch.softmax(x.float(), -1).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.hopattn.softmax.default, (x.clone().requires_grad_(), None))
    torch.library.opcheck(torch.ops.hopattn.softmax_backward.default, (x, y, None))


def rejects(stage: int, backward: bool) -> None:
    x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
    if backward:
        calls = ((lambda: sm.softmax_backward(x[:, :32], x, stage=stage), "dy: expected y's shape"),
                 (lambda: sm.softmax_backward(x.float(), x, stage=stage), "dy: expected y's dtype"),
                 (lambda: sm.softmax_backward(x.t(), x.t(), stage=stage), "contiguous"),
                 (lambda: sm.softmax_backward(x, x, stage=99), "stage: expected None"))
    else:
        calls = ((lambda: sm.softmax(x.t(), stage=stage), "contiguous"),
                 (lambda: sm.softmax(x.double(), stage=stage), "x: expected"),
                 (lambda: sm.softmax(x[:, :0], stage=stage), "empty"),
                 (lambda: sm.softmax(x, stage=99), "stage: expected None"))
    for call, message in calls:
        try:
            call()
        except (ValueError, TypeError) as err:
            assert message in str(err), str(err)
        else:
            raise AssertionError(f"no error for the {message!r} case")
    out = sm.softmax_backward(x, x, stage=stage) if backward else sm.softmax(x, stage=stage)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    empty = torch.empty(0, 64, device="cuda", dtype=torch.bfloat16)
    assert (sm.softmax_backward(empty, empty, stage=stage) if backward else sm.softmax(empty, stage=stage)).shape == (0, 64)


def stage_info(stage: int, backward: bool) -> dict:
    out = {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for cols in (1024, 4096, 16384, 65536, 262144):
            info = (sm.backward_stage_info if backward else sm.stage_info)(stage, cols, dtype)
            assert info["local_bytes"] == 0, f"{info['variant']}: {info['local_bytes']} bytes of local memory"
            assert info["threads"] <= info["max_threads"], info
            out[f"{dtype}-{cols}"] = info["registers"]
    return out
