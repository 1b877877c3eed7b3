"""Part II's pictures, drawn from a rowwise stage's stage.toml (hopattn.rowwise) as the attention
stages' are from theirs:

  holders_diagram     who holds which bytes of a row (thread, warp, CTA, cluster) at 4k-256k bf16
  reduction_diagram   the reduction tree of the sum of squares: registers, shuffles, shared memory, DSMEM
  traffic_diagram     bytes per element (read once or twice, written once) and the roofline placement

model.py deals a row out to the stage's launch configurations ([[config]]); rowwise_diagrams(stage,
stages) returns the three in page order, a pure function of the specs.
"""

from __future__ import annotations

from ..diagram import Diagram
from .holders import holders_diagram
from .reduction import reduction_diagram
from .traffic import traffic_diagram

__all__ = ["holders_diagram", "reduction_diagram", "rowwise_diagrams", "traffic_diagram"]


def rowwise_diagrams(stage, stages=()) -> list[Diagram]:
    return [holders_diagram(stage, stages), reduction_diagram(stage, stages), traffic_diagram(stage, stages)]
