"""A guard against kernels that never finish (a deadlocked barrier ring, say): a hung launch blocks the
main thread in CUDA forever, so a second thread notices the missed deadline, lets the runner save what
it has measured, and ends the process. Without it a hang would cost the whole GPU session and every number."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager


class Watchdog:
    def __init__(self, on_timeout, clock=time.monotonic, poll_s: float = 1.0):
        self.on_timeout, self.clock, self.poll_s = on_timeout, clock, poll_s
        self._lock = threading.Lock()
        self._deadline = None
        self._what = None
        self._fired = False
        self._thread = threading.Thread(target=self._loop, name="bench-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def step(self, what: str, seconds: float):
        """Run the body with a deadline; on_timeout(what, seconds) is called from the watchdog if it passes."""
        with self._lock:
            self._deadline, self._what, self._seconds = self.clock() + seconds, what, seconds
        try:
            yield
        finally:
            with self._lock:
                self._deadline = self._what = None

    @property
    def fired(self) -> bool:
        return self._fired

    def _loop(self):
        while not self._fired:
            time.sleep(self.poll_s)
            with self._lock:
                late = self._deadline is not None and self.clock() > self._deadline
                what, seconds = self._what, getattr(self, "_seconds", 0)
            if late:
                self._fired = True
                self.on_timeout(what, seconds)
