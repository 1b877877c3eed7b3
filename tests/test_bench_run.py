"""The whole run's glue on the CPU: torch.cuda's queries stand in for an H200, a stand-in timer times
nothing real. Checks the file it writes (environment, run, statuses), the summary and the raw file."""

from __future__ import annotations

import json
import types

import pytest
from hopattn.records import results

from bench import report, runner
from bench.shapes import Shape

torch = pytest.importorskip("torch")


class UnitTimer:
    """Runs each launch (so failures surface) and calls it 1 ms: no numbers from here reach a real file."""

    def launches(self, fn, n):
        for _ in range(n):
            fn()
        return [1.0] * n

    def one(self, fn):
        return self.launches(fn, 1)[0]


@pytest.fixture
def fake_h200(monkeypatch):
    props = types.SimpleNamespace(name="NVIDIA H200", multi_processor_count=132, L2_cache_size=60 << 20)
    for name, value in {"is_available": lambda: True, "current_device": lambda: 0,
                        "get_device_name": lambda dev=0: "NVIDIA H200",
                        "get_device_capability": lambda dev=0: (9, 0),
                        "get_device_properties": lambda dev=0: props,
                        "synchronize": lambda dev=None: None, "empty_cache": lambda: None}.items():
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(runner.env, "read_clocks", lambda: {"sm_mhz": 1980, "mem_mhz": 3201, "max_sm_mhz": 1980,
                                                            "power_limit_w": 700.0})
    monkeypatch.setattr(runner.env, "driver_version", lambda: "580.159.04")
    # the stages cannot build here (no nvcc/GPU): make that certain and quick
    from hopattn import build

    def no_nvcc(*a, **k):
        raise build.BuildError("nvcc: not found")

    monkeypatch.setattr(build, "build_native", no_nvcc)


def options(tmp_path, **over):
    o = runner.Options(stages=[1], peers=["fa4", "cudnn", "fa2"], shapes=[Shape("4k", 1, 2, 128, 128, 128)],
                       causal=(False, True), rounds=2, launches=2, out=tmp_path / "nvidia-h200.json",
                       raw=tmp_path / "raw.json", seed=5, command="python -m bench --stages 1")
    for k, v in over.items():
        setattr(o, k, v)
    return o


def test_run_writes_a_valid_merged_file(tmp_path, fake_h200, capsys, monkeypatch):
    log = report.Log()
    assert runner.run(options(tmp_path), log, device="cpu", timer=UnitTimer()) == 0
    data = results.load_results(tmp_path / "nvidia-h200.json")
    (run_id, run), = data["runs"].items()
    assert run["command"] == "python -m bench --stages 1"
    env = run["environment"]
    assert env["gpu_name"] == "NVIDIA H200" and env["compute_capability"] == "9.0" and env["sm_count"] == 132
    assert env["clocks_before"] == {"sm_mhz": 1980, "mem_mhz": 3201} and env["power_limit_w"] == 700.0
    assert env["driver"] == "580.159.04" and env["torch"] == torch.__version__
    got = {(e["kind"], e["name"], e["causal"]): e for e in data["results"]}
    assert len(got) == 8
    stage = got[("stage", "01", False)]
    assert stage["status"] == "failed" and "binding build failed" in stage["reason"]
    assert got[("stage", "01", True)]["status"] == "skipped"  # causal skip wins over the build failure
    assert got[("peer", "fa4", False)]["status"] == "missing"
    assert got[("peer", "cudnn", False)]["status"] == "failed"  # no cuDNN on the CPU: recorded, never estimated
    fa2 = got[("peer", "fa2", False)]
    assert fa2["status"] == "ok" and fa2["ratios"] == {} and fa2["rel_err"] < 1e-2
    out = capsys.readouterr().out
    assert "float64 reference over all heads, all rows" in out and "vs cudnn" in out
    raw = json.loads((tmp_path / "raw.json").read_text())
    assert raw["seed"] == 5 and raw["log"] and len(raw["configs"]) == 2

    # a later partial run replaces only its own entries
    before = {(e["kind"], e["name"], e["causal"]): e["run_id"] for e in data["results"]}
    monkeypatch.setattr(runner, "run_id_and_date", lambda: ("20991231T000000Z", "2099-12-31T00:00:00Z"))
    assert runner.run(options(tmp_path, peers=["fa2"], causal=(True,), raw=None), report.Log(), device="cpu",
                      timer=UnitTimer()) == 0
    after = results.load_results(tmp_path / "nvidia-h200.json")
    changed = {(e["kind"], e["name"], e["causal"]) for e in after["results"]
               if e["run_id"] != before[(e["kind"], e["name"], e["causal"])]}
    assert changed == {("stage", "01", True), ("peer", "fa2", True)}
    assert sorted(after["runs"]) == sorted([run_id, "20991231T000000Z"])


def test_run_refuses_without_cuda(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runner.run(options(tmp_path), report.Log()) == 2
    assert not (tmp_path / "nvidia-h200.json").exists()


def test_a_hung_arm_saves_what_was_measured_and_stops(tmp_path, fake_h200, monkeypatch):
    import threading

    from test_bench_runner import FakeArm

    from bench import peers

    released = threading.Event()
    saved = {}

    class Hangs(FakeArm):
        def prepare(self, q, k, v, causal, scale):
            launch = super().prepare(q, k, v, causal, scale)
            inner = launch.fn

            def fn():
                if causal:
                    released.wait(20)  # stands in for a kernel that never finishes
                return inner()

            fn.ms, fn.arm = inner.ms, inner.arm
            launch.fn = fn
            return launch

    def make_peers(torch_, names):
        return [FakeArm("peer", "cudnn", [1.0]), Hangs("peer", "flex", [1.0]), FakeArm("peer", "fa2", [1.0])]

    monkeypatch.setattr(peers, "make_peers", make_peers)

    def fake_exit(code):
        saved["code"] = code
        saved["data"] = results.load_results(tmp_path / "nvidia-h200.json")
        released.set()

    # The limit must pass the CPU stand-in's real steps (under a second each, even on a loaded 2-core
    # machine: 0.3 s once fired on the non-causal timing there) and fire well before the 20-s hang.
    opts = options(tmp_path, causal=(False, True), hang_timeout=3.0)
    assert runner.run(opts, report.Log(), device="cpu", timer=UnitTimer(), exit_on_hang=fake_exit) == 0
    assert saved["code"] == 3
    got = {(e["name"], e["causal"]): e for e in saved["data"]["results"]}
    # the non-causal shape finished before the hang and was saved whole
    assert [got[(n, False)]["status"] for n in ("cudnn", "flex", "fa2")] == ["ok", "ok", "ok"]
    assert got[("01", False)]["status"] == "failed"  # no nvcc here
    # the causal shape: what was decided before the hang, then the hung arm, then the rest not finished
    assert got[("01", True)]["status"] == "skipped"
    assert got[("flex", True)]["status"] == "failed"
    assert "4k causal: checking flex made no progress" in got[("flex", True)]["reason"]
    for name in ("cudnn", "fa2"):  # cudnn passed its check but was never timed
        assert got[(name, True)]["status"] == "failed" and "not finished" in got[(name, True)]["reason"]
