"""Argument parsing of python -m bench (no GPU needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench import cli

AVAIL = list(range(1, 19))
REPO = Path(__file__).resolve().parent.parent


def test_defaults_are_the_full_run():
    o = cli.parse_options([], AVAIL)
    assert o.stages is None and o.peers == ["fa3", "fa4", "cudnn", "fa2", "flex", "efficient"]
    assert [s.name for s in o.shapes] == ["4k", "8k", "16k", "32k", "512x64", "odd", "512x32k", "8k-bshd", "8k-gqa"]
    assert o.causal == (False, True)
    assert [s.name for s in cli.parse_options(["--shapes", "core"], AVAIL).shapes] == ["4k", "8k", "16k"]
    assert [s.name for s in cli.parse_options(["--shapes", "8k,users"], AVAIL).shapes][:2] == ["8k", "32k"]
    assert (o.rounds, o.launches) == (5, 10)
    assert o.out is None and o.raw is None and o.seed is None
    assert o.command == "python -m bench"


def test_quick_is_8k_non_causal_with_fewer_repetitions():
    o = cli.parse_options(["--quick", "--stages", "1"], AVAIL)
    assert [s.name for s in o.shapes] == ["8k"] and o.causal == (False,)
    assert (o.rounds, o.launches) == (3, 5) and o.stages == [1]
    assert o.command == "python -m bench --quick --stages 1"


def test_explicit_flags_override_quick():
    o = cli.parse_options(["--quick", "--shapes", "4k,16k", "--causal", "both", "--reps", "7", "--launches", "2",
                           "--out", "x/y.json", "--raw", "r.json", "--peers", "cudnn,fa4", "--seed", "3"], AVAIL)
    assert [s.name for s in o.shapes] == ["4k", "16k"] and o.causal == (False, True)
    assert (o.rounds, o.launches, o.seed) == (7, 2, 3)
    assert o.out == Path("x/y.json") and o.raw == Path("r.json")
    assert o.peers == ["fa4", "cudnn"]  # canonical order: references first


@pytest.mark.parametrize("argv, message", [
    (["--stages", "1,40"], "--stages: no stage 40"),
    (["--shapes", "64k"], "--shapes: unknown shape"),
    (["--reps", "0"], "--reps"),
    (["--launches", "0"], "--launches"),
    (["--peers", "fa5"], "--peers: unknown peer 'fa5'"),
])
def test_bad_flags_name_the_flag(argv, message):
    with pytest.raises(ValueError, match=message):
        cli.parse_options(argv, AVAIL)


def test_peers_none_and_causal_on():
    o = cli.parse_options(["--peers", "none", "--causal", "on", "--stages", "none"], AVAIL)
    assert o.peers == [] and o.causal == (True,) and o.stages == []


def test_default_out_uses_the_gpu_slug():
    assert cli.default_out("NVIDIA H200") == REPO / "bench" / "results" / "nvidia-h200.json"


def _bench(*args):
    env = {"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}  # the installed package, no path edits
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_module_reports_bad_flags_before_needing_a_gpu():
    proc = _bench("--stages", "99")
    assert proc.returncode == 2 and "--stages: no stage 99" in proc.stderr


def test_module_without_gpu_writes_nothing(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "r.json"
    proc = _bench("--quick", "--out", str(out))
    assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr
    assert not out.exists()
