"""The cross-entropy lineage's GPU cases, run inside the watchdog's worker process (gpu_watchdog.py,
cases="cross_entropy_cases"), never in pytest's. The case list itself (``cases``) needs no GPU and no
torch, so that the CPU tests can check its spread.

Every check is against float64 (hopattn.cross_entropy_ops.reference, itself checked against
torch.nn.functional.cross_entropy in float64 by the CPU tests) on fresh inputs drawn from the case's
seed, every output poisoned (NaN) before the launch. The bounds, per row (V classes, spread = the
largest |x − m| of the row's finite elements, unit = one rounding of the dtype):

  lse, loss: twice torch's own float32 error, + 2^-20 · (|lse| + |m − x_t| + spread) (the fp32 terms and
             exp2's argument), + 8 · sqrt(V) · 2^-24 (the sum's order), + ε · sqrt(V) · 2^-22 · max |x|
             (label smoothing's plain sum);
  dlogits:   |g| · (twice float32's error + p · (unit + 4 · sqrt(V) · 2^-24 + 2^-20 + spread · 2^-22)
             + ε/V · 4 · 2^-24 (label smoothing's ε/V, its fp32 roundings: where p is ~0 it is the whole
             gradient, and one rounding of the output alone does not cover it — an fp32 row with
             |x| ~ 30 failed by 6 % of that before this term))
             + unit · |dlogits| (its rounding) + four of the smallest subnormal steps (where p · g is
             subnormal in fp32, each of the kernel's and torch's roundings there — the exponent, the
             division by the sum, the scale by g — is absolute, up to half a step: an fp32 row with
             |x| ~ 30 and a gradient of 3.5e-42 failed one step's bound by 1.7 steps);
  ignored rows: loss and dlogits exactly 0; targets out of range: loss and the row's dlogits NaN.
"""

from __future__ import annotations

import math
import random

# Row lengths at every configuration's edge (bf16: 256 / 512 / 1024 / 2048 a warp, 16k a CTA of
# stage 04, 32k stage 03's largest, 256k stage 04's largest) and past them, V = 1 and V not a multiple
# of any vector.
EDGE_COLS = [1, 2, 7, 8, 9, 31, 255, 256, 257, 1000, 1024, 1025, 2047, 2048, 2049, 4095, 8192, 16383, 16384,
             16385, 32000, 32768, 32769, 50257, 65536, 128256, 131072, 131073, 262144, 262145, 524289]
DTYPES = ("bf16", "fp16", "fp32")
VIEWS = ("contiguous", "wide", "offset", "odd-stride", "3d")
GRADS = ("none", "fused", "inplace", "dloss")
MAX_ELEMENTS = 1 << 22  # a case's logits, at most (the bounds' float64 copies stay small and quick)


