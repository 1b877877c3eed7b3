"""One picture of the site: its SVG, caption and where it belongs."""

from __future__ import annotations

from dataclasses import dataclass

from .svg import standalone


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
        return standalone(self.svg, self.width, self.height)

    @property
    def filename(self) -> str:
        return f"{self.id}.svg"
