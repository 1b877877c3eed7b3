"""The softmax lineages (Part II): the forward's stages under kernels/softmax/NN_slug/ and the backward's
under kernels/softmax_backward/NN_slug/, each ``kernel.cu`` (a complete checkpoint), ``stage.toml`` and
``notes.md``; their ABI is kernels/softmax/common/abi_softmax.h.

A softmax stage.toml has the RMSNorm lineage's tables, typed by hopattn.rowwise's declarations:
[launch], [row] (who holds a row, the levels its reduction passes through — a max and a sum, or the
pair of them, or the backward's dot — where it waits between its uses, how often each element is
read), [supports] and [constants] (kernel.cu's constexpr integers, checked against the source), and
[[config]]: the launch configurations in the launcher's order (the forward's keys; ``passes``: how often
a streamed one reads the row; ``reduce``: the (max, sum) pair or the max then the sum), checked at load
against the rest of the spec and, by ``config_mismatches``, against kernel.cu; the site's figures deal
a row out to them. Every key is typed; an unknown
key or a value of another type is a SpecError naming the file and the field. Stages are
``rowwise.RowStage`` objects, compiled by hopattn.build into ``build/kernels/softmax-stageNN-...``
and ``softmax_backward-stageNN-...``. Standard library only.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from . import rowwise
from .lineage import (
    _FOLDER_RE,
    ARCHES,
    COMMON_DIR_NAME,
    RMSNORM_DIR,
    TEXT,
    SpecError,
    _choice,
    _load,
    _table,
    _tables,
    key,
    optional,
)

SOFTMAX_DIR = RMSNORM_DIR.parent / "softmax"
SOFTMAX_BACKWARD_DIR = RMSNORM_DIR.parent / "softmax_backward"


# How a forward stage reduces a row: the (max, sum) pair merged once (the online softmax), or the max
# and then, on a walk of its own, the sum of exp(x − max). A backward stage reduces a dot.
REDUCES = ("(max, sum)", "max, then sum")


@dataclass(frozen=True)
class SoftmaxConfig(rowwise.WalkConfig):
    reduce: str | None = optional(_choice(REDUCES), None, doc="what a forward stage's row reduces; left out: "
                                                              "the (max, sum) pair (a backward stage: its dot)")

    @property
    def payload(self) -> str:
        return self.reduce or "(max, sum)"


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
    config: tuple[SoftmaxConfig, ...] = key(_tables(SoftmaxConfig), doc="the launch configurations, in the "
                                            "launcher's order (rows aligned to 16 bytes); the last takes any row")

    def config_for(self, cols: int, element_bytes: int = 2) -> SoftmaxConfig:
        """The configuration that runs a row of ``cols`` elements (bf16 unless told)."""
        return next(c for c in self.config if c.holds(cols, element_bytes))


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
    _check_configs(spec, path, backward)
    return spec


def _check_configs(spec: SoftmaxSpec, path: Path, backward: bool) -> None:
    """[[config]] against the rest of the spec, as the RMSNorm forward's (rowwise._check_configs), and its
    ``reduce``: a backward stage's rows reduce a dot (left out), and a forward stage reduces the row the
    same way in every configuration but the fallback of another stage."""
    rowwise._check_configs(spec, path)
    for i, c in enumerate(spec.config):
        if backward and c.reduce is not None:
            raise SpecError(f"{path}: field 'config[{i}].reduce' must be left out in a backward stage (its rows "
                            f"reduce a dot) (got {c.reduce!r})")
        if c.reduce == "max, then sum" and c.reads < 3:
            raise SpecError(f"{path}: field 'config[{i}].reduce' must be '(max, sum)' where the row is read fewer than "
                            f"3 times (the max, then the sum, then the output take three walks) (got {c.reduce!r})")


def config_mismatches(stage: rowwise.RowStage) -> list[str]:
    """rowwise.config_mismatches, and each forward configuration's ``reduce`` against kernel.cu: the pair is
    a MaxSum merged once, the max then the sum two row_reduce calls (Max{}, then Sum{})."""
    out = rowwise.config_mismatches(stage)
    source = stage.kernel_path.read_text()
    for i, c in enumerate(stage.spec.config):
        if stage.spec.supports.backward:
            continue
        found = "struct MaxSum" in source if c.payload == "(max, sum)" else bool(re.search(r"\bMax\{\}", source))
        if not found:
            out.append(f"{stage.spec_path}: config[{i}].reduce = {c.payload!r}, but kernel.cu has no "
                       + ("MaxSum pair" if c.payload == "(max, sum)" else "Max{} reduction"))
    return out


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
