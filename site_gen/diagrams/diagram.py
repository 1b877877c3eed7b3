"""One picture of the site: its SVG, caption and where it belongs."""

from __future__ import annotations

from dataclasses import dataclass

from .svg import standalone


@dataclass(frozen=True)
class Diagram:
    id: str  # unique across the site, e.g. "s05-timeline"; prefixes every id inside svg
    title: str
    kind: str  # "memory" | "roles" | "timeline" | "structure" (stage 23 on) | "concept"
    stage: int | None  # the stage that introduces it
    svg: str  # complete <svg> (role="img", <title>, <desc>), colours via CSS variables
    caption: str  # markdown
    width: int = 0  # the viewBox size, for <img width/height> of the standalone file
    height: int = 0
    signature: str = ""  # what the picture shows, without the stage's name ("": compare the SVG itself)

    @property
    def standalone(self) -> str:
        """The same SVG as a file to link for zoom: XML declaration, explicit size, opaque background."""
        return standalone(self.svg, self.width, self.height)

    def same_picture(self, other: "Diagram | None") -> bool:
        """True when ``other`` (the same kind of picture for another stage) shows the same thing."""
        if other is None or other.kind != self.kind:
            return False
        if self.signature or other.signature:
            return self.signature == other.signature
        return _bare(self) == _bare(other)

    @property
    def filename(self) -> str:
        return f"{self.id}.svg"


def _bare(d: Diagram) -> str:
    """The SVG without what names its stage: ids, title, description and heading line."""
    import re

    svg = d.svg.replace(f"{d.id}-", "").replace(f'id="{d.id}"', "")
    svg = re.sub(r"<title[^>]*>.*?</title>|<desc[^>]*>.*?</desc>", "", svg, flags=re.S)
    return re.sub(r"<text[^>]*>[^<]*</text>", "", svg, count=1)  # the heading names the stage
