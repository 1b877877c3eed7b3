"""The model benchmark's logic on CPU: timing loop, attention replay, record format, assembling the
record, and the watchdog on a planted hang, so its one GPU run is likely to work the first time."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hopattn.records import models as mr

REPO = Path(__file__).resolve().parent.parent


class FakeClock:
    """Returns prepared times instead of measuring; counts the calls it timed."""

    def __init__(self, times):
        self.times, self.calls = list(times), 0

    def time(self, fn, n=1):
        fn()
        self.calls += 1
        return self.times.pop(0)


def test_time_step_warms_up_then_times_each_rep():
    from bench import model_timing

    ran = []
    clock = FakeClock([3.0, 1.0, 2.0])
    ms = model_timing.time_step(clock, lambda: ran.append(1), warmup=2, reps=3)
    assert ms == [3.0, 1.0, 2.0] and len(ran) == 5 and clock.calls == 3
    assert model_timing.summarize(ms) == {"median": 2.0, "min": 1.0, "max": 3.0, "spread_pct": 100.0, "samples": 3}
    with pytest.raises(ValueError, match="reps"):
        model_timing.time_step(clock, lambda: None, warmup=0, reps=0)


def test_replay_sums_count_times_median_per_call_under_its_context():
    from bench import model_timing

    entered = []

    class Ctx:
        def __enter__(self):
            entered.append(1)

        def __exit__(self, *a):
            return False

    calls = [("self", None, 40), ("cross", None, 40)]
    times = [9.0, 10.0, 11.0, 1.0, 2.0, 3.0]  # medians 10 and 2
    clock = FakeClock(times)
    total = model_timing.replay_attention(clock, calls, lambda shape, reason: (lambda: None, Ctx), warmup=1,
                                          launches=3)
    assert total == 40 * 10.0 + 40 * 2.0 and len(entered) == 2


def test_real_clock_measures_cpu_time():
    torch = pytest.importorskip("torch")
    import time

    from bench import model_timing

    ms = model_timing.Clock(torch, torch.device("cpu")).time(lambda: time.sleep(0.02), n=2)
    assert 15 < ms < 200


# --- the record format ----------------------------------------------------------------------------


def case(median=100.0, **kw):
    return {"status": "ok", "message": None,
            "step_ms": {"median": median, "min": median * 0.99, "max": median * 1.02, "spread_pct": 3.0,
                        "samples": 3},
            "attention_ms": median / 2, "memory_gib": 30.123456, "speedup_step": None, "speedup_attention": None,
            "errors": {}, "routing": None, **kw}


def record():
    run = {"date": "2026-12-01T10:15:00Z", "git_commit": "a" * 40, "dirty": False, "dry_run": False,
           "command": "python -m bench.models", "environment": {k: None for k in mr.ENV_FIELDS}}
    run["environment"].update(gpu_name="NVIDIA H200", sm_count=132, torch="2.11.0")
    routing = {"strict": True, "kernel": "hopattn", "calls": 80, "served": 80, "modes": {"direct": 80},
               "fallbacks": {}}
    calls = [{"library": "diffusers", "batch": 1, "q_heads": 40, "kv_heads": 40, "q_len": 32760, "k_len": k,
              "head_dim": 128, "causal": False, "layout": "bshd", "dtype": "bfloat16", "count": 40, "reason": None}
             for k in (32760, 512)]
    model = {"run": "20261201T101500Z", "label": "Wan2.1-T2V-14B", "library": "diffusers",
             "config_source": "wan_t2v_14B.py", "workload": "one step", "tokens": {"video": 32760, "text": 512},
             "params": 14_000_000_000, "build_s": 12.345, "strict": True, "attention_calls": calls,
             "cases": {"sdpa": case(3000.0),
                       "hopattn": case(2700.0, speedup_step=1.1111111, speedup_attention=1.2345678,
                                       errors={"rel_err_latents": 0.0123456789}, routing=routing),
                       "fa4": {**case(), "status": "missing", "step_ms": None, "message": "not importable"}}}
    return {"schema_version": 1, "runs": {"20261201T101500Z": run}, "models": {"wan2.1-t2v-14b-480p": model}}


def test_record_round_trip_sorted_fixed_precision(tmp_path):
    path = tmp_path / "models-nvidia-h200.json"
    mr.dump(record(), path)
    text = path.read_text()
    data = mr.load(path)
    hop = data["models"]["wan2.1-t2v-14b-480p"]["cases"]["hopattn"]
    assert hop["speedup_step"] == 1.111 and hop["speedup_attention"] == 1.235
    assert hop["errors"] == {"rel_err_latents": 0.0123} and hop["memory_gib"] == 30.12
    assert data["models"]["wan2.1-t2v-14b-480p"]["build_s"] == 12.3
    assert text == mr.to_json(data) and list(json.loads(text)) == sorted(json.loads(text))
    mr.dump(data, path)
    assert path.read_text() == text  # deterministic: writing what was read changes nothing
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind
    assert mr.record_path(tmp_path, "NVIDIA H200") == path
    assert set(mr.load_all(tmp_path)) == {"nvidia-h200"}


@pytest.mark.parametrize("edit,field", [
    (lambda d: d.update(schema_version=2), "schema_version"),
    (lambda d: d["runs"]["20261201T101500Z"].update(date="yesterday"), "runs.20261201T101500Z.date"),
    (lambda d: d["runs"]["20261201T101500Z"]["environment"].pop("cudnn"), "environment.cudnn"),
    (lambda d: M(d).update(run="20990101T000000Z"), "models.wan2.1-t2v-14b-480p.run"),
    (lambda d: M(d).update(library="jax"), "models.wan2.1-t2v-14b-480p.library"),
    (lambda d: M(d)["cases"].update(flex=case()), "cases.flex"),
    (lambda d: M(d)["cases"]["sdpa"].update(status="great"), "cases.sdpa.status"),
    (lambda d: M(d)["cases"]["sdpa"].update(step_ms=None), "cases.sdpa.step_ms"),
    (lambda d: M(d)["cases"]["fa4"].update(message=None), "cases.fa4.message"),
    (lambda d: M(d)["cases"]["hopattn"]["routing"].update(served=79), "cases.hopattn.routing"),
    (lambda d: M(d)["cases"]["hopattn"]["errors"].update(rel_err_latents=float("nan")), "errors.rel_err_latents"),
    (lambda d: M(d)["attention_calls"][0].update(count=0), "attention_calls[0].count"),
])
def test_record_errors_name_the_field(edit, field, tmp_path):
    data = record()
    edit(data)
    with pytest.raises(mr.RecordError, match=field.replace("[", r"\[").replace("]", r"\]")):
        mr.validate(data, "x.json")
    path = tmp_path / "models-x.json"
    mr.dump(record(), path)
    before = path.read_text()
    with pytest.raises(mr.RecordError):
        mr.dump(data, path)
    assert path.read_text() == before  # a bad record never replaces a good one


def M(d):
    return d["models"]["wan2.1-t2v-14b-480p"]


def test_merge_keeps_models_not_run_again_and_drops_unused_runs(tmp_path):
    old = record()
    new = copy.deepcopy(record())
    new["runs"] = {"20261202T000000Z": {**old["runs"]["20261201T101500Z"], "date": "2026-12-02T00:00:00Z"}}
    new["models"] = {"llama-3.1-8b-prefill-8k": {**copy.deepcopy(M(old)), "run": "20261202T000000Z",
                                                 "library": "transformers"}}
    merged = mr.merge(old, new)
    assert set(merged["models"]) == {"wan2.1-t2v-14b-480p", "llama-3.1-8b-prefill-8k"}
    again = copy.deepcopy(old)
    M(again)["run"] = "20261202T000000Z"
    again["runs"] = new["runs"]
    path = tmp_path / "models-x.json"
    mr.dump(mr.merge(old, again), path)
    assert list(mr.load(path)["runs"]) == ["20261202T000000Z"]


def test_assemble_computes_speedups_against_sdpa():
    from bench import model_cases, models

    group = model_cases.GROUPS["wan2.1-t2v-14b"]
    wl = group.workloads[0]
    state = {"cases": {wl.id: {"sdpa": case(3000.0),
                               "hopattn": case(2000.0, errors={"rel_err_latents": 0.01}),
                               "fa3": {"status": "hang", "message": "no result"}}},
             "built": {group.id: {"build_s": 10.0, "params": 123}},
             "workloads": {wl.id: {"calls": [], "tokens": {"video": 32760, "text": 512}}}}
    run = record()["runs"]["20261201T101500Z"]
    data = models.assemble(state, [group], "20261201T101500Z", run)
    cases = data["models"][wl.id]["cases"]
    assert cases["hopattn"]["speedup_step"] == 1.5 and cases["hopattn"]["speedup_attention"] == 1.5
    assert cases["fa3"]["speedup_step"] is None and cases["fa3"]["status"] == "hang"
    mr.validate(data)


def test_parse_list_and_help():
    from bench import models

    assert models.parse_list("hopattn,sdpa", models.BACKENDS, "backends") == ["sdpa", "hopattn"]
    with pytest.raises(SystemExit, match="--backends: unknown 'flex'"):
        models.parse_list("flex", models.BACKENDS, "backends")
    out = subprocess.run([sys.executable, "-m", "bench.models", "--help"], capture_output=True, text=True, cwd=REPO,
                         timeout=120)
    assert out.returncode == 0 and "--dry-run" in out.stdout and "wan2.1-t2v-14b" in out.stdout


def test_configs_are_the_published_sizes():
    from bench import model_configs as c

    assert (c.LLAMA_3_1_8B["num_attention_heads"], c.LLAMA_3_1_8B["num_key_value_heads"],
            c.LLAMA_3_1_8B["hidden_size"] // c.LLAMA_3_1_8B["num_attention_heads"]) == (32, 8, 128)
    assert (c.WAN_2_1_T2V_14B["num_attention_heads"], c.WAN_2_1_T2V_14B["num_layers"]) == (40, 40)
    assert (c.WAN_2_1_T2V_1_3B["num_attention_heads"] * 128, c.WAN_2_1_T2V_1_3B["num_layers"]) == (1536, 30)
    assert (c.LTX_2["num_attention_heads"], c.LTX_2["attention_head_dim"], c.LTX_2["audio_attention_head_dim"]) == \
        (32, 128, 64)
    from bench import model_cases

    wan = model_cases.GROUPS["wan2.1-t2v-14b"].workloads[0]
    assert wan.tokens(False) == {"video": 32760, "text": 512}


# --- end to end: the dry run, with a planted hang --------------------------------------------------


@pytest.mark.slow
def test_dry_run_end_to_end_survives_a_planted_hang(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("diffusers")
    out = tmp_path / "models-cpu.json"
    env = dict(os.environ, HOPATTN_MODELS_PLANT_HANG="ltx-2-512x768x121:hopattn")
    proc = subprocess.run([sys.executable, "-m", "bench.models", "--dry-run", "--models", "llama-3.1-8b,ltx-2",
                           "--backends", "sdpa,hopattn,fa4", "--reps", "2", "--case-timeout", "20",
                           "--out", str(out)], capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1, log  # a hang is a failure of the run, reported, after the rest ran
    assert "ltx-2-512x768x121 / hopattn: started" in log and "HANG: ltx-2-512x768x121 / hopattn" in log
    data = mr.load(out)
    assert data["runs"][next(iter(data["runs"]))]["dry_run"] is True
    ltx = data["models"]["ltx-2-512x768x121"]["cases"]
    assert ltx["hopattn"]["status"] == "hang" and "watchdog" in ltx["hopattn"]["message"]
    assert ltx["sdpa"]["status"] == "ok" and ltx["fa4"]["status"] == "missing"  # run by a fresh process
    for k in ("8k", "32k"):
        llama = data["models"][f"llama-3.1-8b-prefill-{k}"]
        hop = llama["cases"]["hopattn"]
        assert hop["status"] == "ok" and hop["routing"]["calls"] == hop["routing"]["served"] == 2
        assert hop["errors"]["rel_err_logits"] < 3e-2 and hop["speedup_step"] > 0
        assert hop["attention_ms"] > 0 and hop["step_ms"]["samples"] == 2
        assert [c["reason"] for c in llama["attention_calls"]] == [None]
    calls = data["models"]["ltx-2-512x768x121"]["attention_calls"]
    reasons = {c["head_dim"]: c["reason"] for c in calls}
    assert reasons == {128: None, 64: None}  # stage 24 serves LTX-2's audio attention (head dim 64) too


def test_committed_model_records_are_valid_and_canonical():
    from pathlib import Path

    from hopattn.records import models as model_records

    for path in sorted((Path(__file__).resolve().parent.parent / "bench" / "results").glob("models-*.json")):
        data = model_records.load(path)
        assert path.read_text() == model_records.to_json(model_records.normalize(data)), path


# --- the training producer (python -m bench.models --training): its wiring, on CPU ----------------


def test_training_groups_are_chosen_by_the_flag_and_run_sdpa_cudnn_hopattn_only():
    from bench import model_cases, models

    inference = {g.id for g in models.select_groups("all", training=False)}
    training = {g.id for g in models.select_groups("all", training=True)}
    assert training == {"llama-3.1-8b-training", "wan2.1-t2v-1.3b-training"} and not inference & training
    assert "llama-3.1-8b" in inference and "ltx-2" in inference
    assert [g.id for g in models.select_groups("wan2.1-t2v-1.3b-training", training=False)] == \
        ["wan2.1-t2v-1.3b-training"]
    group = model_cases.GROUPS["llama-3.1-8b-training"]
    assert models.group_backends(group, list(models.BACKENDS)) == ["sdpa", "cudnn", "hopattn"]
    assert models.group_backends(model_cases.GROUPS["llama-3.1-8b"], ["sdpa", "fa4"]) == ["sdpa", "fa4"]
    assert group.layers(group.config) == 32 and group.config["num_attention_heads"] == 32
    wan = model_cases.GROUPS["wan2.1-t2v-1.3b-training"]
    assert wan.layers(wan.config) == 30 and wan.workloads[0].tokens(False) == {"video": 32760, "text": 512}
    assert group.workloads[0].tokens(False) == {"sequence": 8192}
    args = models.build_parser().parse_args(["--training"])
    assert "not fa3, fa4" in models.plan(models.select_groups("all", True), list(models.BACKENDS), args)


def test_layered_label_says_how_many_layers_ran_and_why():
    from bench import model_cases, models

    group = model_cases.GROUPS["wan2.1-t2v-1.3b-training"]
    wl = group.workloads[0]
    full = {"layers": 30, "full_layers": 30, "dropped": []}
    label, workload = models.layered(group, wl, full, dry_run=False)
    assert label == wl.label and workload.endswith("; 30 of the model's 30 layers")
    fewer = {"layers": 23, "full_layers": 30, "dropped": [[30, "out of memory (CUDA)"]]}
    label, workload = models.layered(group, wl, fewer, dry_run=False)
    assert label == f"{wl.label}, 23 of 30 layers"
    assert workload.endswith("; 23 of the model's 30 layers (fewer did not fit: 30 layers: out of memory (CUDA))")
    inference = model_cases.GROUPS["wan2.1-t2v-1.3b"]
    assert models.layered(inference, inference.workloads[0], fewer, False) == (inference.workloads[0].label,
                                                                               inference.workloads[0].workload)


def test_assemble_keeps_sdpas_gradient_errors_not_its_loss_against_itself():
    from bench import model_cases, models

    group = model_cases.GROUPS["llama-3.1-8b-training"]
    wl = group.workloads[0]
    errors = {"rel_err_loss": 1e-4, "rel_err_grads": 0.01, "rel_err_grads_rerun": 0.002}
    sdpa_errors = {"rel_err_loss": 0.0, "rel_err_grads": 1.4, "rel_err_grads_attention": 1.4,
                   "rel_err_grads_worst": 1.5, "rel_err_grads_rerun": 0.003}
    state = {"cases": {wl.id: {"sdpa": case(900.0, errors=sdpa_errors),
                               "hopattn": case(800.0, errors=errors)}},
             "built": {group.id: {"build_s": 10.0, "params": 123, "layers": 32, "full_layers": 32, "dropped": []}},
             "workloads": {wl.id: {"calls": [], "tokens": {"sequence": 8192}}}}
    data = models.assemble(state, [group], "20261201T101500Z", record()["runs"]["20261201T101500Z"])
    cases = data["models"][wl.id]["cases"]
    assert cases["sdpa"]["errors"] == {k: v for k, v in sdpa_errors.items() if k != "rel_err_loss"}
    assert cases["hopattn"]["errors"] == errors
    assert cases["hopattn"]["speedup_step"] == 900.0 / 800.0
    mr.validate(data)


def test_routing_backward_counts_are_checked():
    data = record()
    routing = M(data)["cases"]["hopattn"]["routing"]
    routing.update(backward=80, deterministic=0)
    mr.validate(data)
    routing.update(backward=81)
    with pytest.raises(mr.RecordError, match=r"routing.backward' must be an integer from 0 to 80"):
        mr.validate(data)
    routing.update(backward=10, deterministic=11)
    with pytest.raises(mr.RecordError, match=r"routing.deterministic' must be an integer from 0 to 10"):
        mr.validate(data)


def test_grad_errors_all_attention_and_worst():
    torch = pytest.importorskip("torch")
    from bench import model_cases

    model = torch.nn.ModuleDict({"self_attn": torch.nn.Linear(2, 2, bias=False), "mlp": torch.nn.Linear(2, 2,
                                                                                                         bias=False)})
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    ref = model_cases.host_grads(model)
    assert model_cases.grad_errors(torch, model, ref, "cpu") == {"rel_err_grads": 0.0, "rel_err_grads_attention": 0.0,
                                                                "rel_err_grads_worst": 0.0}
    model["self_attn"].weight.grad = torch.full((2, 2), 2.0)  # off by 100 %, the MLP's exact
    errs = model_cases.grad_errors(torch, model, ref, "cpu")
    assert errs["rel_err_grads_attention"] == 1.0 and errs["rel_err_grads_worst"] == 1.0
    assert errs["rel_err_grads"] == pytest.approx(0.5 ** 0.5)
    model["mlp"].weight.grad = torch.full((2, 2), float("nan"))
    assert model_cases.grad_errors(torch, model, ref, "cpu")["rel_err_grads"] is None


def test_run_step_trains_with_the_previous_gradients_dropped():
    torch = pytest.importorskip("torch")
    from bench import model_cases

    lin = torch.nn.Linear(3, 1)
    group = model_cases.Group(id="t", library="transformers", config={}, tiny_config={}, config_source="x",
                              strict=False, build=None, training=True,
                              forward=lambda torch, model, inputs: {"loss": model(inputs["x"]).sum()})
    x = {"x": torch.ones(4, 3)}
    out = model_cases.run_step(torch, group, lin, x)
    once = lin.weight.grad.clone()
    model_cases.run_step(torch, group, lin, x)
    assert torch.equal(lin.weight.grad, once) and out["loss"].grad_fn is None  # not accumulated: one step's
    inference = model_cases.Group(id="i", library="transformers", config={}, tiny_config={}, config_source="x",
                                  strict=False, build=None,
                                  forward=lambda torch, model, inputs: {"y": model(inputs["x"])})
    assert model_cases.run_step(torch, inference, lin, x)["y"].requires_grad is False


def _tiny_training(torch, group_id, monkeypatch):
    """A training group's tiny model on CPU, registered as the runner registers it."""
    from bench import model_cases, model_peers, model_runner

    group = model_cases.GROUPS[group_id]
    torch.manual_seed(0)
    model = group.build(torch, group.tiny_config, torch.device("cpu"), torch.bfloat16)
    hop = model_runner.hopattn_kernel(torch, torch.device("cpu"), dry_run=True)
    model_cases.register(group.library, "hopattn", hop, strict=True)
    model_cases.register(group.library, "capture", model_peers.as_capture(hop, "cpu"), strict=False)
    return group, model, hop


