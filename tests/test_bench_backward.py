"""The backward's half of python -m bench, on the CPU: the FLOP count, the float64 gradient reference,
the arms (the backward alone is timed; an inference-only build is missing, not failed), the run of one
configuration (statuses, ratios, the deterministic mode's own entry and its check), the record's
backward section, the CLI's selection and the whole run's glue with fakes."""

from __future__ import annotations

import dataclasses
import math
import random
import sys
import types

import pytest
from hopattn import lineage
from hopattn.records import results
from hopattn.records.shapes import SHAPES, Shape, backward_flops, backward_tflops, flops
from test_bench_run import UnitTimer, fake_h200  # noqa: F401  (the fixture: torch.cuda as an H200's, on the CPU)

from bench import backward, backward_check, cli, report, runner
from bench.arms import Arm, Launch

torch = pytest.importorskip("torch")

SHAPE = Shape("tiny", 1, 2, 64, 64, 32)
RUN_ID = "20261202T120000Z"


def stage01():
    # the backward lineage's first stage, read alone (a later stage may be mid-edit in a working tree)
    return lineage.load_stage(lineage.BACKWARD_DIR / "01_baseline")


# --- FLOPs --------------------------------------------------------------------------------------


def test_backward_flops_are_two_and_a_half_forwards_halved_for_causal():
    s4 = SHAPES["4k"]
    forward = 4 * 8 * 16 * 4096 * 4096 * 128
    assert flops(s4, False) == forward
    assert backward_flops(s4, False) == 2.5 * forward == 10 * 8 * 16 * 4096 * 4096 * 128
    assert backward_flops(s4, True) == 1.25 * forward
    # B·L = 32k at every point: the work doubles with L
    assert backward_flops(SHAPES["8k"], False) == 2 * backward_flops(s4, False)
    assert backward_flops(SHAPES["16k"], True) == 4 * backward_flops(s4, True)
    assert backward_tflops(s4, False, 5.0) == pytest.approx(2.5 * forward / 5e-3 / 1e12)
    assert backward_tflops(s4, False, 5.0) == pytest.approx(549.76, abs=0.01)  # FA4's 4k, as the anchors read it


# --- the float64 reference ----------------------------------------------------------------------


def _autograd_grads(q, k, v, dout, causal, scale):
    """float64 autograd through plain attention (K/V heads repeated for the group)."""
    q, k, v, dout = (t.double().requires_grad_() for t in (q, k, v, dout))
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = (q @ kk.transpose(-1, -2)) * scale
    if causal:
        lq, lk = q.shape[2], k.shape[2]
        s = s.masked_fill(torch.arange(lk)[None, :] > torch.arange(lq)[:, None] + (lk - lq), -math.inf)
    out = torch.softmax(s, dim=-1).nan_to_num(0.0) @ vv
    return torch.autograd.grad(out, (q, k, v), dout)


@pytest.mark.parametrize("dims, causal", [
    ((1, 2, 64, 64, 0), False),
    ((2, 4, 96, 80, 2), True),    # grouped K/V heads, Lq > Lk: bottom-right, some rows see no key
    ((1, 2, 40, 130, 1), True),   # few queries over more keys
])
def test_reference_is_the_float64_gradient(dims, causal):
    b, h, lq, lk, kv = dims
    g = torch.Generator().manual_seed(1)
    q = torch.randn(b, h, lq, 16, generator=g).bfloat16()
    k, v = (torch.randn(b, kv or h, lk, 16, generator=g).bfloat16() for _ in range(2))
    dout = torch.randn(b, h, lq, 16, generator=g).bfloat16()
    want = _autograd_grads(q, k, v, dout, causal, 0.3)
    groups = [(bb, hk) for bb in range(b) for hk in range(kv or h)]
    ref = backward_check.GradReference(torch, q, k, v, dout, causal, 0.3, groups)
    errs = ref.rel_errs(want)
    assert set(errs) == {"dq", "dk", "dv"} and max(errs.values()) < 1e-12
    # the same gradients in bf16 are off by their rounding, well inside the tolerance
    rounded = ref.rel_errs(tuple(t.bfloat16() for t in want))
    assert 1e-4 < max(rounded.values()) < backward_check.TOLERANCE / 4
    # a wrong gradient is seen in that gradient only, and a NaN anywhere (even outside the sample) is inf
    bad = (want[0], want[1] * 1.1, want[2])
    assert ref.rel_errs(bad)["dk"] == pytest.approx(0.1, rel=1e-6) and ref.rel_errs(bad)["dq"] < 1e-12
    nan = want[2].clone()
    nan[-1, -1, -1, -1] = math.nan
    assert ref.rel_errs((want[0], want[1], nan))["dv"] == math.inf


