"""The run of one configuration on the CPU with stand-in arms and a scripted timer: statuses, the check
before timing, the alternating order, ratios, the entries it makes, and merging into the results file."""

from __future__ import annotations

import json
import math
import random

import pytest
from hopattn.records import results

from bench import report, runner
from bench.arms import Arm, Launch
from bench.shapes import Shape, flops

torch = pytest.importorskip("torch")

SHAPE = Shape("tiny", 1, 2, 64, 64, 32)
RUN_ID = "20261129T153000Z"


class ScriptedTimer:
    """Returns the arm's scripted time for every launch and remembers the order arms were timed in."""

    def __init__(self):
        self.order = []

    def launches(self, fn, n):
        self.order.append(fn.arm)
        ms = fn.ms[min(len([a for a in self.order if a == fn.arm]) - 1, len(fn.ms) - 1)]
        return [ms] * n

    def one(self, fn):
        return fn.ms[0]


class FakeArm(Arm):
    """SDPA on the CPU standing in for a kernel; `bug` breaks it in one of the ways the runner must catch."""

    def __init__(self, kind, name, ms, bug=None, skip=None):
        self.kind, self.name, self.label = kind, name, f"label {name}"
        self.source_hash = "0123456789abcdef" if kind == "stage" else None
        self.ms, self.bug, self.skip = ms, bug, skip
        self.calls = 0

    def applies(self, shape, causal):
        return self.skip

    def prepare(self, q, k, v, causal, scale):
        def fn():
            self.calls += 1
            if self.bug == "raise":
                raise RuntimeError("launch failed: too many resources requested\nsecond line")
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
            if self.bug == "nan":
                out[0, 0, 5, 0] = math.nan
            if self.bug == "wrong":
                out = out * 1.1
            return out

        fn.ms, fn.arm = self.ms, self.key
        return Launch(fn=fn)


def session(timer=None, rounds=4, launches=3):
    return runner.Session(torch=torch, device="cpu", timer=timer or ScriptedTimer(), log=report.Log(stream=_Null()),
                          rounds=rounds, launches=launches, rng=random.Random(0))


class _Null:
    def write(self, s):
        pass

    def flush(self):
        pass


def by_key(entries):
    return {f"{e['kind']}:{e['name']}": e for e in entries}


def test_run_config_statuses_timing_and_ratios():
    arms = [
        FakeArm("stage", "01", [4.0, 4.0, 2.0, 4.0]),
        FakeArm("stage", "02", [1.0], bug="wrong"),
        FakeArm("stage", "03", [1.0], bug="nan"),
        FakeArm("stage", "04", [1.0], bug="raise"),
        FakeArm("stage", "05", [1.0], skip=("skipped", "stage has no causal support")),
        FakeArm("peer", "fa4", [1.0, 1.0, 1.0, 1.0]),
        FakeArm("peer", "cudnn", [2.0, 2.0, 2.0, 2.0]),
        FakeArm("peer", "flex", [1.0], skip=("missing", "not importable")),
    ]
    s = session()
    entries = runner.run_config(s, arms, SHAPE, False, RUN_ID)
    assert [f"{e['kind']}:{e['name']}" for e in entries] == [a.key for a in arms]
    e = by_key(entries)
    ok = e["stage:01"]
    assert ok["status"] == "ok" and ok["reason"] is None and ok["samples"] == 4
    assert ok["median_ms"] == 4.0 and ok["min_ms"] == 2.0 and ok["max_ms"] == 4.0 and ok["spread_pct"] == 50.0
    assert ok["tflops"] == pytest.approx(flops(SHAPE, False) / 4e-3 / 1e12)
    assert ok["ratios"] == {"fa4": 0.25, "cudnn": 0.5}  # medians of per-round ref/arm
    assert 0 < ok["rel_err"] < 1e-2 and ok["source_hash"] == "0123456789abcdef"
    assert e["peer:fa4"]["ratios"] == {"fa4": 1.0, "cudnn": 2.0} and e["peer:fa4"]["source_hash"] is None

    wrong = e["stage:02"]
    assert wrong["status"] == "wrong" and "relative error" in wrong["reason"] and wrong["rel_err"] > 0.05
    assert wrong["median_ms"] is None and wrong["tflops"] is None and wrong["ratios"] is None
    assert e["stage:03"]["status"] == "wrong" and "NaN" in e["stage:03"]["reason"] and e["stage:03"]["rel_err"] is None
    assert e["stage:04"]["status"] == "failed" and e["stage:04"]["reason"] == (
        "RuntimeError: launch failed: too many resources requested")
    assert e["stage:05"]["status"] == "skipped" and e["peer:flex"]["status"] == "missing"

    # wrong and failed arms are not timed: launched once for the check only
    assert arms[1].calls == 1 and arms[2].calls == 1 and arms[4].calls == 0
    # the entries are valid results entries
    data = {"schema_version": 1, "gpu": "cpu-test", "runs": {RUN_ID: _run()}, "results": entries}
    results.validate(results.normalize(data))
    assert s.raw["configs"][0]["arms"]["stage:01"]["round_ms"] == [4.0, 4.0, 2.0, 4.0]