def test_fit_builds_fewer_layers_until_a_step_fits(monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from bench import model_runner

    group, model, _ = _tiny_training(torch, "llama-3.1-8b-training", monkeypatch)
    config = {**group.tiny_config, "num_hidden_layers": 4}
    model = group.build(torch, config, torch.device("cpu"), torch.bfloat16)
    monkeypatch.setenv(model_runner.PLANT_OOM, "2")  # more than 2 layers: "out of memory"
    inputs = group.workloads[0].inputs(torch, torch.device("cpu"), torch.bfloat16, True, torch.Generator().manual_seed(1))
    progress = model_runner.Progress(tmp_path / "p.jsonl")
    fitted, layers, dropped = model_runner.fit_training(torch, group, model, config, torch.device("cpu"),
                                                        torch.bfloat16, inputs, progress, seed=0)
    assert layers == 2 and [n for n, _ in dropped] == [4, 3] and "planted" in dropped[0][1]
    assert len(fitted.model.layers) == 2 and all(p.grad is None for p in fitted.parameters())
    events = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [(e["event"], e["layers"], e["full_layers"]) for e in events] == [("built", 3, 4), ("built", 2, 4)]
    monkeypatch.setenv(model_runner.PLANT_OOM, "0")


def test_training_case_compares_loss_and_gradients_with_sdpa_and_replays_forward_and_backward(monkeypatch,
                                                                                                 tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import argparse

    from bench import model_runner

    group, model, hop = _tiny_training(torch, "llama-3.1-8b-training", monkeypatch)
    wl = group.workloads[0]
    inputs = wl.inputs(torch, torch.device("cpu"), torch.bfloat16, True, torch.Generator().manual_seed(1))
    calls = model_runner.capture(torch, group, model, inputs, torch.device("cpu"))
    assert [c["reason"] for c in calls] == [None] and calls[0]["count"] == 2
    (tmp_path / f"{wl.id}.calls.json").write_text(json.dumps(calls))
    args = argparse.Namespace(warmup=1, reps=2)
    monkeypatch.setattr(model_runner, "_GRAD_REFERENCE", {})
    cpu = torch.device("cpu")
    sdpa = model_runner.run_case(torch, cpu, group, wl, model, inputs, "sdpa", {"hopattn": hop}, args, tmp_path)
    grad_keys = {"rel_err_grads", "rel_err_grads_attention", "rel_err_grads_worst", "rel_err_grads_rerun"}
    assert sdpa["status"] == "ok" and set(sdpa["errors"]) == {"rel_err_loss"} | grad_keys
    assert wl.id in model_runner._GRAD_REFERENCE  # the flash-backend step, made before SDPA's own
    assert sdpa["errors"]["rel_err_grads"] < 3e-2
    hopattn = model_runner.run_case(torch, cpu, group, wl, model, inputs, "hopattn", {"hopattn": hop}, args, tmp_path)
    errors = hopattn["errors"]
    assert set(errors) == {"rel_err_loss"} | grad_keys
    assert errors["rel_err_loss"] < 1e-2 and errors["rel_err_grads"] < 3e-2 and errors["rel_err_grads_rerun"] == 0
    assert hopattn["routing"]["served"] == hopattn["routing"]["backward"] == 2
    assert hopattn["attention_ms"] > 0 and hopattn["step_ms"]["samples"] == 2
    assert all(p.grad is None for p in model.parameters())  # nothing left for the next case
    monkeypatch.setattr(model_runner, "_GRAD_REFERENCE", {})  # a fresh process makes its own reference
    again = model_runner.run_case(torch, cpu, group, wl, model, inputs, "hopattn", {"hopattn": hop}, args, tmp_path)
    assert again["errors"]["rel_err_grads"] == errors["rel_err_grads"] and again["message"] is None


def test_training_replay_runs_forward_and_backward():
    torch = pytest.importorskip("torch")
    from hopattn.integrations import kernels, routing

    from bench import model_runner

    shape = routing.CallShape("transformers", 1, 4, 2, 16, 16, 128, True, "bhsd", "bfloat16")
    kern = kernels.reference_kernel(devices=("cpu",))
    for kernel, backend in ((kern, "hopattn"), (None, "sdpa")):
        fn, _ = model_runner.launcher_for(torch, torch.device("cpu"), kernel, backend, training=True)(shape, None)
        dq, dk, dv = fn()
        assert dq.shape == (1, 16, 4, 128) and dk.shape == dv.shape == (1, 16, 2, 128)
    fn, _ = model_runner.launcher_for(torch, torch.device("cpu"), kern, "hopattn")(shape, None)
    assert fn().shape == (1, 16, 4, 128)  # inference: the forward alone


def test_replay_gives_v_its_own_head_dim():
    """A captured MLA-prefill call (q/k 192, v 128) is replayed with v of 128, not of q's 192."""
    torch = pytest.importorskip("torch")
    from hopattn.integrations import kernels, routing

    from bench import model_runner

    shape = routing.CallShape("transformers", 1, 4, 4, 16, 16, 192, True, "bhsd", "bfloat16", head_dim_v=128)
    kern = kernels.reference_kernel(devices=("cpu",), head_dims=((192, 128),))
    for kernel, backend in ((kern, "hopattn"), (None, "sdpa")):
        fn, reason = model_runner.launcher_for(torch, torch.device("cpu"), kernel, backend)(shape, None)
        assert fn().shape == (1, 16, 4, 128), (backend, reason)


@pytest.mark.slow
def test_training_dry_run_end_to_end(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("diffusers")
    out = tmp_path / "models-cpu.json"
    proc = subprocess.run([sys.executable, "-m", "bench.models", "--dry-run", "--training", "--reps", "2",
                           "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    data = mr.load(out)
    assert set(data["models"]) == {"llama-3.1-8b-training-8k", "wan2.1-t2v-1.3b-training-480p"}
    for model in data["models"].values():
        cases = model["cases"]
        assert set(cases) == {"sdpa", "cudnn", "hopattn"} and cases["cudnn"]["status"] == "missing"
        hop = cases["hopattn"]
        assert hop["status"] == "ok" and hop["routing"]["served"] == hop["routing"]["backward"] > 0
        assert hop["errors"]["rel_err_grads"] < 3e-2 and hop["errors"]["rel_err_loss"] < 1e-2
        assert "layers" in model["workload"]


# --- SD3 (head dim 64) and Gemma 3 (head dim 256): issue #29 ------------------------------------------


def test_sd3_and_gemma3_configs_are_the_published_sizes():
    from bench import model_cases, models
    from bench import model_configs as c

    sd3 = c.SD3_MEDIUM
    assert (sd3["num_layers"], sd3["num_attention_heads"], sd3["attention_head_dim"]) == (24, 24, 64)
    assert sd3["caption_projection_dim"] == 24 * 64 and c.TINY_SD3["attention_head_dim"] == 64
    wl = model_cases.GROUPS["sd3-medium"].workloads[0]
    assert wl.tokens(False) == {"image": 4096, "text": 333}  # 1024 px / 8 / patch 2 squared; 77 CLIP + 256 T5
    g = c.GEMMA_3_12B
    assert (g["hidden_size"], g["num_hidden_layers"], g["num_attention_heads"], g["num_key_value_heads"],
            g["head_dim"], g["sliding_window"], g["query_pre_attn_scalar"]) == (3840, 48, 16, 8, 256, 1024, 256)
    assert g["attn_logit_softcapping"] is None and c.TINY_GEMMA_3["head_dim"] == 256
    gemma = model_cases.GROUPS["gemma-3-12b"]
    assert gemma.workloads[0].id == "gemma-3-12b-prefill-8k" and gemma.workloads[0].tokens(False) == {"prompt": 8192}
    assert not gemma.strict and not gemma.peers_strict and model_cases.GROUPS["sd3-medium"].strict
    assert {"sd3-medium", "gemma-3-12b"} <= {g.id for g in models.select_groups("all", training=False)}


def test_gemma3_config_has_five_sliding_layers_of_six():
    pytest.importorskip("transformers")
    import copy

    import transformers

    from bench import model_configs as c

    cfg = transformers.Gemma3TextConfig(**copy.deepcopy(c.GEMMA_3_12B))
    assert cfg.layer_types.count("sliding_attention") == 40 and cfg.layer_types.count("full_attention") == 8
    assert cfg.layer_types[5::6] == ["full_attention"] * 8 and cfg.query_pre_attn_scalar ** -0.5 == 1 / 16
    assert cfg.rope_parameters["full_attention"]["factor"] == 8.0
    tiny = transformers.Gemma3TextConfig(**copy.deepcopy(c.TINY_GEMMA_3))
    assert tiny.layer_types.count("sliding_attention") == 5 and tiny.sliding_window < 64  # the tiny prompt


def test_sd3_processor_goes_through_the_dispatcher_as_diffusers_own_computes():
    """DispatchJointAttnProcessor gives what diffusers' JointAttnProcessor2_0 gives under the native
    backend; the routed backend serves its calls, which diffusers' own processor would never reach
    (it calls F.scaled_dot_product_attention itself: a strict report finds nothing served)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    from diffusers.models.attention_processor import JointAttnProcessor2_0
    from hopattn.integrations import routing

    from bench import model_cases, model_peers, model_runner
    from bench import model_configs as c

    cpu = torch.device("cpu")
    wl = model_cases.GROUPS["sd3-medium"].workloads[0]
    torch.manual_seed(0)
    model = model_cases.build_sd3(torch, c.TINY_SD3, cpu, torch.float32)
    inputs = wl.inputs(torch, cpu, torch.float32, True, torch.Generator().manual_seed(1))
    try:
        model.set_attention_backend("native")
        with torch.no_grad():
            ours = model_cases.forward_wan(torch, model, inputs)["latents"]
            model.set_attn_processor(JointAttnProcessor2_0())
            theirs = model_cases.forward_wan(torch, model, inputs)["latents"]
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)

        torch.manual_seed(0)
        model = model_cases.build_sd3(torch, c.TINY_SD3, cpu, torch.bfloat16)
        inputs = wl.inputs(torch, cpu, torch.bfloat16, True, torch.Generator().manual_seed(1))
        hop = model_runner.hopattn_kernel(torch, cpu, dry_run=True)
        model_cases.register("diffusers", "hopattn", hop, strict=True)
        model_cases.register("diffusers", "capture", model_peers.as_capture(hop, "cpu"), strict=False)
        calls = model_runner.capture(torch, model_cases.GROUPS["sd3-medium"], model, inputs, cpu)
        assert [(x["head_dim"], x["q_len"], x["causal"], x["count"], x["reason"]) for x in calls] == \
            [(64, 64 + 12, False, 2, None)]  # joint: image and text tokens in one call, every layer
        with model_cases.backend(torch, "diffusers", model, "hopattn"):
            with routing.track(strict=True) as report:
                model_cases.run_step(torch, model_cases.GROUPS["sd3-medium"], model, inputs)
        assert report.calls == report.served == c.TINY_SD3["num_layers"]
        model.set_attn_processor(JointAttnProcessor2_0())
        with model_cases.backend(torch, "diffusers", model, "hopattn"):
            with pytest.raises(routing.RoutingError, match="no attention call went through"):
                with routing.track(strict=True):
                    model_cases.run_step(torch, model_cases.GROUPS["sd3-medium"], model, inputs)
    finally:
        model.set_attention_backend("native")  # the registry's active backend is process-wide


def test_sliding_window_calls_are_replayed_with_their_window_through_sdpa():
    torch = pytest.importorskip("torch")
    from hopattn.integrations import kernels, routing

    from bench import model_runner

    assert model_runner.sliding_window("sliding window 1024 over 8192 keys") == 1024
    assert model_runner.sliding_window(None) is None and model_runner.sliding_window("head dim 80") is None
    mask = model_runner.window_mask(torch, 4, 6, 2, "cpu")[0, 0]
    assert mask.tolist() == [[False, True, True, False, False, False], [False, False, True, True, False, False],
                             [False, False, False, True, True, False], [False, False, False, False, True, True]]

    def never(*a, **k):
        raise AssertionError("a sliding-window call reached the kernel")

    shape = routing.CallShape("transformers", 1, 4, 2, 16, 16, 256, True, "bhsd", "bfloat16")
    kern = kernels.Kernel(name="fa3", call=never, head_dims=(256,), devices=("cpu",), gqa=True)
    reason = "sliding window 4 over 16 keys"
    outs = [model_runner.launcher_for(torch, torch.device("cpu"), k, b)(shape, reason)[0]()
            for k, b in ((kern, "hopattn"), (kern, "fa3"), (None, "sdpa"))]
    assert all(torch.equal(o, outs[0]) for o in outs)
    full = model_runner.launcher_for(torch, torch.device("cpu"), None, "sdpa")(shape, "x")[0]()
    assert not torch.equal(full, outs[0])  # the window changed what was computed


def test_a_backend_that_serves_nothing_is_refused_not_timed_as_sdpa(tmp_path):
    """A non-strict group (Gemma 3) with a peer that serves none of its calls (FA4 has no head dim
    256): the case is refused, not recorded as a timing of SDPA under the peer's name."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import argparse
    from dataclasses import replace

    from hopattn.integrations import kernels, routing

    from bench import model_cases, model_peers, model_runner

    cpu = torch.device("cpu")
    group = model_cases.GROUPS["gemma-3-12b"]
    wl = group.workloads[0]
    torch.manual_seed(0)
    model = group.build(torch, group.tiny_config, cpu, torch.bfloat16)
    hop = model_runner.hopattn_kernel(torch, cpu, dry_run=True)
    model_cases.register("transformers", "capture", model_peers.as_capture(hop, "cpu"), strict=False)
    inputs = wl.inputs(torch, cpu, torch.bfloat16, True, torch.Generator().manual_seed(1))
    calls = model_runner.capture(torch, group, model, inputs, cpu)
    assert sorted((x["reason"], x["count"]) for x in calls if x["reason"]) == [("sliding window 16 over 64 keys", 5)]
    (tmp_path / f"{wl.id}.calls.json").write_text(json.dumps(calls))
    fa4 = replace(kernels.reference_kernel(devices=("cpu",), head_dims=(64, 96, 128)), name="fa4")
    model_cases.register("transformers", "fa4", fa4, strict=group.strict or group.peers_strict)
    args = argparse.Namespace(warmup=1, reps=1)
    with pytest.raises(routing.RoutingError, match="fa4 served none of the step's attention calls"):
        model_runner.run_case(torch, cpu, group, wl, model, inputs, "fa4", {"fa4": fa4}, args, tmp_path)


@pytest.mark.slow
def test_sd3_and_gemma3_dry_run_end_to_end(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("diffusers")
    out = tmp_path / "models-cpu.json"
    proc = subprocess.run([sys.executable, "-m", "bench.models", "--dry-run", "--models", "sd3-medium,gemma-3-12b",
                           "--backends", "sdpa,hopattn,fa3", "--reps", "2", "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    data = mr.load(out)
    assert set(data["models"]) == {"sd3-medium-1024px", "gemma-3-12b-prefill-8k"}
    sd3 = data["models"]["sd3-medium-1024px"]
    assert [(c["head_dim"], c["reason"]) for c in sd3["attention_calls"]] == [(64, None)] and sd3["strict"]
    hop = sd3["cases"]["hopattn"]
    assert hop["status"] == "ok" and hop["routing"]["calls"] == hop["routing"]["served"] == 2
    assert hop["routing"]["strict"] and hop["errors"]["rel_err_latents"] < 3e-2 and hop["attention_ms"] > 0
    assert sd3["cases"]["fa3"]["status"] == "missing"  # not on this machine
    gemma = data["models"]["gemma-3-12b-prefill-8k"]
    assert not gemma["strict"] and {c["head_dim"] for c in gemma["attention_calls"]} == {256}
    hop = gemma["cases"]["hopattn"]
    assert hop["status"] == "ok" and not hop["routing"]["strict"]
    assert (hop["routing"]["calls"], hop["routing"]["served"]) == (6, 1)  # the one global layer of six
    assert hop["routing"]["fallbacks"] == {"sliding window 16 over 64 keys": 5}
    assert hop["errors"]["rel_err_logits"] < 3e-2 and hop["step_ms"]["samples"] == 2