def test_reference_samples_whole_groups():
    q = torch.randn(2, 8, 32, 16).bfloat16()
    kv = torch.randn(2, 2, 32, 16).bfloat16()
    ref = backward_check.GradReference(torch, q, kv, kv, q, False, 0.25, [(1, 1)])
    dq, dk, dv = ref.values[(1, 1)]
    assert dq.shape == (4, 32, 16) and dk.shape == dv.shape == (32, 16)  # every query head of K/V head 1


def test_verdict():
    ok = {"dq": 3e-3, "dk": 4e-3, "dv": 2e-3}
    assert backward_check.verdict(ok) is None
    assert "relative error of dk 0.05" in backward_check.verdict(dict(ok, dk=0.05))
    assert backward_check.verdict(dict(ok, dq=math.inf)) == "dq has NaN or Inf (a part not written, or an overflow)"
    assert backward_check.verdict(dict(ok, dq=math.inf, dv=math.inf)).startswith("dq, dv have NaN")


# --- the arms -----------------------------------------------------------------------------------


def _counting_sdpa(monkeypatch):
    calls = {"n": 0}
    real = torch.nn.functional.scaled_dot_product_attention

    def sdpa(*a, **k):
        calls["n"] += 1
        return real(*a, **k)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    return calls


def test_sdpa_backward_times_the_backward_alone(monkeypatch):
    calls = _counting_sdpa(monkeypatch)
    fa2 = backward.make_backward_peers(torch, ["fa2"])[0]
    q, k, v, dout = (torch.randn(1, 2, 32, 16) for _ in range(4))
    launch = fa2.prepare_backward(q, k, v, dout, True, 0.5)
    assert calls["n"] == 1  # the forward, once, in prepare
    with launch.context():  # the CPU has a flash backend, with a backward
        first = launch.fn()
        again = launch.fn()  # the graph is kept: every timed call is one whole backward
    assert calls["n"] == 1  # no forward inside the timed call
    want = _autograd_grads(q, k, v, dout, True, 0.5)
    for got, g, w in zip(first, again, want):
        assert torch.allclose(got.double(), w, atol=1e-5) and torch.equal(got, g)
    assert q.grad is None and not q.requires_grad  # the inputs are left as they were


def _fake_flash_module(monkeypatch, module_name, inference_only=False):
    """A stand-in for flash_attn_interface / flash_attn.cute: flash_attn_func on BSHD, returns (out, lse)."""
    calls = {"forward": 0}

    class Func(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, scale, causal):
            calls["forward"] += 1
            ctx.save_for_backward(q, k, v)
            ctx.args = (scale, causal)
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=scale)
            return out.transpose(1, 2).contiguous()

        @staticmethod
        def backward(ctx, dout):
            if inference_only:
                raise RuntimeError("mha_bwd, /src/hopper/flash_api_stable.cpp:1377, "
                                   "This flash attention build does not support backward.")
            q, k, v = (t.detach().transpose(1, 2).requires_grad_() for t in ctx.saved_tensors)
            with torch.enable_grad():
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=ctx.args[1],
                                                                       scale=ctx.args[0])
                grads = torch.autograd.grad(out, (q, k, v), dout.transpose(1, 2))
            return (*(g.transpose(1, 2) for g in grads), None, None)

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False):
        out = Func.apply(q, k, v, softmax_scale, causal)
        return out, torch.zeros(q.shape[0], q.shape[2], q.shape[1])

    module = types.ModuleType(module_name)
    module.flash_attn_func = flash_attn_func
    monkeypatch.setitem(sys.modules, module_name, module)
    return calls


def test_flash_attention_backward_through_autograd_on_bshd(monkeypatch):
    calls = _fake_flash_module(monkeypatch, "flash_attn.cute")
    fa4 = backward.BackwardFlashAttention(torch, "fa4")
    assert fa4.applies(SHAPE, False) is None and fa4.label == "FlashAttention-4 (CuTe DSL)"
    q, k, v, dout = (torch.randn(1, 2, 24, 16) for _ in range(4))
    launch = fa4.prepare_backward(q, k, v, dout, False, 0.5)
    grads = [launch.to_bhsd(launch.fn()) for _ in range(3)]
    assert calls["forward"] == 1
    for got, w in zip(grads[-1], _autograd_grads(q, k, v, dout, False, 0.5)):
        assert got.shape == w.shape and torch.allclose(got.double(), w, atol=1e-5)