def test_rounds_alternate_the_arm_order():
    arms = [FakeArm("stage", "01", [1.0]), FakeArm("peer", "fa4", [1.0]), FakeArm("peer", "cudnn", [1.0])]
    timer = ScriptedTimer()
    runner.run_config(session(timer, rounds=3), arms, SHAPE, True, RUN_ID)
    keys = [a.key for a in arms]
    assert timer.order == keys + keys[::-1] + keys


def test_ratios_only_against_references_that_were_timed():
    arms = [FakeArm("stage", "01", [2.0]), FakeArm("peer", "fa4", [1.0], bug="wrong"),
            FakeArm("peer", "cudnn", [1.0])]
    e = by_key(runner.run_config(session(), arms, SHAPE, False, RUN_ID))
    assert e["stage:01"]["ratios"] == {"cudnn": 0.5}


def test_make_entry_for_a_non_ok_status_keeps_timing_null():
    arm = FakeArm("stage", "07", [1.0])
    entry = runner.make_entry(arm, SHAPE, True, RUN_ID, "skipped", "stage uses sm_90a")
    assert entry["causal"] is True and entry["len_q"] == 64 and entry["head_dim"] == 32
    assert all(entry[k] is None for k in results.TIMING_FIELDS)


def _run():
    return {"date": "2026-11-29T15:30:00Z", "git_commit": None, "git_dirty": None, "command": "python -m bench",
            "environment": {"gpu_name": "CPU test", "compute_capability": "9.0", "sm_count": 1, "driver": None,
                            "cuda": None, "torch": "x", "cudnn": None, "clocks_before": None, "clocks_after": None,
                            "max_sm_mhz": None, "power_limit_w": None}}


def _entries(run_id, names, ms=1.0):
    arm_entries = []
    for name in names:
        arm = FakeArm("stage", name, [ms])
        fields = {"median_ms": ms, "min_ms": ms, "max_ms": ms, "spread_pct": 0.0, "samples": 1}
        arm_entries.append(runner.make_entry(arm, SHAPE, False, run_id, "ok", timing_fields=fields, rel_err=0.002,
                                             ratios={"fa4": 1.0}))
    return arm_entries


def test_partial_run_merges_into_the_file(tmp_path):
    out = tmp_path / "cpu-test.json"
    first = results.new_results("cpu-test", RUN_ID, _run(), _entries(RUN_ID, ["01", "07"], ms=3.0))
    assert results.write_merged(first, out, print) == out
    later = "20261130T090000Z"
    second = results.new_results("cpu-test", later, _run(), _entries(later, ["07"], ms=1.0))
    results.write_merged(second, out, print)
    data = results.load_results(out)
    by_name = {e["name"]: e for e in data["results"]}
    assert by_name["01"]["run_id"] == RUN_ID and by_name["01"]["median_ms"] == 3.0
    assert by_name["07"]["run_id"] == later and by_name["07"]["median_ms"] == 1.0
    assert sorted(data["runs"]) == [RUN_ID, later]


def test_an_unreadable_old_file_is_kept_and_the_run_goes_beside_it(tmp_path):
    out = tmp_path / "cpu-test.json"
    out.write_text('{"schema_version": 1}')
    logged = []
    new = results.new_results("cpu-test", RUN_ID, _run(), _entries(RUN_ID, ["01"]))
    written = results.write_merged(new, out, logged.append)
    assert written == tmp_path / "cpu-test.unmerged.json"
    assert out.read_text() == '{"schema_version": 1}'
    assert json.loads(written.read_text())["results"][0]["name"] == "01"
    assert any("field 'gpu'" in line for line in logged)


def test_run_id_and_date():
    import datetime as dt

    when = dt.datetime(2026, 11, 29, 15, 30, 0, 123456, tzinfo=dt.timezone.utc)
    assert runner.run_id_and_date(when) == ("20261129T153000Z", "2026-11-29T15:30:00Z")


def test_raw_file_has_no_nan():
    assert runner._finite({"a": [math.nan, 1.0, math.inf], "b": (1, "x")}) == {"a": [None, 1.0, None], "b": [1, "x"]}
