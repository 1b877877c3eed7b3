"""The hang guard: fires once when a step overruns its deadline, never for steps that finish."""

from __future__ import annotations

import threading
import time

from bench.watchdog import Watchdog


def test_fires_for_a_step_that_overruns():
    fired = threading.Event()
    calls = []

    def on_timeout(what, seconds):
        calls.append((what, seconds))
        fired.set()

    dog = Watchdog(on_timeout, poll_s=0.02)
    with dog.step("checking stage 11", 0.1):
        assert fired.wait(5)
    assert calls == [("checking stage 11", 0.1)] and dog.fired


def test_quiet_for_steps_that_finish_and_between_steps():
    calls = []
    dog = Watchdog(lambda what, s: calls.append(what), poll_s=0.02)
    for _ in range(3):
        with dog.step("quick", 0.5):
            time.sleep(0.05)
    time.sleep(0.7)  # no step armed: no deadline
    assert calls == [] and not dog.fired
