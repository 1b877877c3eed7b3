"""What the runner times: an arm (a stage or a peer) and the launcher it prepares for one shape.

A forward arm defines prepare(q, k, v, causal, scale); a backward arm (bench.backward) defines
prepare_backward(q, k, v, dout, causal, scale), whose launcher returns (dq, dk, dv)."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Launch:
    """One arm made ready for one set of inputs: layout changes and masks are done, so fn is the timed call."""

    fn: Callable[[], Any]
    to_bhsd: Callable[[Any], Any] = lambda out: out  # the result as a BHSD tensor (for the check only)
    context: Callable[[], Any] = field(default=nullcontext)  # entered around launches, outside the events


class Arm:
    kind = "peer"
    name = ""
    label = ""
    source_hash = None
    layout = "bhsd"  # how the current shape stores its inputs (the runner sets it per shape)

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.name}"

    @property
    def short(self) -> str:
        return f"stage {self.name}" if self.kind == "stage" else self.name

    def applies(self, shape, causal: bool):
        """None when the arm can run this shape, else (status, reason) with status skipped|missing|failed."""
        return None

    def prepare(self, q, k, v, causal: bool, scale: float) -> Launch:
        """The launcher for these inputs; every concrete arm (stage or peer) defines it."""
        raise NotImplementedError(f"{type(self).__name__} must define prepare()")

    def missing_reason(self, err: BaseException) -> str | None:
        """When an error while checking means the arm does not exist in this install (an inference-only
        build asked for a backward), why: the arm is then reported missing, not failed. None otherwise."""
        return None
