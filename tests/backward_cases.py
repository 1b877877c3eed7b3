"""The backward's GPU cases, run inside the watchdog's worker process (gpu_watchdog.py, cases=
"backward_cases"), never in pytest's.

Every check is against float64 gradients of the same bf16 inputs, drawn fresh from the case's seed,
with dq, dk and dv poisoned (NaN) before the launch, so an element the kernels never wrote fails.

The bound comes from a float32 computation on the same bf16 inputs, done the way every
FlashAttention-style backward does it: P and dS rounded to bf16 where they enter the GEMMs, D from
the forward's bf16 output (``reference_grads(..., like_kernel=True)``). Its largest error against
float64, e32, is what that algorithm costs on these inputs; the kernel may be off by twice it, plus
the rounding of its own bf16 output (2^-8 of the largest gradient), the rounding of the sums that
cancel in dP − D (SUM_ROUNDING), and fp32's smallest normal times what an input flushed to 0 can
carry. A shape-fuzz case also checks the
gradients' relative error overall (below 2 %), which a wrong tile would break even where the
element bound is wide.
"""

from __future__ import annotations

import math

import gpu_cases
import hopattn
import torch
from gpu_cases import SMALLEST_NORMAL, _as_view, _to_bhsd, initialise  # noqa: F401  (initialise: the worker's)
from hopattn import backward

REFERENCE_BYTES = 1 << 28  # scores per chunk of the reference, in bytes of its dtype
MAX_REL_ERR = 2e-2
NAMES = ("dq", "dk", "dv")


def healthy() -> bool:
    return gpu_cases.healthy()


