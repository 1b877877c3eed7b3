"""A GPU test runner that cannot be hung: every GPU case runs in a worker process under a time limit.

A deadlocked kernel blocks its process inside CUDA for ever (pytest's own timeouts never fire: the
main thread is stuck in C). So the tests never launch a kernel in the pytest process. They send
each case — a function of ``gpu_cases`` and its arguments — to a worker process, which runs it and
sends back the result. The case's label is written to the log before it is sent. If the worker does
not answer within the case's limit, it is killed (and with it its CUDA context and the hung
kernel), the case fails with its label — stage, shape, mask, layout, seed — and the next case
starts a fresh worker. A worker that dies (a crash, a corrupted context) fails its case the same
way. The worker is kept between cases, so torch, CUDA and the stage libraries load once.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from pathlib import Path

STARTUP_S = 180.0  # torch import and CUDA initialisation on a cold machine
DEFAULT_CASE_S = 60.0


class CaseFailed(AssertionError):
    """The case ran and failed a check, hung past its limit, or killed its worker."""


class Worker:
    def __init__(self, log: Path, cases: str = "gpu_cases"):
        self.cases = cases  # the module whose functions the worker runs
        self.log = Path(log)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._proc = None
        self._conn = None

    def call(self, function: str, *, label: str, timeout: float = DEFAULT_CASE_S, **kwargs):
        """Runs <cases>.<function>(**kwargs) in the worker; returns its result or raises CaseFailed."""
        self._ensure_started()
        self._write(f"start {label}")
        started = time.monotonic()
        self._conn.send((function, kwargs))
        if not self._conn.poll(timeout):
            self._kill()
            self._write(f"HUNG  {label} after {timeout:.0f} s")
            raise CaseFailed(f"did not finish within {timeout:.0f} s (a hang until proven otherwise; the worker "
                             f"was killed): {label}")
        try:
            status, payload = self._conn.recv()
        except (EOFError, OSError):
            code = self._kill()
            self._write(f"DIED  {label} (exit code {code})")
            raise CaseFailed(f"the worker process died (exit code {code}): {label}") from None
        seconds = time.monotonic() - started
        reason = "" if status == "ok" else ": " + payload.strip().splitlines()[-1][:300]
        self._write(f"{status:5s} {label} in {seconds:.2f} s{reason}{_numbers(payload) if status == 'ok' else ''}")
        if status == "ok":
            return payload
        if status == "fatal":  # the worker's CUDA context no longer works: start afresh
            self._kill()
        raise CaseFailed(f"{payload}\n  case: {label}")

    def close(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._conn.send(None)
            self._proc.join(10)
        self._kill()

    def _ensure_started(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            return
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no CUDA state inherited
        self._conn, child = context.Pipe()
        self._proc = context.Process(target=_serve, args=(child, self.cases), name="hopattn-gpu-worker", daemon=True)
        self._proc.start()
        child.close()
        if not self._conn.poll(STARTUP_S):
            self._kill()
            raise CaseFailed(f"the GPU worker did not start within {STARTUP_S:.0f} s")
        self._conn.recv()  # "ready"
        self._write(f"worker {self._proc.pid} ready")

    def _kill(self):
        code = None
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(30)
            code = self._proc.exitcode
        self._proc = self._conn = None
        return code

    def _write(self, line: str) -> None:
        with self.log.open("a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {line}\n")
            f.flush()
            os.fsync(f.fileno())


def _numbers(payload) -> str:
    """A case's numeric results, for the log (" -> err=0.0012, bound=0.031"), or nothing."""
    if not isinstance(payload, dict) or not payload or not all(isinstance(v, (int, float)) for v in payload.values()):
        return ""
    return " -> " + ", ".join(f"{k}={v:.3g}" for k, v in payload.items())


def _serve(conn, cases: str) -> None:
    """The worker's loop: run each case it is sent, answer ("ok", result), ("fail", message) for a
    failed check, ("error", traceback) for any other exception, or ("fatal", traceback) for one
    after which the module's healthy() says the process cannot run GPU work any more."""
    import importlib

    module = importlib.import_module(cases)  # gpu_cases imports torch and initialises CUDA here only
    module.initialise()
    conn.send("ready")
    while True:
        request = conn.recv()
        if request is None:
            return
        function, kwargs = request
        try:
            conn.send(("ok", getattr(module, function)(**kwargs)))
        except AssertionError as err:
            conn.send(("fail", str(err)))
        except Exception:  # noqa: BLE001  (reported to the test, which fails naming the case)
            # "fatal" when the process can no longer run GPU work (a sticky CUDA error): replaced.
            healthy = getattr(module, "healthy", lambda: True)()
            conn.send(("error" if healthy else "fatal", traceback.format_exc(limit=8)))