def test_an_inference_only_build_is_missing_with_its_reason(monkeypatch):
    _fake_flash_module(monkeypatch, "flash_attn_interface", inference_only=True)
    fa3 = backward.BackwardFlashAttention(torch, "fa3")
    assert fa3.applies(SHAPE, False) is None  # it imports; only its backward says it is not there
    e = by_key(runner.run_config(session(), [fa3, FakeBackward("peer", "fa4", [1.0])], SHAPE, False, RUN_ID,
                                 backward_check.BACKWARD))
    entry = e["peer:fa3"]
    assert entry["status"] == "missing" and entry["median_ms"] is None and entry["rel_errs"] is None
    assert entry["reason"].startswith("this flash_attn_interface build has no backward (inference-only)")
    assert "does not support backward" in entry["reason"]
    assert e["peer:fa4"]["status"] == "ok" and "fa3" not in e["peer:fa4"]["ratios"]  # never estimated


def test_flash_attention_not_importable_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)  # import raises ImportError
    status, reason = backward.make_backward_peers(torch, ["fa3"])[0].applies(SHAPE, True)
    assert status == "missing" and "flash_attn_interface is not importable" in reason


def test_backward_peers_in_order_and_unknown_names_refused():
    arms = backward.make_backward_peers(torch, ["fa2", "cudnn", "fa4", "fa3"])
    assert [a.name for a in arms] == ["fa3", "fa4", "cudnn", "fa2"] == list(results.BACKWARD_PEERS)
    assert all(a.kind == "peer" and a.key == f"peer:{a.name}" for a in arms)
    with pytest.raises(ValueError, match="no backward peer 'flex'"):
        backward.make_backward_peers(torch, ["flex"])


def test_backward_stage_arms_one_per_mode():
    s = stage01()
    forward = backward.forward_for(lineage.discover())
    assert forward is not None and forward.lse and forward.number == max(x.number for x in lineage.discover() if x.lse)
    arms = backward.make_backward_stage_arms([s], (9, 0), "NVIDIA H200", {}, (False, True), forward)
    assert [(a.key, a.short, a.deterministic) for a in arms] == [
        ("stage:01", "stage 01", False), ("stage:01:deterministic", "stage 01 det", True)]
    assert arms[1].default_key == "stage:01" and arms[1].source_hash == s.source_hash() == arms[0].source_hash
    assert arms[1].label.endswith("(deterministic mode)")
    assert all(a.applies(SHAPES["8k"], causal) is None for a in arms for causal in (False, True))
    # a stage without a deterministic mode gets no arm for it
    plain = dataclasses.replace(s, deterministic=False)
    assert [a.key for a in backward.make_backward_stage_arms([plain], (9, 0), "H200", {}, (False, True), forward)] == [
        "stage:01"]
    assert backward.make_backward_stage_arms([plain], (9, 0), "H200", {}, (True,), forward) == []
    assert backward.make_backward_stage_arms([s], (9, 0), "H200", {}, (False,), forward)[0].key == "stage:01"


def test_backward_stage_arm_skips_and_failures():
    s = stage01()
    forward = backward.forward_for(lineage.discover())
    arm = backward.BackwardStageArm(s, (8, 0), "NVIDIA A100", forward=forward)
    status, reason = arm.applies(SHAPES["8k"], False)  # the backward itself is sm_80; its forward is not
    assert status == "skipped" and f"forward stage {forward.id}" in reason and "sm_90a" in reason
    arm = backward.BackwardStageArm(s, (9, 0), "NVIDIA H200", forward=forward, forward_error="build failed: x")
    assert arm.applies(SHAPES["8k"], True) == (
        "failed", f"forward stage {forward.id} (it gives the backward out and lse): build failed: x")
    arm = backward.BackwardStageArm(s, (9, 0), "NVIDIA H200", build_error="build failed: y", forward=forward)
    assert arm.applies(SHAPES["8k"], True) == ("failed", "build failed: y")
    assert backward.BackwardStageArm(s, (9, 0), "H200", forward=None).applies(SHAPES["4k"], False)[0] == "failed"
    det = backward.BackwardStageArm(dataclasses.replace(s, deterministic=False), (9, 0), "H200", deterministic=True,
                                    forward=forward)
    assert det.applies(SHAPES["4k"], False)[0] == "skipped"
    with pytest.raises(TypeError, match="prepare_backward"):
        arm.prepare(None, None, None, False, 1.0)


# --- one configuration --------------------------------------------------------------------------


