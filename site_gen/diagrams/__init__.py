"""Diagrams generated from the stages' specs (stage.toml), as self-contained SVG strings.

  Diagram                         one picture: id, title, kind, stage, svg, caption (diagram.py)
  stage_diagrams(stage, stages)   memory movement, warp roles, pipeline timeline of one stage
                                  (and its code by role, stage 23 on)
  concept_diagrams(stage, stages) the concept pictures the stage introduces (table in concepts/)
  doc_diagrams(stages)            the figures of the hand-written pages (introduction, Hopper model)
  all_diagrams(stages)            every stage's, in site order

Every function is a pure function of the stages: the same specs give the same bytes. The
#diagrams section of a page and the gallery place them (section.py).
"""

from __future__ import annotations

import dataclasses

from .concepts import concepts_for, doc_concepts
from .diagram import Diagram
from .memory import memory_diagram
from .roles import roles_diagram
from .structure import applies as has_structure
from .structure import structure_diagram
from .timeline import timeline_diagram

__all__ = ["Diagram", "all_diagrams", "concept_diagrams", "doc_diagrams", "stage_diagrams"]


def stage_diagrams(stage, stages) -> list[Diagram]:
    """The per-stage diagrams: memory movement, warp roles, tensor-core pipeline timeline, and from
    stage 23 on (structure.py) the kernel's code by role, read out of its kernel.cu. A stage that
    serves several head dims says in each caption which one the picture draws (issue #29)."""
    out = [memory_diagram(stage, stages), roles_diagram(stage, stages), timeline_diagram(stage, stages)]
    if has_structure(stage):
        out.append(structure_diagram(stage, stages))
    return [_head_dim_stated(stage, d) for d in out]


def _head_dim_stated(stage, d: Diagram) -> Diagram:
    """``d`` with its caption naming the head dim it draws, where the stage serves more than one."""
    dims = getattr(stage, "head_dims", ())
    if len(dims) <= 1 or d.kind == "structure":  # the code by role is the same for every head dim
        return d
    served = stage.head_dims_text() if hasattr(stage, "head_dims_text") else ""
    note = f"Drawn for head dim {stage.head_dim}" + (f" (of {served})" if served else "") + "."
    return dataclasses.replace(d, caption=f"{d.caption.rstrip()} {note}")


def concept_diagrams(stage, stages) -> list[Diagram]:
    """Concept diagrams introduced by this stage (none when the table has no entry for it)."""
    return concepts_for(stage, stages)


def doc_diagrams(stages) -> list[Diagram]:
    """The figures of the hand-written pages (docs/introduction.md, docs/hopper.md)."""
    return doc_concepts(stages)


def all_diagrams(stages) -> list[Diagram]:
    """Every diagram of the site in site order: per stage, its own diagrams then its concepts."""
    out: list[Diagram] = []
    for stage in sorted(stages, key=lambda s: s.number):
        out.extend(stage_diagrams(stage, stages))
        out.extend(concept_diagrams(stage, stages))
    return out
