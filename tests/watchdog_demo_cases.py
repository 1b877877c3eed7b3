"""Stand-ins for GPU cases, for the CPU test of the watchdog (test_gpu_watchdog.py): one that
passes, one that fails a check, one that never returns (a deadlocked kernel), one that kills its
process (a crash), one that raises."""

import os
import time


def initialise() -> None:
    pass


def passes(x: int) -> int:
    return 2 * x


def fails() -> None:
    raise AssertionError("relative error 3.1e-01 against float64")


def hangs() -> None:
    while True:
        time.sleep(1)


def crashes() -> None:
    os._exit(3)


def raises() -> None:
    raise ValueError("q: expected a CUDA tensor")


def poisons() -> None:
    global _POISONED
    _POISONED = True
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


_POISONED = False


def healthy() -> bool:
    return not _POISONED


def pid() -> int:
    return os.getpid()
