"""The cross-entropy lineage (Part II): stages NN_slug/ (``kernel.cu``, a complete checkpoint that may
include an earlier stage's kernels with CE_KERNELS_ONLY defined; ``stage.toml``; ``notes.md``) under
kernels/cross_entropy/ (drafted under research/cross_entropy/, landed after its GPU run of
2026-12-02T1938); their ABI is kernels/cross_entropy/common/abi_cross_entropy.h.

A cross-entropy stage.toml has the softmax lineage's tables, typed by hopattn.rowwise's declarations:
[launch], [row] (who holds a row, the levels its reduction passes through, where it waits between
its uses, how often each element is read on the main path with the gradient), [supports],
[constants] (kernel.cu's own constexpr integers, checked against its text) and [[config]]: the
launch configurations in the launcher's order (the softmax's keys; ``reduce``: the row's statistics
merged once, or the max and then the sums), checked at load against the rest of the spec and, by
``config_mismatches``, against kernel.cu and the stage 02 kernels it includes; the site's figures
deal a row out to them. Every key is typed; an
unknown key or a value of another type is a SpecError naming the file and the field. Stages are
``rowwise.RowStage`` objects (their lineage: the folder's name, "cross_entropy"), compiled by
hopattn.build into ``build/kernels/cross_entropy-stageNN-...``. Standard library only.

    discover()                        # kernels/cross_entropy
    discover(folder)                  # a copy of it elsewhere (the site's fixtures)
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from . import cpp, rowwise
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

CROSS_ENTROPY_DIR = RMSNORM_DIR.parent / "cross_entropy"  # kernels/cross_entropy

# How a stage reduces a row's statistics (RowStats: the max m, s = Σ exp(x − m), Σ x and the target's
# logit): merged once, the online (max, sum) beside the plain sums (stages 02-04), or the max alone and
# then, on a walk of their own, the sums (stage 01). The words are the softmax lineage's.
REDUCES = ("(max, sum)", "max, then sum")


@dataclass(frozen=True)
class CrossEntropyConfig(rowwise.WalkConfig):
    reduce: str | None = optional(_choice(REDUCES), None, doc="what the row reduces; left out: the statistics "
                                                              "merged once, the online (max, sum) among them")

    @property
    def payload(self) -> str:
        return self.reduce or "(max, sum)"


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
    config: tuple[CrossEntropyConfig, ...] = key(_tables(CrossEntropyConfig), doc="the launch configurations, in "
                                                 "the launcher's order (rows aligned to 16 bytes); the last takes any row")

    def config_for(self, cols: int, element_bytes: int = 2) -> CrossEntropyConfig:
        """The configuration that runs a row of ``cols`` elements (bf16 unless told)."""
        return next(c for c in self.config if c.holds(cols, element_bytes))


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
    rowwise._check_configs(spec, path)
    for i, c in enumerate(spec.config):
        if c.reduce == "max, then sum" and c.reads < 3:
            raise SpecError(f"{path}: field 'config[{i}].reduce' must be '(max, sum)' where the row is read fewer than "
                            f"3 times (the max, then the sums, then the gradient take three walks) (got {c.reduce!r})")
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


def config_mismatches(stage: rowwise.RowStage) -> list[str]:
    """[[config]] entries that the stage's sources do not launch so. As rowwise.config_mismatches, but a
    streamed configuration may be stage 02's kernels, which stages 03 and 04 include (CE_KERNELS_ONLY):
    its kernel, CTA size and max_cols are looked for in kernel.cu and every file it includes. The held
    configurations against with_config's ``Config<threads per row, vectors[, cluster]>`` in order, their
    rows per CTA against its ``kMinCtaThreads / threads per row``; ``reduce`` against the source."""
    source = stage.kernel_path.read_text()
    every = "\n".join(p.read_text() for p in stage.source_files())  # kernel.cu first, then what it includes
    found = rowwise.launcher_configs(source) or []
    held = [c for c in stage.spec.config if c.vectors]
    wanted = [(c.threads_per_row, c.vectors) + ((c.cluster,) if c.cluster > 1 else ()) for c in held]
    shown = [(a[:2] if len(a) > 2 and a[2] == 1 else a) for a in found]
    out = []
    if wanted != shown:
        out.append(f"{stage.spec_path}: the held [[config]] (threads_per_row, vectors[, cluster]) are {wanted}, "
                   f"kernel.cu's with_config launches {shown}")
    constants = cpp.constants(every)
    least = constants.get("kMinCtaThreads")
    for i, c in enumerate(stage.spec.config):
        if c.vectors:
            rows = 1 if least is None or c.threads_per_row >= least else least // c.threads_per_row
            if c.rows_per_cta != rows:
                out.append(f"{stage.spec_path}: config[{i}].rows_per_cta = {c.rows_per_cta}, kernel.cu's Config has "
                           f"{rows} (kMinCtaThreads / threads_per_row)")
            continue
        if c.max_cols is not None and c.max_cols not in constants.values():
            out.append(f"{stage.spec_path}: config[{i}].max_cols = {c.max_cols} is none of the stage's constants")
        if c.cta_threads not in constants.values():
            out.append(f"{stage.spec_path}: config[{i}] has CTAs of {c.cta_threads} threads, none of the stage's "
                       "constants")
    code = rowwise._COMMENT_RE.sub("", every)
    uses = bool(re.search(r"\bst_async|st\.async", code))
    for i, c in enumerate(stage.spec.config):
        if c.cluster > 1 and (c.exchange == "st.async") != uses:
            out.append(f"{stage.spec_path}: config[{i}].exchange = {c.exchange or 'st.shared::cluster'!r}, but "
                       f"kernel.cu {'exchanges through st.async' if uses else 'has no st.async'}")
        m = re.search(rf"__global__ void [^;{{}}]*?\b{c.kernel}\(", code)
        if not m:
            out.append(f"{stage.spec_path}: config[{i}].kernel = {c.kernel!r} is no __global__ of kernel.cu or "
                       "what it includes")
            continue
        # the max alone, reduced before the sums: a cta_max of its own (stage 01); else the statistics merged once
        body = code[m.end():]
        body = body[:body.find("\n}\n") + 1] if "\n}\n" in body else body
        alone = bool(re.search(r"\bcta_max\(", body))
        if (c.payload == "max, then sum") != alone:
            out.append(f"{stage.spec_path}: config[{i}].reduce = {c.payload!r}, but {c.kernel} "
                       + ("reduces the max alone first (cta_max)" if alone else "has no max reduced alone (cta_max)"))
    return out
