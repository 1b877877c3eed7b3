"""The gallery page: every diagram of the lineage, grouped by the stage that introduces it."""

from __future__ import annotations

from ..diagrams.section import figures
from .stage import GENERATED, stage_title


def gallery_page(stages, diagrams, site) -> str:
    parts = ["# Diagram gallery\n", GENERATED,
             ("Every diagram of the lineage, grouped by the stage that introduces it; the heading links "
              "to that stage's page.\n")]
    by_stage = {s.number: s for s in stages}
    groups: dict = {}
    for d in diagrams:
        groups.setdefault(d.stage, []).append(d)
    # Stage groups in lineage order, then diagrams that belong to no one stage.
    for number in sorted(groups, key=lambda k: (k is None, k or 0)):
        stage = by_stage.get(number)
        if stage is not None:
            parts.append(f"## [{stage_title(stage)}](stages/{stage.name}.md#diagrams) {{#s{stage.id}}}\n")
        else:
            parts.append("## General concepts {#concepts}\n")
        name = f"gallery-{stage.name}" if stage is not None else "gallery-concepts"
        parts.append(site.add_fragment(name, figures(groups[number], site, depth=1)))
    if not diagrams:
        parts.append("No diagrams yet.\n")
    return "\n".join(parts)
