"""Diagrams generated from the stages' specs (stage.toml), as self-contained SVG strings.

Interface (see .notes/contracts.md, "Diagrams"):
  Diagram                         one picture: id, title, kind, stage, svg, caption
  stage_diagrams(stage, stages)   memory movement, warp roles, pipeline timeline of one stage
  concept_diagrams(stage, stages) the concept pictures the stage introduces (table in concepts/)
  all_diagrams(stages)            everything, in site order (for the gallery)

Every function is a pure function of the stages: the same specs give the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Diagram", "all_diagrams", "concept_diagrams", "stage_diagrams"]


@dataclass(frozen=True)
class Diagram:
    id: str  # unique across the site, e.g. "s05-timeline"; prefixes every id inside svg
    title: str
    kind: str  # "memory" | "roles" | "timeline" | "concept"
    stage: int | None  # the stage that introduces it
    svg: str  # complete <svg> (role="img", <title>, <desc>), colours via CSS variables
    caption: str  # markdown
    width: int = 0  # the viewBox size, for <img width/height> of the standalone file
    height: int = 0

    @property
    def standalone(self) -> str:
        """The same SVG as a file to link for zoom: XML declaration, explicit size, opaque background."""
        from .svg import standalone

        return standalone(self.svg, self.width, self.height)

    @property
    def filename(self) -> str:
        return f"{self.id}.svg"


def stage_diagrams(stage, stages) -> list[Diagram]:
    """The three per-stage diagrams: memory movement, warp roles, tensor-core pipeline timeline."""
    from .memory import memory_diagram
    from .roles import roles_diagram
    from .timeline import timeline_diagram

    return [memory_diagram(stage, stages), roles_diagram(stage, stages), timeline_diagram(stage, stages)]


def concept_diagrams(stage, stages) -> list[Diagram]:
    """Concept diagrams introduced by this stage (none when the table has no entry for it)."""
    from .concepts import concepts_for

    return concepts_for(stage, stages)


def all_diagrams(stages) -> list[Diagram]:
    """Every diagram of the site in site order: per stage, its three diagrams then its concepts."""
    out: list[Diagram] = []
    for stage in sorted(stages, key=lambda s: s.number):
        out.extend(stage_diagrams(stage, stages))
        out.extend(concept_diagrams(stage, stages))
    return out
