"""The RMSNorm backward's lineage (Part II): kernels/rmsnorm_backward/NN_slug/, each ``kernel.cu`` (a
complete checkpoint), ``stage.toml`` and ``notes.md``, beside the forward's kernels/rmsnorm/ as
kernels/attention_backward/ is beside kernels/attention/ (why a lineage of its own: its notes.md of
stage 01).

A backward stage.toml has the forward's tables — [launch], [row], [supports], [constants], typed by
hopattn.rowwise's declarations, with [row] read for x and dy alike (``reads``: times each element of
x and of dy leaves memory; ``held``: where x and dy wait between the row's dot and dx) — and one of
its own, [weight_grad]: how the weight's gradient dw[c] = Σ_r dy[r, c] · x̂[r, c], a sum down the
columns across rows, is summed. Under [[config]], the launch configurations of the row's kernel (the
forward's keys; ``passes``: how often a streamed one reads x and dy; ``exchange``: how a cluster's CTAs
trade their dots), checked at load against [row], [launch] and [weight_grad] and, by
``config_mismatches``, against kernel.cu; the site's figures deal a row out to them. Every key is typed; an unknown key or a value of another type is a
SpecError naming the file and the field. Stages are ``rowwise.RowStage`` objects (what
hopattn.build compiles, into ``build/kernels/rmsnorm_backward-stageNN-slug-<key>.so``). Standard
library only.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from . import rowwise
from .lineage import (
    _FOLDER_RE,
    ARCHES,
    BOOL,
    COMMON_DIR_NAME,
    POSITIVE,
    RMSNORM_DIR,
    TEXT,
    SpecError,
    _choice,
    _list_of,
    _load,
    _table,
    _tables,
    key,
)

RMSNORM_BACKWARD_DIR = RMSNORM_DIR.parent / "rmsnorm_backward"

# Who sums a column's rows first: a thread walking every row of its column; a tile of rows (a CTA
# per tile of rows x columns); a CTA's row slots (a persistent grid: a thread keeps its columns from
# row to row); a cluster's CTAs, each its slice of the columns.
DW_OWNERS = ("thread", "tile", "cta", "cluster")
# How those sums meet: nothing left to meet (a thread had the whole column); fp32 partial rows that a
# second kernel adds in a fixed order (the same bits every run); atomics (which no stage uses: the
# order of fp32 additions, and so the bits of dw, would change from run to run).
DW_COMBINES = ("none", "fixed-order-partials", "atomics")


@dataclass(frozen=True)
class WeightGrad:
    """How a backward stage sums dw down the columns (beside [row], the sum along each row)."""

    owners: tuple[str, ...] = key(_list_of(f"a list drawn from {DW_OWNERS}", lambda x: x in DW_OWNERS),
                                  doc="who sums a column's rows first, from the shortest rows to the longest")
    combine: str = key(_choice(DW_COMBINES), doc="how those sums meet")
    kernels: int = key(POSITIVE, doc="kernel launches on the main path, dw's sum included")
    persistent: bool = key(BOOL, doc="the main grid is what fits on the GPU at once, each CTA (or cluster) "
                                     "looping over rows")


@dataclass(frozen=True)
class BackwardSpec:
    title: str = key(TEXT)
    change: str = key(TEXT, doc="one sentence")
    arch: str = key(_choice(ARCHES))
    kernel: str = key(TEXT, doc="the main __global__ function's name")
    launch: rowwise.Launch = key(_table(rowwise.Launch))
    row: rowwise.Row = key(_table(rowwise.Row), doc="the sum along each row, for x and dy alike")
    supports: rowwise.Supports = key(_table(rowwise.Supports))
    constants: dict = key(rowwise.CONSTANTS, doc="kernel.cu's constexpr integers the prose and figures use")
    weight_grad: WeightGrad = key(_table(WeightGrad), doc="the sum down the columns")
    config: tuple[rowwise.WalkConfig, ...] = key(_tables(rowwise.WalkConfig),
                                                 doc="the launch configurations of the row's kernel (its dot), in "
                                                     "the launcher's order (rows aligned to 16 bytes); the last "
                                                     "takes any row")

    def config_for(self, cols: int, element_bytes: int = 2) -> rowwise.WalkConfig:
        """The configuration that runs a row of ``cols`` elements (bf16 unless told)."""
        return next(c for c in self.config if c.holds(cols, element_bytes))


def load_spec(path: Path) -> BackwardSpec:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{path}: not valid TOML: {err}") from None
    spec = _load(BackwardSpec, data, path, "", "")
    if spec.launch.threads % 32:
        raise SpecError(f"{path}: field 'launch.threads' must be a multiple of 32 (got {spec.launch.threads!r})")
    if ("cluster" in spec.row.owners) != (spec.launch.cluster > 1):
        raise SpecError(f"{path}: field 'launch.cluster' must be > 1 exactly when row.owners has 'cluster' "
                        f"(got {spec.launch.cluster} and {list(spec.row.owners)})")
    if (spec.weight_grad.combine == "none") != (spec.weight_grad.owners == ("thread",)):
        raise SpecError(f"{path}: field 'weight_grad.combine' must be 'none' exactly when a thread sums a whole "
                        f"column (owners = ['thread']) (got {spec.weight_grad.combine!r} and "
                        f"{list(spec.weight_grad.owners)})")
    if not spec.supports.backward:
        raise SpecError(f"{path}: field 'supports.backward' must be true in a backward stage")
    _check_configs(spec, path)
    return spec


def _check_configs(spec: BackwardSpec, path: Path) -> None:
    """[[config]] against the rest of the spec, as the forward's (rowwise._check_configs; x and dy held in
    registers, or staged in shared memory a row ahead; [launch] may give the tile kernel's CTA, which
    writes dx where the row's dot is a kernel of its own), and against [weight_grad]: the grid is
    persistent exactly where a configuration holds the row."""
    tile = spec.constants.get("kTileThreads")
    rowwise._check_configs(spec, path, held_in=("registers", "smem"), threads=(tile,) if tile else ())
    held = any(c.vectors for c in spec.config)
    if spec.weight_grad.persistent != held:
        raise SpecError(f"{path}: field 'weight_grad.persistent' must be {str(held).lower()}: the grid is persistent "
                        f"exactly where a [[config]] holds the row (vectors > 0) (got {spec.weight_grad.persistent!r})")


def load_stage(folder: Path) -> rowwise.RowStage:
    folder = Path(folder)
    m = _FOLDER_RE.match(folder.name)
    if not m:
        raise SpecError(f"{folder}: stage folders are named NN_slug (two digits, lower-case slug)")
    for name in ("kernel.cu", "stage.toml", "notes.md"):
        if not (folder / name).is_file():
            raise SpecError(f"{folder}: missing {name}")
    return rowwise.RowStage(number=int(m.group(1)), slug=m.group(2), dir=folder, spec=load_spec(folder / "stage.toml"))


def discover(root: Path = RMSNORM_BACKWARD_DIR) -> list[rowwise.RowStage]:
    """All backward stages under ``root`` in order; numbering must run 01, 02, ... without gaps."""
    root = Path(root)
    stages = [load_stage(p) for p in sorted(root.iterdir()) if p.is_dir() and p.name != COMMON_DIR_NAME]
    for expected, stage in enumerate(stages, start=1):
        if stage.number != expected:
            raise SpecError(f"{stage.dir}: stage numbers must run 01, 02, ... without gaps or repeats; "
                            f"expected {expected:02d} here")
    return stages


constant_mismatches = rowwise.constant_mismatches  # [constants] against kernel.cu, as for the forward
config_mismatches = rowwise.config_mismatches  # [[config]] against kernel.cu's with_config, constants, kernels
