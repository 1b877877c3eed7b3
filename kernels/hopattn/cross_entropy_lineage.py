"""The cross-entropy lineage (Part II): stages NN_slug/ (``kernel.cu``, a complete checkpoint that may
include an earlier stage's kernels with CE_KERNELS_ONLY defined; ``stage.toml``; ``notes.md``) under
kernels/cross_entropy/ (drafted under research/cross_entropy/, landed after its GPU run of
2026-12-02T1938); their ABI is kernels/cross_entropy/common/abi_cross_entropy.h.

A cross-entropy stage.toml has the softmax lineage's tables, typed by hopattn.rowwise's declarations:
[launch], [row] (who holds a row, the levels its reduction passes through, where it waits between
its uses, how often each element is read on the main path with the gradient), [supports] and
[constants] (kernel.cu's own constexpr integers, checked against its text). Every key is typed; an
unknown key or a value of another type is a SpecError naming the file and the field. Stages are
``rowwise.RowStage`` objects (their lineage: the folder's name, "cross_entropy"), compiled by
hopattn.build into ``build/kernels/cross_entropy-stageNN-...``. Standard library only.

    discover()                        # kernels/cross_entropy
    discover(folder)                  # a copy of it elsewhere (the site's fixtures)
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from . import rowwise
from .lineage import _FOLDER_RE, ARCHES, COMMON_DIR_NAME, RMSNORM_DIR, TEXT, SpecError, _choice, _load, _table, key

CROSS_ENTROPY_DIR = RMSNORM_DIR.parent / "cross_entropy"  # kernels/cross_entropy


@dataclass(frozen=True)
class CrossEntropySpec:
    title: str = key(TEXT)
    change: str = key(TEXT, doc="one sentence")
    arch: str = key(_choice(ARCHES))
    kernel: str = key(TEXT, doc="the main __global__ function's name")
    launch: rowwise.Launch = key(_table(rowwise.Launch))
    row: rowwise.Row = key(_table(rowwise.Row))
    supports: rowwise.Supports = key(_table(rowwise.Supports))
    constants: dict = key(rowwise.CONSTANTS, doc="kernel.cu's constexpr integers the prose and figures use")


def load_spec(path: Path) -> CrossEntropySpec:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{path}: not valid TOML: {err}") from None
    spec = _load(CrossEntropySpec, data, path, "", "")
    if spec.launch.threads % 32:
        raise SpecError(f"{path}: field 'launch.threads' must be a multiple of 32 (got {spec.launch.threads!r})")
    if ("cluster" in spec.row.owners) != (spec.launch.cluster > 1):
        raise SpecError(f"{path}: field 'launch.cluster' must be > 1 exactly when row.owners has 'cluster' "
                        f"(got {spec.launch.cluster} and {list(spec.row.owners)})")
    if spec.supports.backward:
        raise SpecError(f"{path}: field 'supports.backward' must be false: a cross-entropy stage's gradient is "
                        f"its own launch with dloss (abi_cross_entropy.h), not a backward lineage")
    return spec


def load_stage(folder: Path) -> rowwise.RowStage:
    folder = Path(folder)
    m = _FOLDER_RE.match(folder.name)
    if not m:
        raise SpecError(f"{folder}: stage folders are named NN_slug (two digits, lower-case slug)")
    for name in ("kernel.cu", "stage.toml", "notes.md"):
        if not (folder / name).is_file():
            raise SpecError(f"{folder}: missing {name}")
    return rowwise.RowStage(number=int(m.group(1)), slug=m.group(2), dir=folder, spec=load_spec(folder / "stage.toml"))


def discover(root: Path | None = None) -> list[rowwise.RowStage]:
    """All stages under ``root`` (default: kernels/cross_entropy) in order, numbered 01, 02, ..."""
    root = Path(root) if root is not None else CROSS_ENTROPY_DIR
    if not root.is_dir():
        raise SpecError(f"{root}: no such folder (the cross-entropy stages are NN_slug/ folders there)")
    stages = [load_stage(p) for p in sorted(root.iterdir())
              if p.is_dir() and p.name != COMMON_DIR_NAME and _FOLDER_RE.match(p.name)]
    if not stages:
        raise SpecError(f"{root}: no stage folders (NN_slug/)")
    for expected, stage in enumerate(stages, start=1):
        if stage.number != expected:
            raise SpecError(f"{stage.dir}: stage numbers must run 01, 02, ... without gaps or repeats; "
                            f"expected {expected:02d} here")
    return stages


constant_mismatches = rowwise.constant_mismatches