def _case(cols, dtype, view, magnitude, grad, smoothing, outliers, rows=64) -> dict:
    rows = max(1, min(rows, MAX_ELEMENTS // (cols + 32)))
    return {"rows": rows, "cols": cols, "dtype": dtype, "view": view, "magnitude": magnitude, "grad": grad,
            "label_smoothing": smoothing, "outliers": outliers}


def cases(seed: int, fuzz: int = 24) -> list[dict]:
    """The edge lengths, cycling through dtypes, views and gradient modes, then a seeded fuzz."""
    out = []
    for i, cols in enumerate(EDGE_COLS):
        out.append(_case(cols, DTYPES[i % 3], VIEWS[i % len(VIEWS)], (1.0, 4.0, 30.0)[i % 3], GRADS[i % 4],
                         0.1 if i % 5 == 3 else 0.0, i % 4 == 1))
    rng = random.Random(seed ^ 0xCE)
    for _ in range(fuzz):
        cols = rng.choice([rng.randint(1, 4096), rng.randint(4096, 40000), rng.randint(40000, 300000)])
        out.append(_case(cols, rng.choice(DTYPES), rng.choice(VIEWS), rng.choice([0.5, 1.0, 8.0, 100.0]),
                         rng.choice(GRADS), rng.choice([0.0, 0.0, 0.05]), rng.random() < 0.3,
                         rows=rng.choice([1, 3, 17, 64])))
    return out


def label(case: dict) -> str:
    return (f"{case['rows']}x{case['cols']} {case['dtype']} {case['view']} |x|~{case['magnitude']:g} "
            f"grad={case['grad']}" + (f" eps={case['label_smoothing']:g}" if case["label_smoothing"] else "")
            + (" outliers" if case["outliers"] else ""))


# --- the worker's side (torch and CUDA from here on) ----------------------------------------------------

try:
    import torch
except ImportError:  # the CPU tests read the case list without torch
    torch = None

if torch is not None:
    from gpu_cases import healthy, initialise  # noqa: F401  (the worker's)
    from hopattn import cross_entropy_ops as ce

    TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    PRECISION = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}


def make_logits(case: dict, gen):
    dtype = TORCH_DTYPES[case["dtype"]]
    rows, cols, view = case["rows"], case["cols"], case["view"]
    limit = torch.finfo(dtype).max / 4

    def values(*shape):
        v = torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float64) * case["magnitude"]
        return v.clamp(-limit, limit).to(dtype)

    if view == "contiguous":
        x = values(rows, cols)
    elif view == "wide":
        x = values(rows, cols + 24)[:, 8:8 + cols]
    elif view == "offset":
        x = values(rows, cols + 17)[:, 1:1 + cols]
    elif view == "odd-stride":
        x = values(rows * (cols + 3)).view(rows, cols + 3)[:, :cols]
    elif view == "3d":
        first = 2 if rows % 2 == 0 and rows > 1 else 1
        x = values(first, rows // first, cols)
    else:
        raise ValueError(view)
    if case["outliers"]:  # a huge logit in some rows (the max far from the rest), at a random column
        flat = x.reshape(-1, cols)
        n = flat.shape[0]
        pick = torch.randint(0, cols, (n,), generator=gen, device="cuda")
        big = min(3e4 if dtype != torch.float16 else 6e4 / 2, float(limit))
        flat[torch.arange(0, n, 2, device="cuda"), pick[::2]] = big  # flat is a view of x: written in place
    return x


def make_targets(x, gen, ignore_index=-100):
    cols = x.shape[-1]
    t = torch.randint(0, cols, x.shape[:-1], generator=gen, device="cuda")
    flat = t.view(-1)
    flat[torch.rand(flat.shape, generator=gen, device="cuda") < 0.15] = ignore_index
    if flat.numel() > 2:
        flat[0], flat[-1] = cols - 1, 0  # the row's last and first class
    return t


def _bounds(x, t, eps, ref, g=None):
    """(loss bound, lse bound, dlogits bound) of the module's docstring."""
    dtype, cols = x.dtype, x.shape[-1]
    loss, lse, grad = ref
    xd = x.double()
    finite = torch.where(torch.isfinite(xd), xd, torch.zeros_like(xd))
    m = xd.amax(-1)
    spread = (finite - m.unsqueeze(-1)).abs().where(torch.isfinite(xd), torch.zeros_like(xd)).amax(-1)
    tt = torch.where((t >= 0) & (t < cols), t, torch.zeros_like(t))
    xt = torch.gather(xd, -1, tt.unsqueeze(-1)).squeeze(-1)
    xf = x.float()
    loss32 = torch.nn.functional.cross_entropy(xf.reshape(-1, cols), tt.reshape(-1), reduction="none",
                                               label_smoothing=eps).reshape(loss.shape).double()
    lse32 = torch.logsumexp(xf, -1).double()
    order = 8 * math.sqrt(cols) * 2.0**-24 + eps * math.sqrt(cols) * 2.0**-22 * finite.abs().amax(-1)
    common = 2.0**-20 * (lse.abs().nan_to_num(0) + (m - xt).abs().nan_to_num(0) + spread) + order + 1e-6
    loss_bound = 2 * (loss32 - loss).abs().nan_to_num(0) + common
    lse_bound = 2 * (lse32 - lse).abs().nan_to_num(0) + common
    unit = 2.0 ** (1 - PRECISION[dtype])
    tiny = 4 * torch.finfo(dtype).tiny * torch.finfo(dtype).eps  # four subnormal steps
    p = torch.exp(xd - lse.unsqueeze(-1)).nan_to_num(0)
    p32 = torch.softmax(xf, -1).double()
    gg = (torch.ones_like(lse) if g is None else g.double().expand_as(lse)).abs().unsqueeze(-1)
    grad_bound = gg * (2 * (p32 - p).abs() + p * (unit + 4 * math.sqrt(cols) * 2.0**-24 + 2.0**-20
                                                 + spread.unsqueeze(-1) * 2.0**-22)
                 + eps / cols * 4 * 2.0**-24) + unit * grad.abs() + tiny
    return loss_bound, lse_bound, grad_bound


def _first_bad(name, got, ref, bound) -> None:
    got = got.double()
    same_nan = torch.isnan(got) & torch.isnan(ref)
    same_inf = torch.isinf(got) & (got == ref)
    bad = ~((got - ref).abs() <= bound) & ~same_nan & ~same_inf
    if bad.any():
        i = tuple(bad.nonzero()[0].tolist())
        raise AssertionError(f"{name}{list(i)}: {got[i].item()!r} vs float64 {ref[i].item()!r} (bound "
                             f"{bound[i].item():.3g}); {int(bad.sum())} of {bad.numel()} elements off")


def check(stage: int, case: dict, seed: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = make_logits(case, gen)
    t = make_targets(x, gen)
    eps, mode, lead = case["label_smoothing"], case["grad"], x.shape[:-1]
    dloss = torch.randn(lead, generator=gen, device="cuda") if mode == "dloss" else None
    loss = torch.full(lead, math.nan, device="cuda")
    lse = torch.full(lead, math.nan, device="cuda")
    x_in = x.clone() if mode == "inplace" else x  # the reference reads the logits before the kernel overwrites them
    if mode == "none":
        dl = None
    elif mode == "inplace":
        dl = x_in
    else:
        dl = torch.full(x.shape, math.nan, dtype=x.dtype, device="cuda")
    ce._cross_entropy_into(x_in, t, loss, lse, dl, ignore_index=-100, label_smoothing=eps, stage=stage, dloss=dloss)
    torch.cuda.synchronize()
    ref = ce.reference(x, t, -100, eps, dloss)
    loss_bound, lse_bound, grad_bound = _bounds(x, t, eps, ref, dloss)
    _first_bad("loss", loss, ref[0], loss_bound)
    _first_bad("lse", lse, ref[1], lse_bound)
    ignored = t == -100
    assert bool((loss[ignored] == 0).all()), "an ignored row's loss is not exactly 0"
    out = {"loss_err": (loss.double() - ref[0]).abs().max().item()}
    if dl is not None:
        _first_bad("dlogits", dl, ref[2], grad_bound)
        assert bool((dl[ignored] == 0).all()), "an ignored row's gradient is not exactly 0"
        out["grad_err"] = (dl.double() - ref[2]).abs().max().item()
    return out


def special_rows(stage: int, seed: int) -> dict:
    """Rows of −inf only (lse −inf, loss NaN, dlogits NaN; ignored: 0 and 0), targets out of range (loss and
    dlogits NaN, and no read past the row: the rest of the launch is right), a masked half row, V = 1."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for cols in (1, 100, 4096, 40000, 200000):
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(8, cols, generator=gen, device="cuda").to(dtype)
            t = torch.randint(0, cols, (8,), generator=gen, device="cuda")
            x[0] = -math.inf
            x[1] = -math.inf
            t[1] = -100
            t[2] = cols          # out of range
            t[3] = -5            # out of range, negative
            if cols > 1:  # a row with its upper half masked (V = 1 would mask the whole row)
                x[4, cols // 2:] = -math.inf
            t[4] = 0
            loss = torch.full((8,), math.nan, device="cuda")
            lse = torch.full((8,), math.nan, device="cuda")
            dl = torch.full(x.shape, 7.0, dtype=dtype, device="cuda")
            ce._cross_entropy_into(x, t, loss, lse, dl, stage=stage)
            torch.cuda.synchronize()
            where = f"stage {stage}, {cols} classes, {dtype}"
            assert math.isinf(lse[0].item()) and lse[0].item() < 0, f"{where}: a row of -inf: lse {lse[0].item()}"
            assert math.isnan(loss[0].item()) and bool(torch.isnan(dl[0].float()).all()), f"{where}: row of -inf"
            assert loss[1].item() == 0 and bool((dl[1] == 0).all()), f"{where}: an ignored row of -inf"
            for r in (2, 3):
                assert math.isnan(loss[r].item()), f"{where}: target {t[r].item()} out of range: loss {loss[r].item()}"
                assert bool(torch.isnan(dl[r].float()).all()), f"{where}: target out of range: dlogits not NaN"
                assert math.isfinite(lse[r].item()), f"{where}: target out of range: lse {lse[r].item()}"
            ref = ce.reference(x[4:], t[4:])
            lb, eb, gb = _bounds(x[4:], t[4:], 0.0, ref)
            _first_bad(f"{where}: loss", loss[4:], ref[0], lb)
            _first_bad(f"{where}: dlogits", dl[4:], ref[2], gb)
            if cols > 1:
                assert bool((dl[4, cols // 2:] == 0).all()), f"{where}: masked classes' gradient is not 0"
    return {}


def repeats_bit_for_bit(stage: int, seed: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for cols in (3000, 32768, 131072):
        x = torch.randn(16, cols, generator=gen, device="cuda").to(torch.bfloat16)
        t = make_targets(x, gen)
        runs = []
        for _ in range(3):
            loss, lse = torch.empty(16, device="cuda"), torch.empty(16, device="cuda")
            dl = torch.empty_like(x)
            ce._cross_entropy_into(x, t, loss, lse, dl, stage=stage, label_smoothing=0.1)
            runs.append((loss, lse, dl))
        for other in runs[1:]:
            for a, b in zip(runs[0], other):
                assert torch.equal(a, b), f"stage {stage}, {cols} classes: two launches differ"
    return {}


def autograd_matches(seed: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    F = torch.nn.functional
    out = {}
    for reduction in ("mean", "sum", "none"):
        for eps in (0.0, 0.1):
            x = torch.randn(33, 5000, generator=gen, device="cuda").to(torch.bfloat16)
            t = make_targets(x, gen)
            xr = x.clone().requires_grad_()
            loss = ce.cross_entropy(xr, t, reduction=reduction, label_smoothing=eps)
            xd = x.double().requires_grad_()
            ref = F.cross_entropy(xd, t, reduction=reduction, label_smoothing=eps)
            g = torch.randn(ref.shape, generator=gen, device="cuda", dtype=torch.float64)
            loss.backward(g.float())
            ref.backward(g)
            err = (loss.double() - ref.detach()).abs().max().item()
            assert err <= 1e-4 * (1 + ref.detach().abs().max().item()), f"{reduction}, eps {eps}: loss off by {err}"
            gerr = (xr.grad.double() - xd.grad).abs().max().item()
            assert gerr <= 2e-2 * xd.grad.abs().max().item() + 1e-6, f"{reduction}, eps {eps}: grad off by {gerr}"
            out[f"{reduction}_{eps:g}_grad_err"] = gerr
    return out


def compiled_and_graphed(seed: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(64, 32768, generator=gen, device="cuda").to(torch.bfloat16)
    t = make_targets(x, gen)
    eager = ce.cross_entropy(x, t)
    compiled = torch.compile(lambda a, b: ce.cross_entropy(a, b), fullgraph=True)(x, t)
    assert torch.equal(eager, compiled), "torch.compile differs from eager"
    graph = torch.cuda.CUDAGraph()
    ce.cross_entropy(x, t)
    with torch.cuda.graph(graph):
        captured = ce.cross_entropy(x, t)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(eager, captured), "the CUDA graph differs from eager"
    return {}


def opcheck(seed: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(8, 3000, generator=gen, device="cuda").to(torch.bfloat16)
    t = make_targets(x, gen)
    torch.library.opcheck(torch.ops.hopattn.cross_entropy.default, (x, t, -100, 0.0, "mean", None, False))
    torch.library.opcheck(torch.ops.hopattn.cross_entropy.default, (x, t, -100, 0.1, "none", None, True),
                          test_utils=("test_schema", "test_faketensor"))
    dloss = torch.randn(8, generator=gen, device="cuda")
    torch.library.opcheck(torch.ops.hopattn.cross_entropy_backward.default, (x, t, dloss, -100, 0.0, None))
    return {}


def rejects(stage: int) -> dict:
    x = torch.randn(4, 100, device="cuda").to(torch.bfloat16)
    t = torch.zeros(4, dtype=torch.long, device="cuda")
    bad = [
        (lambda: ce.cross_entropy(x, t.cpu(), stage=stage), "targets: expected a tensor on logits' device"),
        (lambda: ce.cross_entropy(x, t.int(), stage=stage), "targets: expected torch.int64"),
        (lambda: ce.cross_entropy(x, t[:3], stage=stage), "targets: expected shape"),
        (lambda: ce.cross_entropy(x.t(), t, stage=stage), "logits: the last axis must be contiguous"),
        (lambda: ce.cross_entropy(x, t, label_smoothing=2.0, stage=stage), "label_smoothing"),
        (lambda: ce.cross_entropy(x, t, reduction="avg", stage=stage), "reduction"),
        (lambda: ce.cross_entropy(x, t + 100, check_targets=True, stage=stage), r"targets: \[0\] is 100"),
    ]
    for fn, message in bad:
        try:
            fn()
        except (TypeError, ValueError) as err:
            assert message.split(":")[0] in str(err), f"{message!r} not in {err}"
        else:
            raise AssertionError(f"accepted: {message}")
    ce.cross_entropy(x, t, stage=stage)  # the context survives
    torch.cuda.synchronize()
    return {}


def stage_info(stage: int) -> dict:
    worst = 0
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for cols in (100, 2048, 8192, 16384, 32768, 65536, 131072, 262144, 524288):
            for with_grad in (False, True):
                info = ce.stage_info(stage, cols, dtype, with_grad)
                assert info["local_bytes"] == 0, f"stage {stage}, {cols} {dtype}: {info}"
                worst = max(worst, info["registers"])
    return {"max_registers": worst}