class ScriptedTimer:
    def __init__(self):
        self.order = []

    def launches(self, fn, n):
        self.order.append(fn.arm)
        ms = fn.ms[min(len([a for a in self.order if a == fn.arm]) - 1, len(fn.ms) - 1)]
        return [ms] * n

    def one(self, fn):
        return fn.ms[0]


class FakeBackward(Arm):
    """float32 autograd through SDPA on the CPU standing in for a backward; `bug` breaks it."""

    def __init__(self, kind, name, ms, bug=None, skip=None, deterministic=False):
        self.kind, self.name, self.label = kind, name, f"label {name}"
        self.source_hash = "0123456789abcdef" if kind == "stage" else None
        self.ms, self.bug, self.skip, self.deterministic = ms, bug, skip, deterministic
        self.calls = 0

    @property
    def key(self):
        return f"{self.kind}:{self.name}" + (":deterministic" if self.deterministic else "")

    default_key = property(lambda self: f"{self.kind}:{self.name}")

    def applies(self, shape, causal):
        return self.skip

    def prepare_backward(self, q, k, v, dout, causal, scale):
        leaves = tuple(t.float().requires_grad_() for t in (q, k, v))
        with torch.enable_grad():
            out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale)

        def fn():
            self.calls += 1
            if self.bug == "raise":
                raise RuntimeError("backward launch failed\nsecond line")
            dq, dk, dv = (g.bfloat16() for g in torch.autograd.grad(out, leaves, dout.float(), retain_graph=True))
            if self.bug == "wrong-dk":
                dk = dk * 1.2
            if self.bug == "nan-dv":
                dv[0, 0, 3, 0] = math.nan
            if self.bug == "nondeterministic" and self.calls > 1:
                dq = dq + 1e-2
            return dq, dk, dv

        fn.ms, fn.arm = self.ms, self.key
        return Launch(fn=fn)


class _Null:
    def write(self, s):
        pass

    def flush(self):
        pass


def session(timer=None, rounds=4, launches=3):
    return runner.Session(torch=torch, device="cpu", timer=timer or ScriptedTimer(), log=report.Log(stream=_Null()),
                          rounds=rounds, launches=launches, rng=random.Random(0))


def by_key(entries):
    return {(f"{e['kind']}:{e['name']}" + (":deterministic" if e["deterministic"] else "")): e for e in entries}


def _run():
    return {"date": "2026-12-02T12:00:00Z", "git_commit": None, "git_dirty": None, "command": "python -m bench",
            "environment": {"gpu_name": "CPU test", "compute_capability": "9.0", "sm_count": 1, "driver": None,
                            "cuda": None, "torch": "x", "cudnn": None, "clocks_before": None, "clocks_after": None,
                            "max_sm_mhz": None, "power_limit_w": None}}


