"""The GPU runner's watchdog, on the CPU with stand-in cases: a case that never returns fails,
naming it, within its limit, and the next case runs in a fresh worker; so do crashes."""

import time

import pytest
from gpu_watchdog import CaseFailed, Worker


@pytest.fixture
def worker(tmp_path):
    w = Worker(tmp_path / "cases.log", cases="watchdog_demo_cases")
    yield w
    w.close()


def test_a_hung_case_fails_naming_it_and_the_next_case_runs(worker, tmp_path):
    assert worker.call("passes", label="warm-up", x=1) == 2
    first = worker.call("pid", label="pid")
    start = time.monotonic()
    with pytest.raises(CaseFailed, match=r"did not finish within 2 s .*stage 19, \(B, H, Lq, Lk\)=\(9, 15, 512, 256\)"):
        worker.call("hangs", label="stage 19, (B, H, Lq, Lk)=(9, 15, 512, 256), causal=True, seed 7", timeout=2)
    assert time.monotonic() - start < 30
    assert worker.call("passes", label="after the hang", x=21) == 42
    assert worker.call("pid", label="pid") != first  # a fresh worker
    log = (tmp_path / "cases.log").read_text()
    assert "start stage 19, (B, H, Lq, Lk)=(9, 15, 512, 256)" in log and "HUNG  stage 19" in log


def test_failed_checks_keep_the_worker_and_errors_replace_it(worker):
    first = worker.call("pid", label="pid")
    with pytest.raises(CaseFailed, match="relative error 3.1e-01.*\n  case: fuzz #4"):
        worker.call("fails", label="fuzz #4")
    assert worker.call("pid", label="pid") == first  # a failed check leaves the context usable
    with pytest.raises(CaseFailed, match="q: expected a CUDA tensor"):
        worker.call("raises", label="fuzz #5")
    assert worker.call("pid", label="pid") == first  # an exception that leaves the process healthy
    with pytest.raises(CaseFailed, match="illegal memory access"):
        worker.call("poisons", label="fuzz #6")
    assert worker.call("pid", label="pid") != first  # a sticky error: a fresh process and CUDA context


def test_a_crash_fails_its_case(worker):
    with pytest.raises(CaseFailed, match=r"worker process died \(exit code 3\): fuzz #9"):
        worker.call("crashes", label="fuzz #9")
    assert worker.call("passes", label="after the crash", x=2) == 4
