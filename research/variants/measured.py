"""The stage sources the experiments were measured against.

The generators patch stage 18's and 19's kernel.cu as it was when their variants were timed (the
tables of those stages' notes), not as it is now: the ring-deadlock fix of stages 18 and 19
(after 2985d32) changed the lines they patch, and a variant of today's kernel would be another
experiment. Needs the git history (a clone, not an export).
"""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REVISION = "2985d32"


def stage_source(folder: str) -> str:
    """kernels/attention/<folder>/kernel.cu at REVISION."""
    return subprocess.run(["git", "show", f"{REVISION}:kernels/attention/{folder}/kernel.cu"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout


class Patch:
    """A stage's kernel.cu as measured, edited by exact replacements that must each match."""

    def __init__(self, folder: str):
        self.text = stage_source(folder)

    def sub(self, old: str, new: str, count: int = 1) -> None:
        assert self.text.count(old) == count, (old, self.text.count(old))
        self.text = self.text.replace(old, new)

    def write(self, name: str) -> None:
        (ROOT / "research" / "variants" / name).write_text(self.text)
