"""The RMSNorm lineage's GPU cases, run inside the watchdog's worker process (gpu_watchdog.py,
cases="rmsnorm_cases"), never in pytest's.

Every check is against float64 on fresh inputs drawn from the case's seed, with out and rstd
poisoned (NaN) before the launch, so an element the kernel never wrote fails. The bound comes from
a float32 computation of the same formula on the same inputs (torch, its own summation order): its
error against float64, e32, is what fp32 arithmetic costs here; the kernel may be off by twice it,
plus one unit of its output's rounding (its fp32 value may sit on the other side of a rounding
boundary: 2 · 2^-p relative, p the output's precision), plus its own summation order, 4·sqrt(cols)
fp32 roundings of the sum (statistical: sums of N(0, 1)² round like a random walk), plus the
output's smallest subnormal step.
"""

from __future__ import annotations

import math

import torch
from gpu_cases import healthy, initialise  # noqa: F401  (the worker's)
from hopattn import rmsnorm

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
PRECISION = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}  # bits, the implicit one included


def reference(x, weight, eps, dtype=torch.float64):
    """(out, rstd) of RMSNorm over the last axis, computed in `dtype`."""
    xd = x.to(dtype)
    rstd = torch.rsqrt(xd.square().mean(-1, keepdim=True) + eps)
    out = xd * rstd
    if weight is not None:
        out = out * weight.to(dtype)
    return out, rstd.squeeze(-1)


def make_input(case: dict, gen) -> torch.Tensor:
    """x as the case's view: the values N(0, 1) · magnitude, in the case's dtype, laid out as asked."""
    dtype = DTYPES[case["dtype"]]
    rows, cols, view = case["rows"], case["cols"], case["view"]
    limit = torch.finfo(dtype).max / 4

    def values(*shape):
        v = torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float64) * case["magnitude"]
        return v.clamp(-limit, limit).to(dtype)

    if view == "contiguous":
        return values(rows, cols)
    if view == "wide":
        return values(rows, cols + 24)[:, 8:8 + cols]
    if view == "offset":
        return values(rows, cols + 17)[:, 1:1 + cols]
    if view == "odd-stride":
        return values(rows * (cols + 3)).view(rows, cols + 3)[:, :cols]
    if view == "3d":
        first = 2 if rows % 2 == 0 and rows > 1 else 1
        return values(first, rows // first, cols)
    raise ValueError(view)


def check(stage: int, case: dict, seed: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = make_input(case, gen)
    dtype, cols = x.dtype, case["cols"]
    weight = (1.0 + 0.5 * torch.randn(cols, generator=gen, device="cuda")).to(dtype) if case["weight"] else None
    out = torch.full(x.shape, float("nan"), dtype=dtype, device="cuda")
    rstd = torch.full(x.shape[:-1], float("nan"), dtype=torch.float32, device="cuda")
    rmsnorm._rms_norm_into(x, weight, case["eps"], out, rstd, stage=stage)
    torch.cuda.synchronize()
    ref, ref_rstd = reference(x, weight, case["eps"])
    ref32, ref32_rstd = reference(x, weight, case["eps"], torch.float32)
    ordering = 4 * math.sqrt(cols) * 2.0**-24 + 2.0**-20  # and rsqrtf (2 ulp), the mean and eps, the products
    unit = 2.0 ** (1 - PRECISION[dtype])  # one unit in the last place, relative
    tiny = torch.finfo(dtype).tiny * torch.finfo(dtype).eps
    bound = 2 * (ref32.double() - ref).abs() + ref.abs() * (unit + ordering) + tiny
    err = (out.double() - ref).abs()
    bad = ~(err <= bound)  # NaN (never written) counts as bad
    if bad.any():
        i = bad.nonzero()[0].tolist()
        raise AssertionError(f"out{i}: {out[tuple(i)].item()!r} vs float64 {ref[tuple(i)].item()!r} (bound "
                             f"{bound[tuple(i)].item():.3g}); {int(bad.sum())} of {bad.numel()} elements off")
    rstd_bound = 2 * (ref32_rstd.double() - ref_rstd).abs() + ref_rstd.abs() * ordering
    rerr = (rstd.double() - ref_rstd).abs()
    if not bool((rerr <= rstd_bound).all()):
        i = (~(rerr <= rstd_bound)).nonzero()[0].tolist()
        raise AssertionError(f"rstd{i}: {rstd[tuple(i)].item()!r} vs float64 {ref_rstd[tuple(i)].item()!r}")
    scale = ref.abs().max().item() or 1.0
    return {"max_err": err.max().item() / scale, "bound": bound.max().item() / scale}


def repeats_bit_for_bit(stage: int, seed: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for cols in (4096, 65536, 262144):
        x = torch.randn(16, cols, generator=gen, device="cuda").to(torch.bfloat16)
        w = torch.randn(cols, generator=gen, device="cuda").to(torch.bfloat16)
        a, ra = rmsnorm.rms_norm(x, w, stage=stage, return_rstd=True)
        b, rb = rmsnorm.rms_norm(x, w, stage=stage, return_rstd=True)
        assert torch.equal(a, b) and torch.equal(ra, rb), f"{cols} columns: two runs differ"


def compiled_and_graphed(seed: int) -> None:
    """torch.compile (fullgraph) and a CUDA graph give the eager op's bits."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(64, 8192, generator=gen, device="cuda").to(torch.bfloat16)
    w = torch.randn(8192, generator=gen, device="cuda").to(torch.bfloat16)
    eager = rmsnorm.rms_norm(x, w)
    compiled = torch.compile(lambda a, b: rmsnorm.rms_norm(a, b) * 2, fullgraph=True)(x, w)
    assert torch.equal(compiled, eager * 2), "torch.compile differs from eager"
    out = torch.empty_like(eager)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out.copy_(rmsnorm.rms_norm(x, w))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager), "the CUDA graph's replay differs from eager"


def rejects(stage: int) -> None:
    """Bad inputs raise before a launch, and the context still works after them."""
    x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
    for call, message in ((lambda: rmsnorm.rms_norm(x, torch.ones(65, device="cuda", dtype=torch.bfloat16)), "weight"),
                          (lambda: rmsnorm.rms_norm(x.t(), stage=stage), "contiguous"),
                          (lambda: rmsnorm.rms_norm(x.double(), stage=stage), "x: expected"),
                          (lambda: rmsnorm.rms_norm(x, eps=-1.0, stage=stage), "eps")):
        try:
            call()
        except (ValueError, TypeError) as err:
            assert message in str(err), str(err)
        else:
            raise AssertionError(f"no error for the {message} case")
    y = rmsnorm.rms_norm(x, stage=stage)
    torch.cuda.synchronize()
    assert torch.isfinite(y).all()
    empty = rmsnorm.rms_norm(torch.empty(0, 64, device="cuda", dtype=torch.bfloat16), stage=stage)
    assert empty.shape == (0, 64)


def stage_info(stage: int) -> dict:
    """What each configuration of the stage compiled to, for a few row lengths and every dtype."""
    out = {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for cols in (1024, 4096, 16384, 65536, 262144):
            info = rmsnorm.stage_info(stage, cols, dtype)
            assert info["local_bytes"] == 0, f"{info['variant']}: {info['local_bytes']} bytes of local memory"
            assert info["threads"] <= info["max_threads"], info
            out[f"{dtype}-{cols}"] = info["registers"]
    return out
