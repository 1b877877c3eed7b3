"""End to end on a CUDA GPU: `python -m bench --quick --stages 1` writes a valid results file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _cuda_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    return None if torch.cuda.is_available() else "no CUDA GPU (torch.cuda.is_available() is false)"


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_cuda_reason() is not None, reason=_cuda_reason() or "")]


def test_quick_run_of_stage_01_writes_a_valid_file(tmp_path):
    import torch
    from hopattn import lineage
    from hopattn.records import results

    # named like the real file, so load_results' check that 'gpu' matches the file name applies too
    out = tmp_path / f"{results.gpu_slug(torch.cuda.get_device_name())}.json"
    raw = tmp_path / "raw.json"
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "bench", "--quick", "--stages", "1", "--reps", "2", "--out", str(out),
           "--raw", str(raw)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    data = results.load_results(out)
    entries = {(e["kind"], e["name"]): e for e in data["results"]}
    stage = entries[("stage", "01")]
    assert (stage["shape"], stage["causal"], stage["len_q"]) == ("8k", False, 8192)
    assert stage["status"] == "ok", stage["reason"]
    assert stage["rel_err"] < 1e-2 and stage["tflops"] > 0 and stage["samples"] == 2
    assert stage["source_hash"] == lineage.discover()[0].source_hash()
    for name in ("fa4", "cudnn", "fa2", "flex", "efficient"):
        peer = entries[("peer", name)]
        assert peer["status"] in ("ok", "missing", "failed", "wrong")
        if peer["status"] != "ok":
            assert peer["reason"]
    if entries[("peer", "cudnn")]["status"] == "ok":
        assert "cudnn" in stage["ratios"]
    run = data["runs"][stage["run_id"]]
    assert run["environment"]["sm_count"] > 0
    assert "stage 01" in proc.stdout and "vs fa4" in proc.stdout  # progress and the summary table
    raw_data = json.loads(raw.read_text())
    assert raw_data["configs"][0]["arms"]["stage:01"]["round_ms"] and raw_data["log"]

