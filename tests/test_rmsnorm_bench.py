"""python -m bench.rowwise without a GPU: its sizes move at least 64 MB, its selections, the record
it writes (sorted, rounded, a stage's source hash), and that it refuses to run without CUDA."""

import json

import pytest
from hopattn import rowwise as lineage_rowwise

from bench import rowwise


def test_sizes_move_at_least_64_mb_of_bf16():
    for rows, cols in rowwise.SIZES.values():
        assert 2 * rows * cols * 2 >= 64 << 20
    assert [c for _, c in rowwise.SIZES.values()] == [4096, 8192, 16384, 65536, 262144]


def test_selections():
    assert rowwise._choose("all", rowwise.SIZES, "sizes") == list(rowwise.SIZES)
    assert rowwise._choose("256k, 4k", rowwise.SIZES, "sizes") == ["4k", "256k"]
    assert rowwise._choose("none", ("eager",), "peers") == []
    with pytest.raises(SystemExit, match="--peers: unknown 'flash'"):
        rowwise._choose("flash", ("eager", "quack"), "peers")


def test_record_is_rounded_and_carries_the_source(monkeypatch):
    monkeypatch.setenv("HOPATTN_GIT_COMMIT", "0" * 40)
    monkeypatch.setenv("HOPATTN_GIT_DIRTY", "0")
    stage = lineage_rowwise.discover()[-1]
    entries = [{"size": "4k", "arm": f"stage {stage.id}", "kind": "stage", "status": "ok", "gbps": 3456.123456789,
                "median_ms": 0.1234567891, "vs": {"copy": 0.812345678}, "variant": None},
               {"size": "4k", "arm": "quack", "kind": "peer", "status": "missing", "reason": "not importable"}]
    data = rowwise.record(entries, {"gpu_name": "NVIDIA H200"}, "python -m bench.rowwise", {stage.number: "abc"},
                          "nvidia-h200")
    assert data["schema_version"] == 1 and data["op"] == "rmsnorm" and data["run"]["git_commit"] == "0" * 40
    first = data["entries"][0]
    assert first == {"size": "4k", "arm": f"stage {stage.id}", "kind": "stage", "status": "ok", "gbps": 3456.12,
                     "median_ms": 0.123457, "vs": {"copy": 0.8123}, "source_hash": "abc"}
    json.dumps(data, sort_keys=True)


def test_without_cuda_it_says_so_and_writes_nothing(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the benchmark would run")
    assert rowwise.main(["--sizes", "4k", "--out", str(tmp_path / "r.json")]) == 2
    assert not (tmp_path / "r.json").exists()