def reference_grads(q, k, v, dout, *, causal: bool, scale: float, dtype=torch.float64, dlse=None, out=None,
                    lse=None, like_kernel: bool = False, cancellation: bool = False):
    """(dq, dk, dv) of softmax(scale q kᵀ) v for the upstream dout (BHSD; k, v may have fewer heads),
    plus the gradient dlse of the log-sum-exp when given, in `dtype`. like_kernel: P and dS rounded
    to bf16 before the GEMMs they feed, D = rowsum(dout ∘ out) from the given bf16 out, and, when lse
    (fp32 [B, H, Lq], the forward's) is given, P = exp(S − lse) from it, as the kernels compute them:
    where one key holds a row's probability, the forward's and the backward's roundings of S then
    leave P a little off 1, which P's bf16 rounding and dV see. Rows that see no key have P = 0. Computed a (batch, head) and a chunk of
    query rows at a time. cancellation: also (Cq, Ck), what dq and dk would be with every term of
    dS = P ∘ (dP − D) taken by the size of the sums behind it, P ∘ (|dO| |v|ᵀ + Σ |dO| ∘ P|v|):
    where dP and D cancel (a row whose probability sits on one key), the rounding of those sums —
    and the forward's rounding of O to bf16, which D is taken from — is a fraction of these; and
    (Fq, Fk), what a value below fp32's smallest normal, flushed to 0 by the tensor cores or the
    FTZ arithmetic, can move an element of dq or dk by, in units of 2^-126."""
    batch, heads, len_q, dim = q.shape
    kv_heads, len_k = k.shape[1], k.shape[2]
    group = heads // kv_heads
    dq = torch.zeros(q.shape, dtype=dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=dtype, device=q.device)
    dv = torch.zeros(v.shape, dtype=dtype, device=q.device)
    cq, ck = torch.zeros_like(dq), torch.zeros_like(dk)
    fq = torch.zeros(q.shape[:3], dtype=dtype, device=q.device)
    fk = torch.zeros(k.shape[:3], dtype=dtype, device=q.device)
    if len_q == 0 or len_k == 0:
        return (dq, dk, dv, cq, ck, fq, fk) if cancellation else (dq, dk, dv)
    keys = torch.arange(len_k, device=q.device)
    rows = max(1, REFERENCE_BYTES // (torch.finfo(dtype).bits // 8 * len_k * 4))

    def rounded(x):
        return x.to(torch.bfloat16).to(dtype) if like_kernel else x

    for b in range(batch):
        for h in range(heads):
            kh = h // group
            kk, vv = k[b, kh].to(dtype), v[b, kh].to(dtype)
            for r0 in range(0, len_q, rows):
                r1 = min(len_q, r0 + rows)
                qq, do = q[b, h, r0:r1].to(dtype), dout[b, h, r0:r1].to(dtype)
                s = (qq @ kk.T) * scale
                if causal:
                    limit = torch.arange(r0, r1, device=q.device)[:, None] + (len_k - len_q)
                    s.masked_fill_(keys[None, :] > limit, float("-inf"))
                seen = torch.isfinite(s).any(-1, keepdim=True)
                if like_kernel and lse is not None:
                    row_lse = lse[b, h, r0:r1, None].to(dtype)
                    p = torch.where(seen, torch.exp(s - torch.where(seen, row_lse, 0.0)), 0.0)
                else:
                    p = torch.softmax(s.masked_fill(~seen, 0.0), dim=-1) * seen
                dp = do @ vv.T
                if like_kernel:
                    d = (do * out[b, h, r0:r1].to(dtype)).sum(-1, keepdim=True)
                else:
                    d = (p * dp).sum(-1, keepdim=True)
                if dlse is not None:
                    d = d - dlse[b, h, r0:r1, None].to(dtype)
                ds = p * (dp - d)
                pr, dsr = rounded(p), rounded(ds)
                dv[b, kh] += pr.T @ do
                dk[b, kh] += (dsr.T @ qq) * scale
                dq[b, h, r0:r1] = (dsr @ kk) * scale
                if cancellation:
                    # The sizes behind dP (the products dO·v) and behind D (dO·O, O itself a sum
                    # over P v, and rounded to bf16 by the forward before D is taken from it).
                    behind_d = (do.abs() * (p @ vv.abs())).sum(-1, keepdim=True)
                    size = p * ((do.abs() @ vv.abs().T) + behind_d)
                    cq[b, h, r0:r1] = (size @ kk.abs()) * scale
                    ck[b, kh] += (size.T @ qq.abs()) * scale
                    # An entry of v, O or a product below fp32's smallest normal, flushed to 0 in dP
                    # or D, moves dS by at most P · |dO|₁ · 2^-126; a flushed q or k entry moves dq or
                    # dk by |dS| · 2^-126: the reach of either, per element of dq and dk.
                    reach = p * do.abs().sum(-1, keepdim=True)
                    fq[b, h, r0:r1] = (size.sum(-1) + (reach @ kk.abs()).amax(-1)) * scale
                    fk[b, kh] += (size.sum(0) + (reach.T @ qq.abs()).amax(-1)) * scale
    return (dq, dk, dv, cq, ck, fq, fk) if cancellation else (dq, dk, dv)


def _inputs(case: dict, seed: int):
    """BHSD values (for the reference) and the views the kernel reads, as gpu_cases draws them."""
    shape = dict(case, view=case["view"])
    (q, k, v), (qx, kx, vx) = gpu_cases._make_inputs(shape, seed)
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    dout = torch.randn(q.shape, generator=gen, device="cuda").to(torch.bfloat16)
    return (q, k, v, dout), (qx, kx, vx, _as_view(dout, case["layout"], case["view"], gen))


# A sum of 128 fp32 products (D = dO · O, dP = dO · v) is within 128 · 2^-24 = 2^-17 of the sum of
# their sizes; twice that for the tensor cores' accumulation, which aligns and truncates.
SUM_ROUNDING = 2.0 ** -16


def _check_grads(got, q, k, v, dout, out, dlse, *, causal, scale, relative: bool = True, lse=None) -> dict:
    """got (BHSD) against float64 within the float32-derived bound: 2 e32 (the float32 computation's
    own largest error) + 2^-8 of the largest gradient (the kernel's bf16 output) + SUM_ROUNDING of
    the largest cancellation size (dq, dk: where dP − D cancels, as on a row whose probability sits
    on one key, the rounding of those sums is all that is left) + fp32's smallest normal. relative:
    also the overall relative error below MAX_REL_ERR, or below twice the float32 computation's own
    where that is larger (meaningless where the gradient is only what cancellation leaves, as in the
    numeric extremes). Returns the errors, bounds and both relative errors."""
    *exact, cq, ck, fq, fk = reference_grads(q, k, v, dout, causal=causal, scale=scale, dlse=dlse,
                                             cancellation=True)
    alg = reference_grads(q, k, v, dout, causal=causal, scale=scale, dtype=torch.float32, dlse=dlse, out=out,
                          lse=lse, like_kernel=True)
    sizes = (cq, ck, None)
    flushes = (fq.abs().max().item() if fq.numel() else 0.0, fk.abs().max().item() if fk.numel() else 0.0, 1.0)
    result = {}
    for name, g, g64, g32, size, flush in zip(NAMES, got, exact, alg, sizes, flushes):
        assert not g.isnan().any(), f"{name}: {int(g.isnan().sum())} elements unwritten or NaN"
        if g.numel() == 0:
            continue
        e32 = (g32.double() - g64).abs().max().item()
        top = g64.abs().max().item()
        cancel = 0.0 if size is None else size.abs().max().item()
        bound = 2 * e32 + 2.0 ** -8 * top + SUM_ROUNDING * cancel + SMALLEST_NORMAL * (1.0 + 2.0 * flush)
        err = (g.double() - g64).abs().max().item()
        # Relative to the gradient, or where it is all cancellation (a row that sees one or two
        # keys), to what the bf16 rounding of O (2^-9 of it, in D) leaves: 2^-8 of the sizes.
        scale_of = g64.norm() + (0.0 if size is None else 2.0 ** -8 * size.norm())
        rel = ((g.double() - g64).norm() / scale_of.clamp_min(1e-300)).item()
        # The same measure of the float32 computation (P and dS rounded to bf16, as the kernels take
        # them): where the sum over the keys cancels (few queries over many keys) it is itself above
        # 2 %, and a kernel is held to twice it, as the elementwise bound holds it to 2 e32.
        rel32 = ((g32.double() - g64).norm() / scale_of.clamp_min(1e-300)).item()
        rel_limit = max(MAX_REL_ERR, 2 * rel32)
        assert err <= bound, (f"{name}: largest error {err:.3g} against float64 above the float32-derived bound "
                              f"{bound:.3g} (float32's own error {e32:.3g}, largest |{name}| {top:.3g}, largest "
                              f"cancellation size {cancel:.3g})")
        if relative:
            assert rel < rel_limit or top < 1e-30, (f"{name}: relative error {rel:.3g} above {rel_limit:.3g} "
                                                    f"(the larger of {MAX_REL_ERR} and twice float32's {rel32:.3g})")
        result.update({f"{name}_err": err, f"{name}_bound": bound, f"{name}_rel": rel, f"{name}_rel32": rel32})
    return result


def grad_check(stage: int, case: dict, seed: int, repeat: bool = False) -> dict:
    """One backward stage on one FuzzCase (a dict): forward by the final forward stage (out, lse),
    then the backward into poisoned dq, dk, dv; against float64. repeat: a second launch, identical
    bit for bit in deterministic mode."""
    (q, k, v, dout), (qx, kx, vx, dx) = _inputs(case, seed)
    causal, layout, scale = case["causal"], case["layout"], 1 / math.sqrt(128)
    with torch.no_grad():
        out, lse = hopattn.attention(qx, kx, vx, causal=causal, layout=layout, return_lse=True)
    dlse = None
    if case["dlse"]:
        gen = torch.Generator(device="cuda").manual_seed(seed + 2)
        dlse = torch.randn(lse.shape, generator=gen, device="cuda")

    def launch():
        grads = tuple(torch.full_like(t, float("nan"), memory_format=torch.contiguous_format) for t in (qx, kx, vx))
        return backward._backward_into(grads, dx, qx, kx, vx, out, lse, dlse=dlse, causal=causal, layout=layout,
                                       deterministic=case["deterministic"], stage=stage)

    got = launch()
    torch.cuda.synchronize()
    result = _check_grads([_to_bhsd(g, layout) for g in got], q, k, v, dout, _to_bhsd(out, layout), dlse,
                          causal=causal, scale=scale, lse=lse)
    if causal and case["len_q"] > case["len_k"]:
        blind = case["len_q"] - case["len_k"]
        assert torch.count_nonzero(_to_bhsd(got[0], layout)[:, :, :blind]) == 0, "a query that sees no key got a dq"
    if repeat and case["deterministic"]:
        again = launch()
        for name, a, b in zip(NAMES, got, again):
            assert torch.equal(a, b), f"{name}: two deterministic launches differ"
    return result


def deterministic_repeats(stage: int, seed: int, causal: bool) -> dict:
    """deterministic=True: three launches identical bit for bit (grouped heads, tails, both masks);
    the default (atomic) mode within the bound of the same inputs."""
    case = dict(batch=2, heads=8, kv_heads=2, len_q=1000, len_k=1300, causal=causal, layout="bhsd",
                view="contiguous", deterministic=True, dlse=False)
    result = grad_check(stage, case, seed, repeat=True)
    (q, k, v, dout), (qx, kx, vx, dx) = _inputs(case, seed)
    out, lse = hopattn.attention(qx, kx, vx, causal=causal, return_lse=True)
    first = backward.attention_backward(dx, qx, kx, vx, out, lse, causal=causal, deterministic=True, stage=stage)
    for _ in range(2):
        again = backward.attention_backward(dx, qx, kx, vx, out, lse, causal=causal, deterministic=True, stage=stage)
        for name, a, b in zip(NAMES, first, again):
            assert torch.equal(a, b), f"{name}: deterministic launches differ"
    return result


def autograd_matches(seed: int, layout: str, causal: bool, use_lse: bool) -> dict:
    """hopattn.attention as a leaf of autograd: .backward() gives q, k and v (grouped heads) the
    float64 gradients of the loss, whether the loss used out, lse or both."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (gpu_cases.draw(s, gen, 1.0) for s in ((2, 6, 333, 128), (2, 3, 517, 128), (2, 3, 517, 128)))
    w = torch.randn(q.shape, generator=gen, device="cuda").to(torch.bfloat16)
    wl = torch.randn(q.shape[:3], generator=gen, device="cuda")
    leaves = [(t if layout == "bhsd" else t.transpose(1, 2).contiguous()).requires_grad_() for t in (q, k, v)]
    out, lse = hopattn.attention(*leaves, causal=causal, layout=layout, return_lse=True)
    loss = (_to_bhsd(out, layout).float() * w.float()).sum()
    if use_lse:
        loss = loss + (lse * wl).sum()
    loss.backward()
    got = [_to_bhsd(t.grad, layout) for t in leaves]
    return _check_grads(got, q, k, v, w, _to_bhsd(out.detach(), layout), wl if use_lse else None, causal=causal,
                        scale=1 / math.sqrt(128), lse=lse.detach())


def compiled_and_graphed_step(seed: int) -> None:
    """A training step whose forward is torch.compile(fullgraph=True)-d (its backward compiled by
    AOTAutograd through the registered autograd), and one captured whole in a CUDA graph, give the
    eager step's gradients bit for bit (deterministic mode: no atomics to reorder)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (gpu_cases.draw((2, 4, 300, 128), gen, 1.0) for _ in range(3))

    def loss_of(a, b, c):
        return hopattn.attention(a, b, c, causal=True, deterministic=True).float().square().sum()

    def step(loss_fn, leaves):
        return torch.autograd.grad(loss_fn(*leaves), leaves)

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    eager = step(loss_of, leaves)
    compiled = step(torch.compile(loss_of, fullgraph=True), leaves)
    for name, a, b in zip(NAMES, eager, compiled):
        assert torch.equal(a, b), f"{name}: the compiled step differs from the eager one"
    static = [t.clone().requires_grad_() for t in (q, k, v)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(loss_of, static)  # warm-up outside the capture (libraries loaded, allocator primed)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(loss_of, static)
    graph.replay()
    torch.cuda.synchronize()
    for name, a, b in zip(NAMES, eager, captured):
        assert torch.equal(a, b), f"{name}: the CUDA graph's replay differs from the eager step"


def numeric_grad_check(stage: int, case: dict, seed: int, exponent_limit: float) -> dict:
    """A NumericCase (numeric_cases.py: outlier keys, jumps, heavy tails, large scales) through the
    backward, within the same float32-derived bound; a case whose scores reach past the backward's
    documented range is reported, not launched."""
    q, k, v = gpu_cases.numeric_inputs(case, seed)
    top = gpu_cases.largest_exponent(q, k, case["scale"])
    if top > exponent_limit:
        return {"beyond": top}
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    dout = torch.randn(q.shape, generator=gen, device="cuda").to(torch.bfloat16)
    out, lse = hopattn.attention(q, k, v, causal=case["causal"], scale=case["scale"], return_lse=True)
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    backward._backward_into(grads, dout, q, k, v, out, lse, causal=case["causal"], scale=case["scale"], stage=stage)
    torch.cuda.synchronize()
    return _check_grads(grads, q, k, v, dout, out, None, causal=case["causal"], scale=case["scale"], relative=False,
                        lse=lse)


def rejects(stage: int) -> list[str]:
    """Bad backward inputs are refused before a launch with a message naming the argument, through
    the function and the op; the CUDA context works afterwards."""
    x = torch.randn(1, 2, 128, 128, device="cuda").to(torch.bfloat16)
    out, lse = hopattn.attention(x, x, x, return_lse=True)
    bad = {
        "lse": (x, x, x, x, out, lse[:, :1]),
        "dout": (x[:, :, :64], x, x, x, out, lse),
        "out": (x, x, x, x, out.float(), lse),
    }
    messages = []
    for name, args in bad.items():
        for entry in ("function", "op"):
            try:
                if entry == "function":
                    backward.attention_backward(*args, stage=stage)
                else:
                    torch.ops.hopattn.attention_backward(*args, None, False, None, "bhsd", False, stage)
            except (ValueError, TypeError) as err:
                assert name in str(err).split(":")[0], f"the error names {str(err).split(':')[0]!r}, not {name}"
                messages.append(str(err))
            else:
                raise AssertionError(f"a bad {name} was accepted through the {entry}")
    dq, dk, dv = backward.attention_backward(x, x, x, x, out, lse, stage=stage)
    torch.cuda.synchronize()
    assert not any(t.isnan().any() for t in (dq, dk, dv)), "a valid call after the rejected ones gave NaN"
    return messages


def empty_and_degenerate(stage: int) -> None:
    """No queries: dk = dv = 0; no keys: dq = 0; an empty batch: empty gradients."""
    x = torch.randn(2, 3, 100, 128, device="cuda").to(torch.bfloat16).requires_grad_()
    none = torch.empty(2, 3, 0, 128, device="cuda", dtype=torch.bfloat16).requires_grad_()
    kv = x.detach().clone().requires_grad_()
    hopattn.attention(none, kv, kv, backward_stage=stage).float().sum().backward()
    assert kv.grad is not None and torch.count_nonzero(kv.grad) == 0, "no queries: dk and dv must be 0"
    hopattn.attention(x, none, none, backward_stage=stage).float().sum().backward()
    assert torch.count_nonzero(x.grad) == 0, "no keys: dq must be 0"
    torch.cuda.synchronize()
