"""Diagrams generated from the stages' specs (stage.toml), as self-contained SVG strings.

  Diagram                         one picture: id, title, kind, stage, svg, caption (diagram.py)
  stage_diagrams(stage, stages)   memory movement, warp roles, pipeline timeline of one stage
  concept_diagrams(stage, stages) the concept pictures the stage introduces (table in concepts/)
  doc_diagrams(stages)            the figures of the hand-written pages (introduction, Hopper model)
  all_diagrams(stages)            every stage's, in site order

Every function is a pure function of the stages: the same specs give the same bytes. The
#diagrams section of a page and the gallery place them (section.py).
"""

from __future__ import annotations

from .concepts import concepts_for, doc_concepts
from .diagram import Diagram
from .memory import memory_diagram
from .roles import roles_diagram
from .timeline import timeline_diagram

__all__ = ["Diagram", "all_diagrams", "concept_diagrams", "doc_diagrams", "stage_diagrams"]


def stage_diagrams(stage, stages) -> list[Diagram]:
    """The three per-stage diagrams: memory movement, warp roles, tensor-core pipeline timeline."""
    return [memory_diagram(stage, stages), roles_diagram(stage, stages), timeline_diagram(stage, stages)]


def concept_diagrams(stage, stages) -> list[Diagram]:
    """Concept diagrams introduced by this stage (none when the table has no entry for it)."""
    return concepts_for(stage, stages)


def doc_diagrams(stages) -> list[Diagram]:
    """The figures of the hand-written pages (docs/introduction.md, docs/hopper.md)."""
    return doc_concepts(stages)


def all_diagrams(stages) -> list[Diagram]:
    """Every diagram of the site in site order: per stage, its three diagrams then its concepts."""
    out: list[Diagram] = []
    for stage in sorted(stages, key=lambda s: s.number):
        out.extend(stage_diagrams(stage, stages))
        out.extend(concept_diagrams(stage, stages))
    return out
