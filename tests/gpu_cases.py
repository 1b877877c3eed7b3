"""The GPU cases, run inside the watchdog's worker process (gpu_watchdog.py), never in pytest's.

Every check is against a float64 reference on fresh random inputs drawn from the case's seed, with
the output poisoned (NaN) before the launch, so an element the kernel never wrote fails the check.
A case returns a small dict on success and raises AssertionError, with what went wrong, otherwise.
"""

from __future__ import annotations

import math

import hopattn
import torch
from hopattn import lineage

MAX_REL_ERR = 1e-2
REFERENCE_BYTES = 1 << 30  # float64 scores per chunk of the reference
_REFERENCE: dict = {}  # the last reference, kept for the next stage on the same inputs


def initialise() -> None:
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the context, before the first case's clock starts
    torch.backends.cuda.matmul.allow_tf32 = False


def healthy() -> bool:
    """Whether this process can still run GPU work (after a sticky error, such as an illegal address,
    every later CUDA call fails)."""
    try:
        torch.ones(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001
        return False


def _stage(number: int) -> lineage.Stage:
    return {s.number: s for s in hopattn.stages()}[number]


def draw(shape, gen, magnitude=4.0) -> torch.Tensor:
    """bf16 normal values of the given magnitude: magnitude 4 gives scores with extremes past ±50."""
    return (torch.randn(shape, generator=gen, device="cuda") * magnitude).to(torch.bfloat16)


def reference(q, k, v, *, causal: bool, scale: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """softmax(scale q kᵀ) v in float64 (or `dtype`: float32 gives the error bound of the numeric
    fuzz), BHSD; k and v may have fewer heads (grouped-query), v another head dim than q and k
    (the output has v's); rows that see no key are 0 (bottom-right causal: query i sees
    j <= i + Lk - Lq). Computed a few (batch, K/V head) pairs and query rows at a time, so neither
    the copies of K and V nor the scores outgrow REFERENCE_BYTES."""
    batch, heads, len_q, head_dim = q.shape
    kv_heads, len_k, head_dim_v = k.shape[1], k.shape[2], v.shape[3]
    group = heads // kv_heads
    out = torch.zeros((batch, heads, len_q, head_dim_v), dtype=dtype, device=q.device)
    if len_k == 0:
        return out
    keys = torch.arange(len_k, device=q.device)
    kv_per_chunk = max(1, REFERENCE_BYTES // (8 * len_k * (head_dim + head_dim_v)))  # float64 K and V of these heads
    for b in range(batch):
        for h0 in range(0, kv_heads, kv_per_chunk):
            h1 = min(kv_heads, h0 + kv_per_chunk)
            k64, v64 = k[b, h0:h1].to(dtype), v[b, h0:h1].to(dtype)  # [kv, Lk, D], [kv, Lk, Dv]
            qs = q[b, h0 * group:h1 * group].view(h1 - h0, group, len_q, head_dim)
            rows = max(1, REFERENCE_BYTES // (8 * (h1 - h0) * group * len_k))
            for r0 in range(0, len_q, rows):
                r1 = min(len_q, r0 + rows)
                s = torch.matmul(qs[:, :, r0:r1].to(dtype), k64.transpose(-1, -2)[:, None]) * scale
                if causal:
                    limit = torch.arange(r0, r1, device=q.device)[:, None] + (len_k - len_q)
                    s.masked_fill_(keys[None, :] > limit, float("-inf"))
                seen = torch.isfinite(s).any(-1, keepdim=True)
                p = torch.softmax(s.masked_fill(~seen, 0.0), dim=-1) * seen
                out[b, h0 * group:h1 * group, r0:r1] = torch.matmul(p, v64[:, None]).reshape(-1, r1 - r0, head_dim_v)
    return out


def head_dims(shape: dict) -> tuple[int, int]:
    """(q's and k's head dim, v's) of a case: 128 unless it says (head_dim, head_dim_v)."""
    d = shape.get("head_dim", 128)
    return d, shape.get("head_dim_v") or d


def _make_inputs(shape: dict, seed: int):
    """q, k, v in BHSD (for the reference) and as the kernel is to read them (layout and view)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    b, h, kvh, lq, lk = shape["batch"], shape["heads"], shape["kv_heads"] or shape["heads"], shape["len_q"], shape["len_k"]
    d, dv = head_dims(shape)
    q, k, v = draw((b, h, lq, d), gen), draw((b, kvh, lk, d), gen), draw((b, kvh, lk, dv), gen)
    return (q, k, v), tuple(_as_view(t, shape["layout"], shape["view"], gen) for t in (q, k, v))


def _as_view(t: torch.Tensor, layout: str, view: str, gen) -> torch.Tensor:
    """t (BHSD values) stored in `layout`, as a contiguous tensor, a strided view (one of three
    slices of a packed [.., 3, D] tensor, as q, k and v of a fused projection) or a view at a
    16-byte aligned offset into a larger buffer."""
    x = t if layout == "bhsd" else t.transpose(1, 2)
    if view == "contiguous":
        return x.contiguous()
    if view == "strided":
        packed = torch.full((*x.shape[:3], 3, x.shape[3]), float("nan"), dtype=x.dtype, device=x.device)
        which = int(torch.randint(3, (1,), generator=gen, device=x.device))
        packed[:, :, :, which] = x
        return packed[:, :, :, which]
    if view == "offset":
        offset = 8 * int(torch.randint(1, 64, (1,), generator=gen, device=x.device))  # elements: 16-byte multiples
        flat = torch.full((x.numel() + offset + 64,), float("nan"), dtype=x.dtype, device=x.device)
        y = flat[offset:offset + x.numel()].view(x.shape)
        y.copy_(x)
        return y
    raise ValueError(f"view: unknown {view!r}")


def _to_bhsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t if layout == "bhsd" else t.transpose(1, 2)


def check(stage: int, shape: dict, seed: int, *, out_view: str = "contiguous", repeat: bool = False) -> dict:
    """One stage on one shape against float64: the output (poisoned first) within MAX_REL_ERR, every
    element written, rows that see no key exactly 0, memory around a strided out untouched, and
    (repeat=True) a second launch identical bit for bit."""
    s = _stage(stage)
    layout = shape["layout"]
    (q, k, v), (qx, kx, vx) = _make_inputs(shape, seed)
    d, dv = head_dims(shape)
    scale = 1 / math.sqrt(d)
    if out_view == "strided":  # O as one slice of a wider buffer: the gaps must stay NaN
        wide = torch.full((*qx.shape[:3], 2, dv), float("nan"), dtype=qx.dtype, device=qx.device)
        out = wide[:, :, :, 0]
    else:
        out = torch.full((*qx.shape[:3], dv), float("nan"), dtype=qx.dtype, device=qx.device)
    hopattn.attention(qx, kx, vx, causal=shape["causal"], stage=s.number, layout=layout, out=out)
    torch.cuda.synchronize()
    o = _to_bhsd(out, layout)
    assert not o.isnan().any(), f"{int(o.isnan().sum())} output elements unwritten or NaN"
    if out_view == "strided":
        assert wide[:, :, :, 1].isnan().all(), "the kernel wrote into memory between the rows of a strided out"
    key = (seed, tuple(sorted(shape.items())))
    if _REFERENCE.get("key") != key:
        _REFERENCE.clear()
        _REFERENCE.update(key=key, ref=reference(q, k, v, causal=shape["causal"], scale=scale))
    ref = _REFERENCE["ref"]
    err = ((o.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()
    assert err < MAX_REL_ERR, f"relative error {err:.2e} against float64 (limit {MAX_REL_ERR})"
    if shape["causal"] and shape["len_q"] > shape["len_k"]:
        blind = shape["len_q"] - shape["len_k"]  # queries 0 .. Lq - Lk - 1 see no key
        assert torch.count_nonzero(o[:, :, :blind]) == 0, "a query that sees no key got a non-zero output"
    if repeat:
        again = torch.full_like(out, float("nan"))
        hopattn.attention(qx, kx, vx, causal=shape["causal"], stage=s.number, layout=layout, out=again)
        assert torch.equal(out, again), "two launches on the same inputs differ (a race?)"
    return {"rel_err": err}


def peak_score(shape: dict, seed: int) -> float:
    """The largest |scale q·k| the inputs of a case reach (the tests' inputs must exercise the
    softmax's range, not just small scores)."""
    (q, k, _), _ = _make_inputs(shape, seed)
    return ((q[0, 0].float() @ k[0, 0].float().T) / math.sqrt(q.shape[3])).abs().max().item()


def rejects(stage: int, case: str) -> str:
    """A bad input of the given kind is refused before any launch, and the process's CUDA context
    still works afterwards (a valid call right after succeeds). Returns the error message."""
    s = _stage(stage)
    good = torch.randn(1, 2, 256, 128, device="cuda").to(torch.bfloat16)
    if case == "misaligned":  # a contiguous view 2 bytes past a 16-byte boundary
        flat = torch.randn(good.numel() + 8, device="cuda").to(torch.bfloat16)
        bad = flat[1:1 + good.numel()].view(good.shape)
        args, kwargs, error = (bad, good, good), {}, ValueError
    elif case == "misaligned_out":
        flat = torch.empty(good.numel() + 8, device="cuda", dtype=torch.bfloat16)
        args, kwargs, error = (good, good, good), {"out": flat[4:4 + good.numel()].view(good.shape)}, ValueError
    elif case == "cpu":
        args, kwargs, error = (good.cpu(), good.cpu(), good.cpu()), {}, ValueError
    elif case == "fp16":
        args, kwargs, error = (good.half(), good.half(), good.half()), {}, TypeError
    elif case == "fp32":
        args, kwargs, error = (good.float(), good.float(), good.float()), {}, TypeError
    elif case == "out_aliases_q":
        args, kwargs, error = (good, good.clone(), good.clone()), {"out": good}, ValueError
    else:
        raise ValueError(f"case: unknown {case!r}")
    message = None
    for entry in ("function", "op"):
        try:
            if entry == "function":
                hopattn.attention(*args, stage=s.number, **kwargs)
            elif "out" in kwargs:
                torch.ops.hopattn.attention_out(*args, kwargs["out"], False, None, s.number, "bhsd")
            else:
                torch.ops.hopattn.attention(*args, False, None, s.number, "bhsd")
        except error as err:
            message = str(err)
        else:
            raise AssertionError(f"{case} input accepted through the {entry} (expected {error.__name__})")
    torch.cuda.synchronize()
    out = hopattn.attention(good, good, good, stage=s.number)
    torch.cuda.synchronize()
    assert not out.isnan().any(), "a valid call after the rejected one gave NaN"
    return message


def empty_and_degenerate(stage: int, head_dim: int = 128, head_dim_v: int | None = None) -> None:
    """Batch, heads or queries of 0 give an empty result; no keys gives zeros (every row sees none)."""
    s = _stage(stage)
    d, dv = head_dim, head_dim_v or head_dim

    def empty(*shape, dim=d):
        return torch.empty(*shape, dim, device="cuda", dtype=torch.bfloat16)

    x, xv = torch.randn(2, 3, 256, d, device="cuda").to(torch.bfloat16), empty(2, 3, 256, dim=dv).normal_()
    for shape in ((0, 3, 256), (2, 0, 256)):
        assert hopattn.attention(empty(*shape), empty(*shape), empty(*shape, dim=dv), stage=s.number).shape == (
            *shape, dv)
    if s.tails:
        none = empty(2, 3, 0)
        assert hopattn.attention(none, x, xv, stage=s.number).shape == (2, 3, 0, dv)
        out = hopattn.attention(x, none, empty(2, 3, 0, dim=dv), stage=s.number)
        assert out.shape == (2, 3, 256, dv) and torch.count_nonzero(out) == 0, "no keys: every row must be 0"
    torch.cuda.synchronize()


def compiled_calls(stage: int, seed: int) -> None:
    """torch.compile(fullgraph=True) of a call, with and without out=, equals the eager call."""
    s = _stage(stage)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = draw((2, 3, 256, 128), gen, 1.0), draw((2, 3, 512, 128), gen, 1.0), draw((2, 3, 512, 128), gen, 1.0)
    eager = hopattn.attention(q, k, v, stage=s.number)
    compiled = torch.compile(lambda a, b, c: hopattn.attention(a, b, c, stage=s.number) * 2, fullgraph=True)
    assert torch.equal(compiled(q, k, v), eager * 2), "compiled call differs"

    def into(a, b, c, o):
        hopattn.attention(a, b, c, stage=s.number, out=o)
        return o * 2

    out = torch.empty_like(q)
    assert torch.equal(torch.compile(into, fullgraph=True)(q, k, v, out), eager * 2), "compiled out= call differs"
    assert torch.equal(out, eager), "compiled out= call did not write out"


def custom_scale(stage: int, seed: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (draw((1, 2, 128, 128), gen, 1.0) for _ in range(3))
    out = hopattn.attention(q, k, v, stage=stage, scale=0.3)
    ref = reference(q, k, v, causal=False, scale=0.3)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < MAX_REL_ERR, f"relative error {err:.2e} with scale 0.3"


def stage_info(stage: int) -> dict:
    return hopattn.stage_info(stage)


def layouts_agree(stage: int, seed: int, causal: bool, head_dim: int = 128, head_dim_v: int | None = None) -> None:
    """BSHD read in place gives exactly the BHSD result (the same arithmetic, other addresses)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    d, dv = head_dim, head_dim_v or head_dim
    q, k, v = draw((2, 300, 5, d), gen), draw((2, 300, 5, d), gen), draw((2, 300, 5, dv), gen)
    bshd = hopattn.attention(q, k, v, causal=causal, stage=stage, layout="bshd")
    bhsd = hopattn.attention(*(t.transpose(1, 2).contiguous() for t in (q, k, v)), causal=causal, stage=stage)
    assert torch.equal(bshd.transpose(1, 2), bhsd), "the layout changed the result"
    # A contiguous BSHD tensor with one head: its head stride is whatever torch left there.
    one = [t[:, :, :1].transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]
    assert one[0].is_contiguous() and one[0].stride(2) != d  # the case that was once refused
    single = hopattn.attention(*one, causal=causal, stage=stage, layout="bshd")
    assert torch.equal(single, bshd[:, :, :1]), "a one-head BSHD tensor gave another result"


def strided_equals_contiguous(stage: int, seed: int) -> None:
    """A head-dim slice of a wider tensor (rows 512 bytes apart) is read in place, bit for bit."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    wide = draw((2, 3, 640, 256), gen)
    q, k = wide[..., :128], wide[..., 128:]
    v = draw((2, 3, 640, 128), gen)
    assert torch.equal(hopattn.attention(q, k, v, stage=stage),
                       hopattn.attention(q.contiguous(), k.contiguous(), v, stage=stage)), "strided view differs"


def lse_matches(stage: int, shape: dict, seed: int) -> dict:
    """The log-sum-exp against float64: ln sum_j exp(scale q·k_j) over the keys a row sees, -inf
    for a row that sees none; and the output returned with it equals the output without it."""
    layout = shape["layout"]
    (q, k, v), (qx, kx, vx) = _make_inputs(shape, seed)
    scale = 1 / math.sqrt(q.shape[3])
    out, lse = hopattn.attention(qx, kx, vx, causal=shape["causal"], stage=stage, layout=layout, return_lse=True)
    plain = hopattn.attention(qx, kx, vx, causal=shape["causal"], stage=stage, layout=layout)
    assert torch.equal(out, plain), "asking for the log-sum-exp changed the output"
    group = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(group, dim=1)
    s = torch.matmul(q.double(), k64.transpose(-1, -2)) * scale
    if shape["causal"]:
        lq, lk = q.shape[2], k.shape[2]
        limit = torch.arange(lq, device=q.device)[:, None] + (lk - lq)
        s.masked_fill_(torch.arange(lk, device=q.device)[None, :] > limit, float("-inf"))
    ref = torch.logsumexp(s, dim=-1)
    seen = torch.isfinite(ref)
    assert lse.shape == ref.shape and lse.dtype == torch.float32
    assert torch.equal(torch.isinf(lse) & (lse < 0), ~seen), "-inf exactly for the rows that see no key"
    err = (lse.double()[seen] - ref[seen]).abs().max().item() if seen.any() else 0.0
    assert err < 2e-2, f"log-sum-exp off by {err:.2e}"
    return {"max_abs_err": err}


def gqa_equals_repeated_heads(stage: int, seed: int, causal: bool, head_dim: int = 128,
                              head_dim_v: int | None = None) -> None:
    """K/V with fewer heads give exactly what the same K/V repeated to q's heads give."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    d, dv = head_dim, head_dim_v or head_dim
    for kv_heads in (1, 2, 4):
        q = draw((2, 8, 700, d), gen)
        k, v = draw((2, kv_heads, 900, d), gen), draw((2, kv_heads, 900, dv), gen)
        grouped = hopattn.attention(q, k, v, causal=causal, stage=stage)
        group = 8 // kv_heads
        repeated = hopattn.attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), causal=causal,
                                     stage=stage)
        assert torch.equal(grouped, repeated), f"kv_heads={kv_heads}: grouped and repeated K/V differ"


# Per key block (128 keys), the exponent (log2 units) every query's score carries against it: inputs
# whose row maxima move far, which random inputs never do. They reach the paths a softmax takes only
# then: stage 06's rescale past its threshold, and stage 21's rebase (rising) and recomputed tile
# (jump: 2^160 overflows fp32).
# jump-window: one key of a block about 127 log2 units above the rest, so its exponential against the
# earlier reference is finite, above 2^126, and the per-thread sum holding it stays finite; a rebase by
# its size needs a factor below fp32's smallest normal number (ex2.approx flushes it to 0: stage 21's
# first rebase erased such rows). A whole block that high would overflow the sums instead ("jump").
MAXIMA_PROFILES = {"rising": 30.0, "rising-slow": 5.0, "jump": 160.0, "jump-window": 127.0, "falling": 40.0}


def maxima_inputs(kind: str, shape: tuple[int, int, int, int], seed: int, *, scale: float | None = None,
                  step: float | None = None, jump_block: int = 5, kv_heads: int | None = None, head_dim: int = 128,
                  head_dim_v: int | None = None):
    """q along one direction and k along it with a length per key block that sets its scores' exponent
    (MAXIMA_PROFILES, or `step`; calibrated for the softmax `scale`, default 1/sqrt(head_dim)), plus a
    little noise; v random (of head_dim_v, default head_dim). bf16, BHSD (research/softmax_ranges.py
    uses them too)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    b, h, lq, lk = shape
    hk = kv_heads or h
    d, dv = head_dim, head_dim_v or head_dim
    scale = 1 / math.sqrt(d) if scale is None else scale
    block = torch.arange(lk, device="cuda", dtype=torch.float64) // 128
    step = MAXIMA_PROFILES[kind] if step is None else step
    jump = torch.where(block == jump_block, step, 0.0)
    keys = torch.arange(lk, device="cuda")
    one_key = torch.where(keys == min(lk - 1, jump_block * 128 + 37), step, 0.0)
    exponent = {"rising": block * step, "rising-slow": block * step, "jump": jump, "jump-window": one_key,
                "falling": torch.where(block == 0, step, -8.0 * block)}[kind]
    log2_per_raw = scale / math.log(2)  # a raw q·k times this is its exponent in log2 units
    direction = torch.randn(d, generator=gen, device="cuda", dtype=torch.float64)
    direction /= direction.norm()
    q = 8.0 * direction + 0.05 * torch.randn(b, h, lq, d, generator=gen, device="cuda", dtype=torch.float64)
    k_len = exponent / (8.0 * log2_per_raw)
    k = k_len[None, None, :, None] * direction + 0.05 * torch.randn(b, hk, lk, d, generator=gen, device="cuda",
                                                                    dtype=torch.float64)
    return q.to(torch.bfloat16), k.to(torch.bfloat16), draw((b, hk, lk, dv), gen)


def moving_maxima(stage: int, kind: str, causal: bool, seed: int, head_dim: int = 128,
                  head_dim_v: int | None = None) -> dict:
    """One stage against float64 on maxima_inputs at an odd length (2 x 2 x 1000 x 3001). Outputs poisoned."""
    q, k, v = maxima_inputs(kind, (2, 2, 1000, 3001), seed, head_dim=head_dim, head_dim_v=head_dim_v)
    out = torch.full((*q.shape[:3], v.shape[3]), float("nan"), dtype=q.dtype, device=q.device)
    hopattn.attention(q, k, v, causal=causal, stage=stage, out=out)
    torch.cuda.synchronize()
    assert not out.isnan().any(), f"{int(out.isnan().sum())} output elements unwritten or NaN"
    ref = reference(q, k, v, causal=causal, scale=1 / math.sqrt(head_dim))
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < MAX_REL_ERR, f"relative error {err:.2e} against float64 (limit {MAX_REL_ERR})"
    return {"rel_err": err}


# --- the numeric-range fuzz (numeric_cases.py) ---------------------------------------------------

SMALLEST_NORMAL = 2.0 ** -126  # fp32's and bf16's: below it a value may be flushed to zero


def _student_t(shape, dof: int, gen) -> torch.Tensor:
    """Student's t with `dof` degrees of freedom: a normal over the root mean square of `dof` others."""
    z = torch.randn(shape, generator=gen, device="cuda", dtype=torch.float64)
    chi = torch.randn((dof, *shape), generator=gen, device="cuda", dtype=torch.float64).square().mean(0)
    return z / chi.sqrt()


def numeric_inputs(case: dict, seed: int):
    """q, k, v (bf16, BHSD) for a NumericCase (as a dict), drawn from `seed`."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    kind, scale, mag = case["kind"], case["scale"], case["magnitude"]
    b, h, hk, lq, lk = case["batch"], case["heads"], case["kv_heads"], case["len_q"], case["len_k"]
    d, dv = head_dims(case)
    qs, ks, vs = (b, h, lq, d), (b, hk, lk, d), (b, hk, lk, dv)
    if kind in ("rising", "falling", "jump", "jump_window"):
        profile = {"jump_window": "jump-window"}.get(kind, kind)
        return maxima_inputs(profile, (b, h, lq, lk), seed, scale=scale, step=case["step"],
                             jump_block=case["block"], kv_heads=hk, head_dim=d, head_dim_v=dv)

    def normal(shape, m=mag):
        return torch.randn(shape, generator=gen, device="cuda", dtype=torch.float64) * m

    if kind == "student_t":  # tails cut at 10^6: scores stay inside fp32's range at every scale drawn
        q, k, v = (_student_t(s, case["dof"], gen).clamp(-1e6, 1e6) * mag for s in (qs, ks, vs))
    elif kind.startswith("outlier"):
        # One key per K/V head, at a random row of the chosen tile, along a direction every query leans
        # towards: its score stands `step` log2 units (at this scale) above a typical one.
        q, k, v = normal(qs), normal(ks), normal(vs)
        direction = torch.randn(d, generator=gen, device="cuda", dtype=torch.float64)
        direction /= direction.norm()
        q += 2.0 * mag * direction
        row = min(lk - 1, case["block"] * 128 + int(torch.randint(128, (1,), generator=gen, device="cuda")))
        height = case["step"] * math.log(2) / scale / (2.0 * mag)  # length of the key along the direction
        k[:, :, row] = height * direction
    elif kind == "equal":
        q, v = normal(qs), normal(vs)
        k = normal((b, hk, 1, d)).expand(ks).contiguous()
    elif kind == "subnormal_qk":
        q, k, v = normal(qs, 1e-39), normal(ks, 1e-39), normal(vs)
    elif kind == "subnormal_v":
        q, k, v = normal(qs), normal(ks), normal(vs, 1e-39)
    elif kind == "normal":
        q, k, v = normal(qs), normal(ks), normal(vs)
    else:
        raise ValueError(f"kind: unknown {kind!r}")
    return tuple(t.clamp(-3e38, 3e38).to(torch.bfloat16) for t in (q, k, v))


def largest_exponent(q, k, scale: float) -> float:
    """The largest |scale q·k| of the inputs in log2 units (float64), over all heads and rows."""
    group = q.shape[1] // k.shape[1]
    top = 0.0
    for h in range(k.shape[1]):
        s = torch.matmul(q[:, h * group:(h + 1) * group].double(), k[:, h:h + 1].double().transpose(-1, -2))
        top = max(top, s.abs().max().item())
    return top * scale / math.log(2)


def numeric_check(stage: int, case: dict, seed: int, exponent_limit: float | None = None) -> dict:
    """One stage on one numeric case: the output (poisoned first) within the bound that a float32
    computation on the same bf16 inputs sets, 2 e32 + 2^-7 max|v| + 2^-126, where e32 is the float32
    computation's largest error against float64 (2^-7 max|v|: rounding P and the output to bf16, each
    at most 2^-8 of the largest |v|; 2^-126: values below fp32's smallest normal may flush to 0). Rows
    that see no key must be exactly 0."""
    q, k, v = numeric_inputs(case, seed)
    if exponent_limit is not None:  # a stage whose documented range ends there: not launched beyond it
        top = largest_exponent(q, k, case["scale"])
        if top > exponent_limit:
            return {"beyond": top}
    kx, vx = k, v
    if k.shape[1] != q.shape[1] and not _stage(stage).gqa:  # a stage before grouped K/V heads: repeated
        kx, vx = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    out = torch.full((*q.shape[:3], v.shape[3]), float("nan"), dtype=q.dtype, device=q.device)
    hopattn.attention(q, kx, vx, causal=case["causal"], scale=case["scale"], stage=stage, out=out)
    torch.cuda.synchronize()
    assert not out.isnan().any(), f"{int(out.isnan().sum())} output elements unwritten or NaN"
    key = ("numeric", seed, tuple(sorted(case.items())))
    if _REFERENCE.get("key") != key:
        _REFERENCE.clear()
        ref = reference(q, k, v, causal=case["causal"], scale=case["scale"])
        ref32 = reference(q, k, v, causal=case["causal"], scale=case["scale"], dtype=torch.float32)
        e32 = (ref32.double() - ref).abs().max().item()
        _REFERENCE.update(key=key, ref=ref, e32=e32)
    ref, e32 = _REFERENCE["ref"], _REFERENCE["e32"]
    v_max = v.double().abs().max().item()
    bound = 2 * e32 + 2.0 ** -7 * v_max + SMALLEST_NORMAL
    err = (out.double() - ref).abs().max().item()
    assert err <= bound, (f"largest error {err:.3g} against float64 above the float32-derived bound {bound:.3g} "
                          f"(float32's own error {e32:.3g}, max|v| {v_max:.3g})")
    if case["causal"] and case["len_q"] > case["len_k"]:
        blind = case["len_q"] - case["len_k"]
        assert torch.count_nonzero(out[:, :, :blind]) == 0, "a query that sees no key got a non-zero output"
    return {"err": err, "bound": bound, "e32": e32}


def refuses_head_dim(stage: int, head_dim: int, head_dim_v: int) -> str:
    """q and k of head_dim with v of head_dim_v, a pair the stage does not serve, are refused before
    any launch, through the function and the op alike, and the CUDA context still works after.
    Returns the message."""
    q = torch.randn(1, 2, 256, head_dim, device="cuda").to(torch.bfloat16)
    v = torch.randn(1, 2, 256, head_dim_v, device="cuda").to(torch.bfloat16)
    message = None
    for entry in ("function", "op"):
        try:
            if entry == "function":
                hopattn.attention(q, q, v, stage=stage)
            else:
                torch.ops.hopattn.attention(q, q, v, False, None, stage, "bhsd")
        except ValueError as err:
            message = str(err)
        else:
            raise AssertionError(f"head dims ({head_dim}, {head_dim_v}) accepted through the {entry}")
    torch.cuda.synchronize()
    good = torch.randn(1, 2, 256, 128, device="cuda").to(torch.bfloat16)
    assert not hopattn.attention(good, good, good, stage=stage).isnan().any(), "a valid call after the refused one"
    torch.cuda.synchronize()
    return message