def test_backward_config_statuses_timing_ratios_and_the_deterministic_entry():
    arms = [
        FakeBackward("stage", "01", [4.0, 4.0, 2.0, 4.0]),
        FakeBackward("stage", "01", [6.0], deterministic=True),
        FakeBackward("stage", "02", [1.0], bug="wrong-dk"),
        FakeBackward("stage", "02", [1.0], bug="nondeterministic", deterministic=True),
        FakeBackward("stage", "03", [1.0], bug="nan-dv"),
        FakeBackward("stage", "04", [1.0], bug="raise"),
        FakeBackward("peer", "fa3", [1.0], skip=("missing", "not importable")),
        FakeBackward("peer", "fa4", [1.0]),
        FakeBackward("peer", "cudnn", [2.0]),
        FakeBackward("peer", "fa2", [3.0]),
    ]
    s = session()
    entries = runner.run_config(s, arms, SHAPE, True, RUN_ID, backward_check.BACKWARD)
    e = by_key(entries)
    assert list(e) == [a.key for a in arms]
    ok = e["stage:01"]
    assert ok["status"] == "ok" and ok["deterministic"] is False and ok["median_ms"] == 4.0 and ok["samples"] == 4
    assert ok["tflops"] == pytest.approx(2.5 * flops(SHAPE, True) / 4e-3 / 1e12)  # 2.5x, causal halved
    assert ok["ratios"] == {"fa4": 0.25, "cudnn": 0.5, "fa2": 0.75}  # every backward peer timed beside it
    assert ok["vs_default"] is None and ok["source_hash"] == "0123456789abcdef"
    assert set(ok["rel_errs"]) == {"dq", "dk", "dv"} and ok["rel_err"] == max(ok["rel_errs"].values()) < 2e-2
    det = e["stage:01:deterministic"]
    assert det["status"] == "ok" and det["deterministic"] is True and det["median_ms"] == 6.0
    assert det["vs_default"] == pytest.approx(4.0 / 6.0)  # what determinism costs, paired by round
    assert det["ratios"]["fa4"] == pytest.approx(1 / 6)

    wrong = e["stage:02"]
    assert wrong["status"] == "wrong" and "relative error of dk" in wrong["reason"] and wrong["median_ms"] is None
    assert wrong["rel_errs"]["dk"] > 0.1 and wrong["rel_err"] == wrong["rel_errs"]["dk"]
    nondet = e["stage:02:deterministic"]
    assert nondet["status"] == "wrong" and "not bit-identical" in nondet["reason"] and "dq" in nondet["reason"]
    nan = e["stage:03"]
    assert nan["status"] == "wrong" and nan["reason"].startswith("dv has NaN")
    assert nan["rel_errs"]["dv"] is None and nan["rel_err"] is None
    assert e["stage:04"]["status"] == "failed" and e["stage:04"]["reason"] == "RuntimeError: backward launch failed"
    assert e["peer:fa3"]["status"] == "missing" and e["peer:fa3"]["rel_errs"] is None
    assert e["peer:fa2"]["ratios"] == {"fa4": pytest.approx(1 / 3), "cudnn": pytest.approx(2 / 3), "fa2": 1.0}
    # wrong ones launched for the check only (a deterministic mode twice: the bit-identical check)
    assert arms[2].calls == 1 and arms[3].calls == 2 and arms[6].calls == 0
    raw = s.raw["configs"][0]
    assert raw["pass"] == "backward" and raw["checked"] == "all K/V heads, all rows (dq, dk, dv)"
    assert set(raw["arms"]["stage:01"]["rel_errs"]) == {"dq", "dk", "dv"}
    # the entries are valid entries of the results file's backward section
    data = results.new_results("cpu-test", RUN_ID, _run(), [], entries)
    results.validate(results.normalize(data))
    table = report.backward_summary_table(results.normalize(data)["backward"]).splitlines()
    assert table[0].split()[:3] == ["arm", "shape", "status"] and "vs default" in table[0]
    assert table[2].startswith("stage 01 ") and table[3].startswith("stage 01 det") and "0.667" in table[3]
    assert table[-1].startswith("fa2")


def test_backward_inputs_are_fresh_random_and_never_zero():
    s = session()
    a = backward_check.BACKWARD.inputs(s, Shape("g", 1, 4, 16, 24, 8, kv_heads=2))
    b = backward_check.BACKWARD.inputs(s, Shape("g", 1, 4, 16, 24, 8, kv_heads=2))
    assert [tuple(t.shape) for t in a] == [(1, 4, 16, 8), (1, 2, 24, 8), (1, 2, 24, 8), (1, 4, 16, 8)]
    assert all(t.dtype == torch.bfloat16 and bool((t != 0).any()) and float(t.float().std()) > 0.5 for t in a)
    assert not any(torch.equal(x, y) for x, y in zip(a, b))


# --- the record ---------------------------------------------------------------------------------


def bwd_entry(**over):
    entry = {"kind": "stage", "name": "01", "label": "Backward baseline", "run_id": RUN_ID, "shape": "8k",
             "batch": 4, "heads": 16, "len_q": 8192, "len_k": 8192, "head_dim": 128, "causal": False,
             "deterministic": False, "status": "ok", "reason": None, "source_hash": "5cfbaa35cc7e3b3a",
             "median_ms": 20.123456, "min_ms": 20.0, "max_ms": 20.5, "spread_pct": 2.4567, "samples": 5,
             "tflops": 136.6123, "rel_err": 0.0041234, "rel_errs": {"dq": 0.0041234, "dk": 0.0032, "dv": 0.0021},
             "ratios": {"fa4": 0.4634, "cudnn": 0.5021, "fa2": 0.9122}, "vs_default": None}
    entry.update(over)
    return entry


def data_with(*entries, forward=()):
    return results.new_results("nvidia-h200", RUN_ID, _run(), list(forward), list(entries))


