"""Environment readings: nvidia-smi parsing (absent or partial), the git state fallbacks and the run
header (hopattn.records.runs)."""

from __future__ import annotations

import subprocess

import pytest
from hopattn.records import runs

from bench import env


def test_parse_smi_reads_clocks_and_power():
    assert env.parse_smi("1980, 3201, 1980, 700.00\n") == {
        "sm_mhz": 1980, "mem_mhz": 3201, "max_sm_mhz": 1980, "power_limit_w": 700.0}


def test_parse_smi_tolerates_unsupported_and_garbage():
    assert env.parse_smi("345, [N/A], 1980, [Not Supported]") == {
        "sm_mhz": 345, "mem_mhz": None, "max_sm_mhz": 1980, "power_limit_w": None}
    empty = {"sm_mhz": None, "mem_mhz": None, "max_sm_mhz": None, "power_limit_w": None}
    assert env.parse_smi("") == empty
    assert env.parse_smi("Failed to initialize NVML: Unknown Error") == empty


def test_read_clocks_without_nvidia_smi(monkeypatch):
    monkeypatch.setattr(env.shutil, "which", lambda name: None)
    assert env.read_clocks() == {"sm_mhz": None, "mem_mhz": None, "max_sm_mhz": None, "power_limit_w": None}
    assert env.driver_version() is None


def test_git_state_outside_a_checkout_uses_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("HOPATTN_GIT_COMMIT", raising=False)
    monkeypatch.delenv("HOPATTN_GIT_DIRTY", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert runs.git_state(tmp_path) == (None, None)
    monkeypatch.setenv("HOPATTN_GIT_COMMIT", "AB" * 20)
    monkeypatch.setenv("HOPATTN_GIT_DIRTY", "1")
    assert runs.git_state(tmp_path) == ("ab" * 20, True)
    for bad in ("not-a-commit", "87c9906"):  # an abbreviated hash is refused too, not silently dropped
        monkeypatch.setenv("HOPATTN_GIT_COMMIT", bad)
        with pytest.raises(ValueError, match="HOPATTN_GIT_COMMIT"):
            runs.git_state(tmp_path)


def test_git_state_in_a_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv("HOPATTN_GIT_COMMIT", raising=False)
    monkeypatch.delenv("HOPATTN_GIT_DIRTY", raising=False)

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "a.txt").write_text("1")
    git("add", "a.txt")
    git("commit", "-q", "-m", "x")
    commit, dirty = runs.git_state(tmp_path)
    assert len(commit) == 40 and dirty is False
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "gpu.json").write_text("{}")
    assert runs.git_state(tmp_path)[1] is False  # the file a run writes does not make the tree dirty
    (tmp_path / "a.txt").write_text("2")
    assert runs.git_state(tmp_path)[1] is True
    # A copy on a GPU machine may carry a stale .git: the environment, when set, names the commit.
    monkeypatch.setenv("HOPATTN_GIT_COMMIT", "cd" * 20)
    monkeypatch.setenv("HOPATTN_GIT_DIRTY", "0")
    assert runs.git_state(tmp_path) == ("cd" * 20, False)


def test_run_header_and_log_header():
    run = runs.new_run("python -m bench --quick", {"gpu_name": "X"}, date="2026-12-01T10:00:00Z", git=("ab" * 20, True))
    assert run == {"date": "2026-12-01T10:00:00Z", "git_commit": "ab" * 20, "git_dirty": True,
                   "command": "python -m bench --quick", "environment": {"gpu_name": "X"}}
    assert runs.log_header("python -m bench --quick", git=("ab" * 20, False), date="2026-12-01T10:00:00Z") == (
        "# python -m bench --quick (2026-12-01T10:00:00Z, source abababa)")
    assert runs.log_header("x", git=(None, None), date="D") == "# x (D, source unknown)"
    assert runs.log_header("x", git=("cd" * 20, True), date="D") == "# x (D, source cdcdcdc with uncommitted changes)"


def test_shown_path_is_one_a_reader_can_open(tmp_path):
    assert runs.shown_path(runs.REPO_ROOT / "bench" / "results" / "nvidia-h200.json") == "bench/results/nvidia-h200.json"
    assert runs.shown_path(tmp_path / "raw_core.json", root=tmp_path / "repo") == "raw_core.json (outside the repository)"


def test_model_runs_share_the_run_header():
    from hopattn.records import models

    run = models.new_run("python -m bench.models", {}, dry_run=True, date="2026-12-01T10:00:00Z", git=(None, None))
    assert run == {"date": "2026-12-01T10:00:00Z", "git_commit": None, "dirty": None, "dry_run": True,
                   "command": "python -m bench.models", "environment": {}}
