"""The backward pass of a run: its inputs, its float64 reference, its check and its entries.

Inputs are fresh random each run (q, k, v and the upstream gradient dout, bf16, never zeros). The
reference is the float64 gradient of exact attention for the same inputs, on a sample of
(batch, K/V head) groups: every query head that reads the sampled K/V head, all of their rows (dK
and dV of a key sum over every query row, so rows cannot be sampled as the forward's check does).
Each arm's (dq, dk, dv) is checked against it (relative Frobenius error of each gradient over the
sample), every element of each for NaN/Inf (their memory is poisoned with NaN first, as the
forward's output is), and a deterministic mode twice for bit-identical gradients. Only arms that
pass are timed, their backward alone.

The runner (bench.runner) drives this through the same steps as the forward (runner.ForwardPass).
"""

from __future__ import annotations

import math

from hopattn.records import results

from bench import correctness, stats
from bench.shapes import Shape, backward_tflops

GRADIENTS = results.GRADIENTS  # ("dq", "dk", "dv")
# bf16 gradients pass through more roundings than the forward's output (P and dS go to bf16 before
# their GEMMs, the gradients are stored in bf16): a correct kernel lands near 2-5e-3; a tiling,
# masking or accumulation bug lands near 1.
TOLERANCE = 2e-2
MAX_GROUPS = 3  # (batch, K/V head) groups checked per shape: the first, the last, one at random
ROW_CHUNK = 512  # float64 score rows computed at once (bounds the reference's memory)


class GradReference:
    """float64 dq, dk, dv of softmax(scale·q kᵀ) v for upstream dout (BHSD inputs, K/V heads grouped),
    for the sampled (batch, K/V head) groups, computed once per shape."""

    def __init__(self, torch, q, k, v, dout, causal: bool, scale: float, groups):
        self.torch, self.groups = torch, tuple(groups)
        heads, kv_heads, len_q, len_k = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
        self.group = heads // kv_heads  # query head h reads K/V head h // group
        cols = torch.arange(len_k, device=q.device)
        self.values = {}
        for b, hk in self.groups:
            kk, vv = k[b, hk].double(), v[b, hk].double()
            dk, dv = torch.zeros_like(kk), torch.zeros_like(vv)
            dqs = []
            for h in range(hk * self.group, (hk + 1) * self.group):
                parts = []
                for start in range(0, len_q, ROW_CHUNK):
                    qq = q[b, h, start:start + ROW_CHUNK].double()
                    do = dout[b, h, start:start + ROW_CHUNK].double()
                    s = (qq @ kk.T) * scale
                    if causal:  # bottom-right aligned: query i sees keys j <= i + Lk - Lq
                        rows = torch.arange(start, start + qq.shape[0], device=q.device)
                        s.masked_fill_(cols[None, :] > rows[:, None] + (len_k - len_q), -math.inf)
                    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row that sees no key: P = 0
                    o = p @ vv
                    ds = p * (do @ vv.T - (do * o).sum(dim=-1, keepdim=True))  # dS = P ∘ (dP − D)
                    parts.append((ds @ kk) * scale)
                    dk += (ds.T @ qq) * scale
                    dv += p.T @ do
                dqs.append(torch.cat(parts))
            self.values[(b, hk)] = (torch.stack(dqs), dk, dv)

    def rel_errs(self, grads) -> dict:
        """{dq, dk, dv: ‖got − ref‖ / ‖ref‖} (Frobenius, float64) over the sample; inf for a gradient
        with any NaN/Inf anywhere. ``grads``: BHSD (dq, dk, dv)."""
        torch = self.torch
        out = {}
        for i, name in enumerate(GRADIENTS):
            got_all = grads[i]
            if not bool(torch.isfinite(got_all).all()):
                out[name] = math.inf
                continue
            num = den = 0.0
            for (b, hk), ref in self.values.items():
                got = (got_all[b, hk * self.group:(hk + 1) * self.group] if name == "dq" else got_all[b, hk]).double()
                num += float(((got - ref[i]) ** 2).sum())
                den += float((ref[i] ** 2).sum())
            out[name] = math.sqrt(num / den) if den > 0 else math.inf
        return out


def verdict(errors: dict, tolerance: float = TOLERANCE) -> str | None:
    """None when every gradient's error is acceptable, otherwise why the arm is reported wrong."""
    bad = [g for g in GRADIENTS if not math.isfinite(errors[g])]
    if bad:
        return f"{', '.join(bad)} {'has' if len(bad) == 1 else 'have'} NaN or Inf (a part not written, or an overflow)"
    worst = max(GRADIENTS, key=lambda g: errors[g])
    if errors[worst] >= tolerance:
        return (f"relative error of {worst} {errors[worst]:.3g} vs the float64 gradients "
                f"(tolerance {tolerance:g})")
    return None


def poisoned_call(torch, fn, like):
    """fn() with the caching allocator primed with a NaN block the size of each gradient (of q, k, v:
    ``like``), so elements a backward never writes read as NaN. Returns (result, poisoned): whether
    every gradient landed on a NaN block."""
    baits = [torch.full((t.numel(),), float("nan"), dtype=t.dtype, device=t.device) for t in like]
    ptrs = {b.data_ptr() for b in baits}
    del baits
    result = fn()
    return result, all(g.data_ptr() in ptrs for g in result)