def test_backward_section_round_trip_and_index(tmp_path):
    det = bwd_entry(deterministic=True, label="Backward baseline (deterministic mode)", median_ms=30.0, min_ms=29.0,
                    max_ms=31.0, vs_default=0.67089)
    peer = bwd_entry(kind="peer", name="fa4", label="FlashAttention-4 (CuTe DSL)", source_hash=None,
                     ratios={"fa4": 1.0})
    missing = bwd_entry(kind="peer", name="fa3", label="FlashAttention-3 (Hopper, C++)", source_hash=None,
                        status="missing", reason="this flash_attn_interface build has no backward (inference-only)",
                        rel_err=None, rel_errs=None, **{k: None for k in results.TIMING_FIELDS})
    path = tmp_path / "nvidia-h200.json"
    results.dump_results(data_with(peer, det, bwd_entry(), missing), path)
    data = results.load_results(path)
    assert data["schema_version"] == 2 and data["results"] == []
    keys = [results.backward_key(e) for e in data["backward"]]
    assert keys == sorted(keys)
    e = next(x for x in data["backward"] if x["kind"] == "stage" and not x["deterministic"])
    assert e["median_ms"] == 20.1235 and e["tflops"] == 136.6 and e["rel_errs"] == {"dq": 0.00412, "dk": 0.0032,
                                                                                    "dv": 0.0021}
    assert e["ratios"] == {"fa4": 0.463, "cudnn": 0.502, "fa2": 0.912}
    nums = results.GpuResults.of("nvidia-h200", data)
    assert nums.backward("stage", "01", "8k", False, deterministic=True)["vs_default"] == 0.671
    assert nums.backward("stage", "01", "8k", False)["deterministic"] is False
    assert nums.backward("peer", "fa3", "8k", False)["status"] == "missing"
    assert len(nums.backward_entries) == 4
    # the forward's readers see none of it
    assert nums.by_key == {} and nums.stage("01", "8k", False) is None and nums.peer("fa4", "8k", False) is None
    assert nums.ok_stage_count() == 0


def test_a_schema_1_file_is_read_and_merged_into_schema_2(tmp_path):
    import json

    from test_results import RUN_ID as FORWARD_RUN
    from test_results import make_data, make_entry

    old = make_data(make_entry(), make_entry(kind="peer", name="fa4", label="FA4", source_hash=None))
    path = tmp_path / "nvidia-h200.json"
    path.write_text(json.dumps(old))
    loaded = results.load_results(path)
    assert loaded["schema_version"] == 1 and "backward" not in loaded
    assert results.GpuResults.of("nvidia-h200", loaded).backward_entries == []
    later = "20261203T000000Z"
    new = results.new_results("nvidia-h200", later, _run(), [], [bwd_entry(run_id=later)])
    results.write_merged(new, path, print)
    merged = results.load_results(path)
    assert merged["schema_version"] == 2 and len(merged["results"]) == 2 and len(merged["backward"]) == 1
    assert sorted(merged["runs"]) == [FORWARD_RUN, later]  # the forward's run is still referenced
    # a backward rerun replaces its own entry only, the deterministic mode being another
    latest = "20261204T000000Z"
    det = bwd_entry(run_id=latest, deterministic=True, vs_default=0.7)
    again = results.merge(merged, results.new_results("nvidia-h200", latest, _run(), [],
                                                      [bwd_entry(run_id=latest, median_ms=20.2), det]))
    assert len(again["backward"]) == 2 and {e["run_id"] for e in again["backward"]} == {latest}
    assert sorted(again["runs"]) == [FORWARD_RUN, latest]  # `later` no longer referenced: dropped
    results.validate(again)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.pop("backward"), "backward"),
    (lambda d: d["backward"][0].pop("deterministic"), "backward[0].deterministic"),
    (lambda d: d["backward"][0].update(deterministic=1), "backward[0].deterministic"),
    (lambda d: d["backward"][0].update(rel_errs={"dq": 0.004}), "backward[0].rel_errs"),
    (lambda d: d["backward"][0].update(rel_errs=None), "backward[0].rel_errs"),
    (lambda d: d["backward"][0].update(rel_err=0.5), "backward[0].rel_err"),
    (lambda d: d["backward"][0].update(ratios={"flex": 1.0}), "backward[0].ratios"),
    (lambda d: d["backward"][0].update(vs_default=0.7), "backward[0].vs_default"),  # the default mode has none
    (lambda d: d["backward"][0].update(kind="peer", name="flex", source_hash=None), "backward[0].name"),
    (lambda d: d["backward"][0].update(tflops=None), "backward[0].tflops"),
    (lambda d: d["backward"].append(dict(d["backward"][0])), "backward[1]"),
    (lambda d: d["backward"][0].update(run_id="20990101T000000Z"), "backward[0].run_id"),
    (lambda d: d.update(schema_version=1), "backward"),  # schema 1 has no backward section
])
def test_broken_backward_section_names_the_field(tmp_path, mutate, field):
    import json

    data = data_with(bwd_entry())
    mutate(data)
    path = tmp_path / "nvidia-h200.json"
    path.write_text(json.dumps(data))
    with pytest.raises(results.ResultsError) as err:
        results.load_results(path)
    assert f"field '{field}'" in str(err.value)


