"""The results file format: validation errors name file and field, fixed precision, merge, staleness."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hopattn import lineage
from hopattn.records import results
from hopattn.records.results import ResultsError

RUN_ID = "20261129T153000Z"


def make_run(**over) -> dict:
    run = {
        "date": "2026-11-29T15:30:00Z", "git_commit": "a" * 40, "git_dirty": False,
        "command": "python -m bench --quick",
        "environment": {
            "gpu_name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132,
            "driver": "580.159.04", "cuda": "13.0", "torch": "2.11.0+cu130", "cudnn": "91900",
            "clocks_before": {"sm_mhz": 1980, "mem_mhz": 3201}, "clocks_after": {"sm_mhz": 1980, "mem_mhz": 3201},
            "max_sm_mhz": 1980, "power_limit_w": 700.0,
        },
    }
    run.update(over)
    return run


def make_entry(**over) -> dict:
    entry = {
        "kind": "stage", "name": "01", "label": "Baseline", "run_id": RUN_ID,
        "shape": "4k", "batch": 8, "heads": 16, "len_q": 4096, "len_k": 4096, "head_dim": 128,
        "causal": False, "status": "ok", "reason": None, "source_hash": "5cfbaa35cc7e3b3a",
        "median_ms": 1.23456789, "min_ms": 1.2, "max_ms": 1.3, "spread_pct": 8.1234, "samples": 5,
        "tflops": 640.123, "rel_err": 0.0021456, "ratios": {"fa4": 0.95234, "cudnn": 1.02149},
    }
    entry.update(over)
    return entry


def make_data(*entries, run_id=RUN_ID) -> dict:
    return {"schema_version": 1, "gpu": "nvidia-h200", "runs": {run_id: make_run()},
            "results": list(entries) or [make_entry()]}


def write(tmp_path: Path, data, name="nvidia-h200.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_round_trip_fixed_precision_and_sorted(tmp_path):
    peer = make_entry(kind="peer", name="fa4", label="FlashAttention-4 (CuTe DSL)", source_hash=None)
    later = make_entry(shape="8k", causal=True)
    path = tmp_path / "nvidia-h200.json"
    results.dump_results(make_data(peer, later, make_entry()), path)
    loaded = results.load_results(path)
    keys = [(e["kind"], e["name"], e["shape"], e["causal"]) for e in loaded["results"]]
    assert keys == sorted(keys)
    e = loaded["results"][0]
    assert e["median_ms"] == 1.2346 and e["tflops"] == 640.1 and e["spread_pct"] == 8.12
    assert e["rel_err"] == 0.00215 and e["ratios"] == {"fa4": 0.952, "cudnn": 1.021}
    text = path.read_text()
    assert text == results.to_json(loaded)  # already normalised: byte-identical when rewritten
    results.dump_results(loaded, path)
    assert path.read_text() == text
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write cleaned up


def test_dump_refuses_invalid_data_and_keeps_old_file(tmp_path):
    path = tmp_path / "nvidia-h200.json"
    results.dump_results(make_data(), path)
    before = path.read_text()
    with pytest.raises(ResultsError, match=r"results\[0\]\.tflops"):
        results.dump_results(make_data(make_entry(tflops=None)), path)
    assert path.read_text() == before


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.pop("schema_version"), "schema_version"),
    (lambda d: d.update(schema_version=3), "schema_version"),  # 2 is the backward's version: read too
    (lambda d: d["results"][0].update(kind="kernel"), "results[0].kind"),
    (lambda d: d["results"][0].update(name="1"), "results[0].name"),
    (lambda d: d["results"][0].pop("median_ms"), "results[0].median_ms"),
    (lambda d: d["results"][0].update(median_ms=2.0), "results[0].median_ms"),
    (lambda d: d["results"][0].update(tflops="fast"), "results[0].tflops"),
    (lambda d: d["results"][0].update(causal=0), "results[0].causal"),
    (lambda d: d["results"][0].update(batch=True), "results[0].batch"),
    (lambda d: d["results"][0].update(run_id="20261129T000000Z"), "results[0].run_id"),
    (lambda d: d["results"][0].update(source_hash="xyz"), "results[0].source_hash"),
    (lambda d: d["results"][0].update(ratios={"fa2": 1.0}), "results[0].ratios"),
    (lambda d: d["results"][0].update(ratios={"fa4": -1.0}), "results[0].ratios.fa4"),
    (lambda d: d["results"][0].update(reason="why not"), "results[0].reason"),
    (lambda d: d["results"][0].update(status="wrong"), "results[0].reason"),
    (lambda d: d["results"][0].update(status="wrong", reason="rel err 0.5"), "results[0].median_ms"),
    (lambda d: d["results"].append(copy.deepcopy(d["results"][0])), "results[1]"),
    (lambda d: d["runs"][RUN_ID].update(git_commit="HEAD"), f"runs.{RUN_ID}.git_commit"),
    (lambda d: d["runs"][RUN_ID]["environment"].pop("sm_count"), f"runs.{RUN_ID}.environment.sm_count"),
    (lambda d: d["runs"][RUN_ID]["environment"].update(clocks_before={"sm_mhz": "x", "mem_mhz": 1}),
     f"runs.{RUN_ID}.environment.clocks_before.sm_mhz"),
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: d.update(gpu="NVIDIA H200"), "gpu"),
])
def test_broken_file_names_file_and_field(tmp_path, mutate, field):
    data = make_data()
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(ResultsError) as err:
        results.load_results(path)
    msg = str(err.value)
    assert str(path) in msg and f"field '{field}'" in msg


def test_not_json_and_missing_file(tmp_path):
    path = tmp_path / "nvidia-h200.json"
    path.write_text("{not json")
    with pytest.raises(ResultsError, match="not valid JSON"):
        results.load_results(path)
    with pytest.raises(ResultsError, match="cannot read"):
        results.load_results(tmp_path / "absent.json")


def test_gpu_must_match_file_name(tmp_path):
    path = write(tmp_path, make_data(), name="nvidia-h100.json")
    with pytest.raises(ResultsError, match="field 'gpu' must match the file name"):
        results.load_results(path)


def test_non_ok_entries_keep_nulls_and_reason(tmp_path):
    wrong = make_entry(status="wrong", reason="rel err 0.5 >= 0.01", rel_err=0.5,
                       **{k: None for k in results.TIMING_FIELDS})
    missing = make_entry(kind="peer", name="fa4", label="FlashAttention-4", source_hash=None, status="missing",
                         reason="flash_attn.cute not importable", rel_err=None,
                         **{k: None for k in results.TIMING_FIELDS})
    path = tmp_path / "nvidia-h200.json"
    results.dump_results(make_data(wrong, missing), path)
    assert {e["status"] for e in results.load_results(path)["results"]} == {"wrong", "missing"}


def test_null_git_and_smi_fields_allowed():
    data = make_data()
    run = data["runs"][RUN_ID]
    run.update(git_commit=None, git_dirty=None)
    run["environment"].update(clocks_before=None, clocks_after=None, max_sm_mhz=None, power_limit_w=None,
                              driver=None)
    results.validate(data, "x.json")


def test_load_all(tmp_path):
    assert results.load_all(tmp_path / "none") == {}
    results.dump_results(make_data(), tmp_path / "nvidia-h200.json")
    assert list(results.load_all(tmp_path)) == ["nvidia-h200"]


def test_merge_replaces_same_key_and_keeps_rest():
    old = make_data(make_entry(name="01"), make_entry(name="07", tflops=1.0))
    new_id = "20261130T100000Z"
    new = make_data(make_entry(name="07", tflops=500.0, run_id=new_id), run_id=new_id)
    merged = results.merge(old, new)
    by_name = {e["name"]: e for e in merged["results"]}
    assert by_name["07"]["tflops"] == 500.0 and by_name["07"]["run_id"] == new_id
    assert by_name["01"]["run_id"] == RUN_ID
    assert set(merged["runs"]) == {RUN_ID, new_id}
    results.validate(merged)
    # a run that no entry refers to any more is dropped
    newer_id = "20261201T100000Z"
    newest = make_data(make_entry(name="01", run_id=newer_id), make_entry(name="07", run_id=newer_id),
                       run_id=newer_id)
    assert set(results.merge(merged, newest)["runs"]) == {newer_id}
    assert results.merge(None, new)["results"] == new["results"]


def test_merge_refuses_other_gpu():
    other = make_data()
    other["gpu"] = "nvidia-h100"
    with pytest.raises(ResultsError, match="nvidia-h100"):
        results.merge(make_data(), other)


def test_gpu_slug():
    assert results.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert results.gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert results.gpu_slug("  GeForce RTX 4090 (laptop) ") == "geforce-rtx-4090-laptop"


def test_is_stale():
    entry = make_entry(source_hash="5cfbaa35cc7e3b3a")
    assert not results.is_stale(entry, "5cfbaa35cc7e3b3a")
    assert results.is_stale(entry, "0000000000000000")
    peer = make_entry(kind="peer", name="fa4", source_hash=None)
    assert not results.is_stale(peer, "0000000000000000")


def test_is_stale_with_real_stage():
    stage = lineage.discover()[0]
    assert not results.is_stale(make_entry(source_hash=stage.source_hash()), stage.source_hash())
    assert results.is_stale(make_entry(source_hash="0" * 16), stage.source_hash())


def test_committed_results_are_valid_and_canonical():
    paths = sorted((lineage.ATTENTION_DIR.parent.parent / "bench" / "results").glob("*.json"))
    for path in (p for p in paths if not p.name.startswith("models-")):  # tests/test_bench_models.py checks those
        data = results.load_results(path)
        assert path.read_text() == results.to_json(results.normalize(data)), path

