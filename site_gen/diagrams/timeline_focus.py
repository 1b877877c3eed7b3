"""Where each stage's measured timeline looks. By default a stage page's timeline opens on the
non-causal trace, magnifies the steady state of the K/V loop and sets the events whose median
duration moved most against the previous stage. A stage whose change is elsewhere is named here,
with the reason the page shows: its timeline opens on the causal trace, or magnifies the tile
boundary and sets the boundary's stretches against the previous stage's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Focus:
    causal_first: bool = False  # open on the causal trace (its tab first)
    view: str = "loop"  # "loop": the K/V loop's steady state; "boundary": the first tile boundary
    why: str = ""  # one line for the page: why the timeline looks there


LOOP = Focus()

FOCUS = {
    "14": Focus(view="boundary", why="the CTAs stay resident, so the change is where one output tile ends and the "
                                     "next begins: the tile boundary, magnified"),
    "15": Focus(view="boundary", why="O leaves through shared memory and a TMA store at the end of each output "
                                     "tile: the tile boundary, magnified"),
    "17": Focus(causal_first=True, why="the causal mask is the change: the causal trace first"),
    "18": Focus(causal_first=True, view="boundary",
                why="causal tiles are handed out longest first at run time: the causal trace, magnified where the "
                    "next tile's id arrives"),
    "22": Focus(causal_first=True, view="boundary",
                why="a tile's coordinates are found at its start, four divisions of them in the causal order: the "
                    "causal trace's tile boundary, magnified"),
}


def focus(stage) -> Focus:
    return FOCUS.get(stage.id, LOOP)
