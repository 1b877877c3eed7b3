"""The backward's pictures (Act V), drawn from a backward stage's stage.toml like the forward's:

  operands_diagram   where the operands of the five GEMMs live (global, shared memory, registers)
  dq_diagram         how the key blocks' shares of dQ are summed: atomics, or bulk reduce-adds from shared
                     memory; the deterministic pass, or additions in key-block order
  roles_diagram      the warps by role over a few query blocks, with the CTA barriers between them
  cta_order_diagram  (stages whose [launch] cta_order is "heavy-first") a model of the causal grid's CTAs
                     placed on the SMs in the order they start, blockIdx's above and the stage's below
  dq_convert_diagram (stages whose [movement] dq_convert is "staged rows") one warp store instruction of the
                     dQ conversion on the sectors it writes: the fragment form above, the staged rows below
  timeline_diagram   the schedule model's placement of a few query blocks (diagrams/timeline.py)

backward_diagrams(stage, stages) returns them in page order; a pure function of the specs (and, for
cta_order_diagram, of the WINDOW_WAVES of the stage's kernel.cu).
"""

from __future__ import annotations

from ..diagram import Diagram
from ..timeline import timeline_diagram
from .cta_order import cta_order_diagram
from .dq import dq_diagram
from .dq_convert import dq_convert_diagram
from .operands import operands_diagram
from .roles import roles_diagram

__all__ = ["backward_diagrams", "cta_order_diagram", "dq_convert_diagram", "dq_diagram", "operands_diagram",
           "roles_diagram"]


def backward_diagrams(stage, stages) -> list[Diagram]:
    out = [operands_diagram(stage, stages), dq_diagram(stage, stages), roles_diagram(stage, stages)]
    if stage.cta_order == "heavy-first":
        out.append(cta_order_diagram(stage, stages))
    if stage.movement.dq_convert == "staged rows":
        out.append(dq_convert_diagram(stage, stages))
    return out + [timeline_diagram(stage, stages)]