def _finite(x):
    return x if x is not None and math.isfinite(x) else None


class BackwardPass:
    """The backward: (dq, dk, dv) = backward of attention(q, k, v) for dout, its FLOPs 2.5x the forward's."""

    name = "backward"
    suffix = " backward"
    references = results.BACKWARD_REFERENCES

    def inputs(self, s, shape: Shape):
        torch = s.torch
        dims = ((shape.heads, shape.len_q), (shape.kv, shape.len_k), (shape.kv, shape.len_k), (shape.heads, shape.len_q))
        return tuple(torch.randn(shape.batch, heads, n, shape.head_dim, device=s.device, dtype=torch.bfloat16)
                     for heads, n in dims)

    def reference(self, s, shape: Shape, inputs, causal: bool, scale: float):
        groups = correctness.choose_sample(shape.batch, shape.kv, 1, s.rng, max_pairs=MAX_GROUPS).pairs
        ref = GradReference(s.torch, *inputs, causal, scale, groups)
        total = shape.batch * shape.kv
        what = "all K/V heads" if len(groups) == total else f"{len(groups)} of {total} K/V heads"
        per = "" if shape.heads == shape.kv else f", the {shape.heads // shape.kv} query heads of each"
        return ref, f"{what}{per}, all rows (dq, dk, dv)"

    def check(self, s, arm, inputs, ref, causal: bool, scale: float):
        """(launch, errors, poisoned, problem): the arm prepared and run once on poisoned memory."""
        torch = s.torch
        q, k, v, dout = inputs
        launch = arm.prepare_backward(q, k, v, dout, causal, scale)

        def once():
            with launch.context():
                return poisoned_call(torch, launch.fn, (q, k, v))

        result, poisoned = correctness.explained(once)
        s.synchronize()
        grads = launch.to_bhsd(result)
        if len(grads) != 3:
            raise RuntimeError(f"expected (dq, dk, dv), got {len(grads)} tensors")
        for name, g, t in zip(GRADIENTS, grads, (q, k, v)):
            if tuple(g.shape) != tuple(t.shape):
                raise RuntimeError(f"{name} has shape {tuple(g.shape)}, its input {tuple(t.shape)}")
        errors = ref.rel_errs(grads)
        problem = None
        if getattr(arm, "deterministic", False) and all(math.isfinite(e) for e in errors.values()):
            with launch.context():
                again = launch.to_bhsd(launch.fn())
            s.synchronize()
            differ = [n for n, a, b in zip(GRADIENTS, grads, again) if not torch.equal(a, b)]
            if differ:
                problem = (f"deterministic mode: a second run gave other {', '.join(differ)} "
                           f"(not bit-identical)")
        return launch, errors, poisoned, problem

    def verdict(self, errors: dict) -> str | None:
        return verdict(errors)

    def describe(self, errors: dict) -> str:
        return "rel err " + ", ".join(f"{g} {errors[g]:.2e}" for g in GRADIENTS)

    def raw_errors(self, errors: dict) -> dict:
        return {"rel_errs": {g: _finite(errors[g]) for g in GRADIENTS}}

    def entry(self, arm, shape: Shape, causal: bool, run_id: str, status: str, reason: str | None = None,
              timing_fields: dict | None = None, errors: dict | None = None, ratios: dict | None = None,
              vs_default: float | None = None) -> dict:
        """A backward entry (results file, section "backward"); timing fields stay null unless timed."""
        rel_errs = {g: _finite(errors[g]) for g in GRADIENTS} if errors else None
        worst = max(errors.values()) if errors else None
        deterministic = bool(getattr(arm, "deterministic", False))
        entry = {"kind": arm.kind, "name": arm.name, "label": arm.label, "run_id": run_id, "shape": shape.name,
                 **shape.dims, "causal": causal, "deterministic": deterministic, "status": status,
                 "reason": reason, "source_hash": arm.source_hash if arm.kind == "stage" else None,
                 "median_ms": None, "min_ms": None, "max_ms": None, "spread_pct": None, "samples": None,
                 "tflops": None, "rel_err": _finite(worst), "rel_errs": rel_errs, "ratios": None, "vs_default": None}
        if status == "ok":
            entry.update(timing_fields)
            entry["tflops"] = backward_tflops(shape, causal, timing_fields["median_ms"])
            entry["ratios"] = ratios or {}
            entry["vs_default"] = vs_default if arm.kind == "stage" and deterministic else None
        return entry

    def timed_entry(self, arm, key: str, shape: Shape, causal: bool, run_id: str, fields: dict, errors: dict,
                    round_ms: dict) -> dict:
        """The entry of an arm timed in this configuration: ratios to every backward peer timed beside
        it (per round ref/arm, then the median), and a deterministic mode's speed over its default's."""
        ratios = {ref: stats.ratio(round_ms[key], round_ms[f"peer:{ref}"]) for ref in self.references
                  if f"peer:{ref}" in round_ms}
        default = getattr(arm, "default_key", None) if getattr(arm, "deterministic", False) else None
        vs_default = stats.ratio(round_ms[key], round_ms[default]) if default in round_ms else None
        return self.entry(arm, shape, causal, run_id, "ok", timing_fields=fields, errors=errors, ratios=ratios,
                          vs_default=vs_default)


BACKWARD = BackwardPass()