def test_the_deterministic_mode_is_an_entry_of_its_own():
    det = bwd_entry(deterministic=True, vs_default=0.66)
    results.validate(data_with(bwd_entry(), det))  # same stage, shape and mask: distinct by mode
    wrong = bwd_entry(status="wrong", reason="relative error of dk 0.3", rel_err=0.3,
                      rel_errs={"dq": 0.004, "dk": 0.3, "dv": None}, **{k: None for k in results.TIMING_FIELDS})
    results.validate(data_with(wrong))  # a wrong entry keeps its errors; a NaN gradient's is null


# --- the CLI ------------------------------------------------------------------------------------

AVAIL, BWD = list(range(1, 23)), [1]


def test_the_default_run_includes_the_backward():
    o = cli.parse_options([], AVAIL, BWD)
    assert o.stages is None and o.backward_stages is None and o.backward_wanted()
    assert o.backward_peers == ["fa3", "fa4", "cudnn", "fa2"]
    assert [s.name for s in o.shapes_backward()] == ["4k", "8k", "16k"]  # the points only
    assert o.deterministic == (False, True) and o.causal == (False, True)
    quick = cli.parse_options(["--quick"], AVAIL, BWD)
    assert [s.name for s in quick.shapes_backward()] == ["8k"] and quick.causal == (False,)


def test_what_selects_the_passes():
    fwd = cli.parse_options(["--what", "forward"], AVAIL, BWD)
    assert fwd.stages is None and fwd.peers and fwd.backward_stages == [] and fwd.backward_peers == []
    assert not fwd.backward_wanted()
    bwd = cli.parse_options(["--what", "backward", "--shapes", "core"], AVAIL, BWD)
    assert bwd.stages == [] and bwd.peers == [] and bwd.backward_stages is None and bwd.backward_wanted()
    assert bwd.command == "python -m bench --what backward --shapes core"


def test_backward_flags():
    o = cli.parse_options(["--backward-stages", "1", "--backward-peers", "fa2,fa4", "--deterministic", "off",
                           "--shapes", "8k,32k"], AVAIL, BWD)
    assert o.backward_stages == [1] and o.backward_peers == ["fa4", "fa2"] and o.deterministic == (False,)
    assert [s.name for s in o.shapes_backward()] == ["8k"] and [s.name for s in o.shapes] == ["8k", "32k"]
    o = cli.parse_options(["--backward-stages", "none", "--backward-peers", "none"], AVAIL, BWD)
    assert not o.backward_wanted()
    assert cli.parse_options(["--deterministic", "on"], AVAIL, BWD).deterministic == (True,)


@pytest.mark.parametrize("argv, message", [
    (["--what", "forward", "--backward-stages", "1"], "--backward-stages: selects backward arms"),
    (["--what", "forward", "--backward-peers", "fa4"], "--backward-peers: selects backward arms"),
    (["--what", "backward", "--stages", "22"], "--stages: selects forward arms"),
    (["--what", "backward", "--peers", "fa4"], "--peers: selects forward arms"),
    (["--backward-stages", "2"], "--backward-stages: no stage 02"),
    (["--backward-peers", "flex"], "--backward-peers: unknown peer 'flex'"),
    (["--what", "backward", "--shapes", "users"], "--shapes: the backward runs the core shapes"),
])
def test_bad_backward_flags_name_the_flag(argv, message):
    with pytest.raises(ValueError, match=message):
        cli.parse_options(argv, AVAIL, BWD)


# --- the whole run ------------------------------------------------------------------------------


@pytest.fixture
def one_backward_stage(monkeypatch):
    """The backward lineage as stage 01 alone (a later stage may be mid-edit in a working tree)."""
    real = lineage.discover

    def discover(root=lineage.ATTENTION_DIR):
        if str(root) == str(lineage.BACKWARD_DIR):
            return [stage01()]
        return real(root)

    monkeypatch.setattr(lineage, "discover", discover)


def _options(tmp_path, **over):
    o = runner.Options(stages=[], peers=[], shapes=[Shape("4k", 1, 2, 128, 128, 128)], causal=(False, True),
                       rounds=2, launches=2, out=tmp_path / "nvidia-h200.json", raw=tmp_path / "raw.json", seed=7,
                       command="python -m bench --what backward", backward_stages=[1],
                       backward_peers=["fa3", "fa4", "cudnn", "fa2"])
    for k, v in over.items():
        setattr(o, k, v)
    return o


