"""The stages that wait in research/ for their first GPU measurement (stage 23 in research/stage23/,
stage 24 in research/stage24/, each with the common/ headers it introduces), as Stage objects the
tests can compile and check: the lineage's own once a stage has moved into kernels/attention/,
otherwise assembled in a temporary copy of kernels/attention/ beside the lineage's common/ headers
and theirs, the way they will sit once moved. So the same tests hold before and after the move."""

from __future__ import annotations

import shutil
from pathlib import Path

from hopattn import lineage

RESEARCH = Path(__file__).resolve().parent.parent / "research"
WAITING = {23: RESEARCH / "stage23", 24: RESEARCH / "stage24"}  # number -> the folder it waits in


def _waiting_folder(number: int) -> Path | None:
    """research/stageNN/NN_slug, while the stage waits there."""
    root = WAITING.get(number)
    if root is None or not root.is_dir():
        return None
    found = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(f"{number:02d}_"))
    return found[0] if found else None


def in_lineage(number: int) -> bool:
    return any(s.number == number for s in lineage.discover())


def stage(number: int, tmp_path: Path) -> lineage.Stage:
    """Stage ``number``: the lineage's, or (while it waits) assembled under tmp_path with every
    waiting stage's headers beside the lineage's common/ (a later stage's headers may build on an
    earlier one's)."""
    if in_lineage(number):
        return lineage.get_stage(number)
    folder = _waiting_folder(number)
    if folder is None:
        raise LookupError(f"stage {number:02d} is neither in kernels/attention/ nor waiting in "
                          f"{WAITING.get(number, RESEARCH)}")
    tree = tmp_path / "attention"
    if not (tree / "common").is_dir():
        shutil.copytree(lineage.ATTENTION_DIR / "common", tree / "common")
        for root in WAITING.values():
            if (root / "common").is_dir():
                shutil.copytree(root / "common", tree / "common", dirs_exist_ok=True)
    target = tree / folder.name
    if not target.is_dir():
        shutil.copytree(folder, target)
    return lineage.load_stage(target)
