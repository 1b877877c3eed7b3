"""The softmax lineages (Part II): the forward's stages under kernels/softmax/NN_slug/ and the backward's
under kernels/softmax_backward/NN_slug/, each ``kernel.cu`` (a complete checkpoint), ``stage.toml`` and
``notes.md``; their ABI is kernels/softmax/common/abi_softmax.h.

A softmax stage.toml has the RMSNorm lineage's tables, typed by hopattn.rowwise's declarations:
[launch], [row] (who holds a row, the levels its reduction passes through — a max and a sum, or the
pair of them, or the backward's dot — where it waits between its uses, how often each element is
read), [supports] and [constants] (kernel.cu's constexpr integers, checked against the source). It
has no [[config]] yet (the site's figures draw the RMSNorm forward's). Every key is typed; an unknown
key or a value of another type is a SpecError naming the file and the field. Stages are
``rowwise.RowStage`` objects, compiled by hopattn.build into ``build/kernels/softmax-stageNN-...``
and ``softmax_backward-stageNN-...``. Standard library only.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from . import rowwise
from .lineage import _FOLDER_RE, ARCHES, COMMON_DIR_NAME, RMSNORM_DIR, TEXT, SpecError, _choice, _load, _table, key

SOFTMAX_DIR = RMSNORM_DIR.parent / "softmax"
SOFTMAX_BACKWARD_DIR = RMSNORM_DIR.parent / "softmax_backward"


@dataclass(frozen=True)
class SoftmaxSpec:
    title: str = key(TEXT)
    change: str = key(TEXT, doc="one sentence")
    arch: str = key(_choice(ARCHES))
    kernel: str = key(TEXT, doc="the main __global__ function's name")
    launch: rowwise.Launch = key(_table(rowwise.Launch))
    row: rowwise.Row = key(_table(rowwise.Row))
    supports: rowwise.Supports = key(_table(rowwise.Supports))
    constants: dict = key(rowwise.CONSTANTS, doc="kernel.cu's constexpr integers the prose and figures use")


def load_spec(path: Path, backward: bool = False) -> SoftmaxSpec:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{path}: not valid TOML: {err}") from None
    spec = _load(SoftmaxSpec, data, path, "", "")
    if spec.launch.threads % 32:
        raise SpecError(f"{path}: field 'launch.threads' must be a multiple of 32 (got {spec.launch.threads!r})")
    if ("cluster" in spec.row.owners) != (spec.launch.cluster > 1):
        raise SpecError(f"{path}: field 'launch.cluster' must be > 1 exactly when row.owners has 'cluster' "
                        f"(got {spec.launch.cluster} and {list(spec.row.owners)})")
    if spec.supports.backward != backward:
        raise SpecError(f"{path}: field 'supports.backward' must be {str(backward).lower()} in a "
                        f"{'backward' if backward else 'forward'} stage")
    return spec


def load_stage(folder: Path) -> rowwise.RowStage:
    folder = Path(folder)
    m = _FOLDER_RE.match(folder.name)
    if not m:
        raise SpecError(f"{folder}: stage folders are named NN_slug (two digits, lower-case slug)")
    for name in ("kernel.cu", "stage.toml", "notes.md"):
        if not (folder / name).is_file():
            raise SpecError(f"{folder}: missing {name}")
    backward = folder.parent.name.endswith("_backward")
    return rowwise.RowStage(number=int(m.group(1)), slug=m.group(2), dir=folder,
                            spec=load_spec(folder / "stage.toml", backward))


def discover(root: Path = SOFTMAX_DIR) -> list[rowwise.RowStage]:
    """All stages under ``root`` (SOFTMAX_DIR or SOFTMAX_BACKWARD_DIR) in order, numbered 01, 02, ..."""
    root = Path(root)
    stages = [load_stage(p) for p in sorted(root.iterdir()) if p.is_dir() and p.name != COMMON_DIR_NAME]
    for expected, stage in enumerate(stages, start=1):
        if stage.number != expected:
            raise SpecError(f"{stage.dir}: stage numbers must run 01, 02, ... without gaps or repeats; "
                            f"expected {expected:02d} here")
    return stages


def discover_backward() -> list[rowwise.RowStage]:
    return discover(SOFTMAX_BACKWARD_DIR)


constant_mismatches = rowwise.constant_mismatches
