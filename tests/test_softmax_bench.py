"""python -m bench.rowwise_softmax without a GPU: its sizes (the numbers to beat's, at least 64 MB
moved each), the record it writes (one folder per direction, validating as the site reads records),
and that it refuses to run without CUDA."""

import json

import pytest
from hopattn import softmax_lineage

from bench import rowwise_softmax


def test_sizes_and_folders():
    assert [c for _, c in rowwise_softmax.SIZES.values()] == [4096, 16384, 65536, 262144]
    for rows, cols in rowwise_softmax.SIZES.values():
        assert 2 * rows * cols * 2 >= 64 << 20
    assert rowwise_softmax.DIRECTIONS == {"forward": "softmax", "backward": "softmax_backward"}


def test_record_is_rounded_and_carries_the_source(monkeypatch):
    monkeypatch.setenv("HOPATTN_GIT_COMMIT", "0" * 40)
    monkeypatch.setenv("HOPATTN_GIT_DIRTY", "0")
    stage = softmax_lineage.discover()[-1]
    entries = [{"size": "4k", "rows": 32768, "cols": 4096, "dtype": "bf16", "arm": f"stage {stage.id}", "kind": "stage",
                "bytes": 2 * 32768 * 4096 * 2, "status": "ok", "gbps": 3456.123456789, "median_ms": 0.1234567891,
                "spread_pct": 1.0, "vs": {"copy": 0.812345678}, "variant": None, "max_rel_err": 1e-3},
               {"size": "4k", "rows": 32768, "cols": 4096, "dtype": "bf16", "arm": "liger", "kind": "peer",
                "bytes": 1, "status": "missing", "reason": "not importable"}]
    data = rowwise_softmax.record("softmax", entries, {"gpu_name": "NVIDIA H200"}, "python -m bench.rowwise_softmax",
                                  {stage.number: "0123456789abcdef"}, "nvidia-h200")
    assert data["op"] == "softmax" and data["entries"][0]["gbps"] == 3456.12
    assert data["entries"][0]["source_hash"] == "0123456789abcdef"
    json.dumps(data, sort_keys=True)
    try:
        from hopattn.records import rowwise as records
    except ImportError:
        return
    records.validate(data)


def test_without_cuda_it_says_so(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the benchmark would run")
    assert rowwise_softmax.main(["--sizes", "4k"]) == 2
    with pytest.raises(SystemExit, match="--peers: unknown 'flash'"):
        rowwise_softmax.main(["--peers", "flash"])