@pytest.mark.usefixtures("fake_h200", "one_backward_stage")
def test_run_writes_the_backward_section(tmp_path, capsys, monkeypatch):
    import json

    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)
    assert runner.run(_options(tmp_path), report.Log(), device="cpu", timer=UnitTimer()) == 0
    data = results.load_results(tmp_path / "nvidia-h200.json")
    assert data["schema_version"] == 2 and data["results"] == []  # --what backward: no forward entries
    got = {(e["name"], e["deterministic"], e["causal"]): e for e in data["backward"]}
    assert len(got) == 12  # (stage 01, its deterministic mode, 4 peers) x 2 masks
    for causal in (False, True):
        for det in (False, True):
            e = got[("01", det, causal)]
            assert e["status"] == "failed" and "binding build failed" in e["reason"]  # no nvcc here
            assert e["source_hash"] == stage01().source_hash()
        assert got[("fa3", False, causal)]["status"] == "missing"
        assert got[("fa4", False, causal)]["status"] == "missing"
        assert got[("cudnn", False, causal)]["status"] == "failed"  # no cuDNN on the CPU: recorded, never estimated
        fa2 = got[("fa2", False, causal)]
        assert fa2["status"] == "ok" and fa2["ratios"] == {"fa2": 1.0} and fa2["rel_err"] < 2e-2
        assert fa2["tflops"] == pytest.approx(2.5 * flops(Shape("4k", 1, 2, 128, 128, 128), causal) / 1e-3 / 1e12,
                                              abs=0.05)
    out = capsys.readouterr().out
    assert "backward alone" in out and "4k causal backward" in out and "vs default" in out
    raw = json.loads((tmp_path / "raw.json").read_text())
    assert [c.get("pass") for c in raw["configs"]] == ["backward", "backward"] and len(raw["backward_entries"]) == 12

    # a forward-only run later keeps the backward entries
    monkeypatch.setattr(runner, "run_id_and_date", lambda: ("20991231T000000Z", "2099-12-31T00:00:00Z"))
    assert runner.run(_options(tmp_path, peers=["fa2"], backward_stages=[], backward_peers=[], causal=(False,),
                               raw=None), report.Log(), device="cpu", timer=UnitTimer()) == 0
    after = results.load_results(tmp_path / "nvidia-h200.json")
    assert [e["name"] for e in after["results"]] == ["fa2"] and len(after["backward"]) == 12


@pytest.mark.usefixtures("fake_h200", "one_backward_stage")
def test_a_hung_backward_saves_what_was_measured_and_stops(tmp_path, monkeypatch):
    import threading

    released = threading.Event()
    saved = {}

    class Hangs(FakeBackward):
        def prepare_backward(self, q, k, v, dout, causal, scale):
            launch = super().prepare_backward(q, k, v, dout, causal, scale)
            inner = launch.fn

            def fn():
                if causal:
                    released.wait(20)  # stands in for a backward that never finishes
                return inner()

            fn.ms, fn.arm = inner.ms, inner.arm
            launch.fn = fn
            return launch

    monkeypatch.setattr(backward, "make_backward_peers", lambda torch_, names: [
        FakeBackward("peer", "fa4", [1.0]), Hangs("peer", "cudnn", [1.0]), FakeBackward("peer", "fa2", [1.0])])

    def fake_exit(code):
        saved["code"] = code
        saved["data"] = results.load_results(tmp_path / "nvidia-h200.json")
        released.set()

    opts = _options(tmp_path, hang_timeout=3.0, raw=None)  # see test_bench_run's hang test for the limit
    assert runner.run(opts, report.Log(), device="cpu", timer=UnitTimer(), exit_on_hang=fake_exit) == 0
    assert saved["code"] == 3
    got = {(e["name"], e["deterministic"], e["causal"]): e for e in saved["data"]["backward"]}
    assert [got[(n, False, False)]["status"] for n in ("fa4", "cudnn", "fa2")] == ["ok", "ok", "ok"]
    assert got[("cudnn", False, True)]["status"] == "failed"
    assert "4k causal backward: checking cudnn made no progress" in got[("cudnn", False, True)]["reason"]
    for name in ("fa4", "fa2"):  # fa4 passed its check but was never timed
        assert got[(name, False, True)]["status"] == "failed" and "not finished" in got[(name, False, True)]["reason"]
    assert got[("01", True, True)]["status"] == "failed"  # decided before the hang (no nvcc here)

