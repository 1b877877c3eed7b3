"""python -m bench.rowwise_backward without a GPU: its sizes are the forward's, the bytes it counts,
the record it writes (sorted, rounded, each stage's source hash, the op's own folder), that a record
it writes validates as the site reads it, and that it refuses to run without CUDA."""

import json

import pytest
from hopattn import rowwise_backward as lineage_backward

from bench import rowwise, rowwise_backward


def test_sizes_and_folder():
    assert rowwise_backward.SIZES == rowwise.SIZES
    assert rowwise_backward.RESULTS.name == "rmsnorm_backward" and rowwise_backward.RESULTS.parent.name == "results"
    for rows, cols in rowwise_backward.SIZES.values():
        assert 3 * rows * cols * 2 >= 64 << 20  # x and dy read, dx written: at least 64 MB


def test_record_is_rounded_and_carries_the_source(monkeypatch):
    monkeypatch.setenv("HOPATTN_GIT_COMMIT", "0" * 40)
    monkeypatch.setenv("HOPATTN_GIT_DIRTY", "0")
    stage = lineage_backward.discover()[-1]
    entries = [{"size": "4k", "rows": 32768, "cols": 4096, "dtype": "bf16", "arm": f"stage {stage.id}", "kind": "stage",
                "bytes": 3 * 32768 * 4096 * 2, "status": "ok", "gbps": 3456.123456789, "median_ms": 0.1234567891,
                "spread_pct": 1.0, "vs": {"copy": 0.812345678}, "variant": None, "max_rel_err": 1.23456789e-3,
                "dw_rel_err": None},
               {"size": "4k", "rows": 32768, "cols": 4096, "dtype": "bf16", "arm": "quack", "kind": "peer",
                "bytes": 1, "status": "missing", "reason": "not importable"}]
    data = rowwise_backward.record(entries, {"gpu_name": "NVIDIA H200"}, "python -m bench.rowwise_backward",
                                   {stage.number: "0123456789abcdef"}, "nvidia-h200")
    assert data["op"] == "rmsnorm_backward" and data["schema_version"] == 1
    first = data["entries"][0]
    assert first["gbps"] == 3456.12 and first["vs"] == {"copy": 0.8123} and first["max_rel_err"] == 0.00123457
    assert "dw_rel_err" not in first and first["source_hash"] == "0123456789abcdef"
    json.dumps(data, sort_keys=True)
    try:
        from hopattn.records import rowwise as records
    except ImportError:
        return  # the site's reader of these records is not here yet
    records.validate(data)


def test_without_cuda_it_says_so_and_writes_nothing(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the benchmark would run")
    assert rowwise_backward.main(["--sizes", "4k", "--out", str(tmp_path / "r.json")]) == 2
    assert not (tmp_path / "r.json").exists()


def test_selections_are_checked():
    with pytest.raises(SystemExit, match="--peers: unknown 'flash'"):
        rowwise_backward.main(["--peers", "flash"])
