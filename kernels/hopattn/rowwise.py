"""Part II's rowwise lineages (RMSNorm now; softmax and cross-entropy to come): the stages under
kernels/<op>/NN_slug/, each ``kernel.cu`` (a complete checkpoint), ``stage.toml`` (its spec) and
``notes.md`` (its prose), discovered and typed here, as hopattn.lineage does for attention.

A rowwise stage.toml says what the figures of a memory-bound kernel draw — who holds a row
(thread, warp, CTA, cluster), the levels of the reduction tree, where the row waits between its two
uses, how often each element is read; under [[config]], every launch configuration in the
launcher's order (threads per row, rows per CTA, vectors held, cluster), from which the figures
deal out a row of any length (``RowSpec.config_for``); and, under [constants], the values of
kernel.cu's ``constexpr`` integers that the prose relies on (tests compare both with the source:
``constant_mismatches``, ``config_mismatches``). Every key is
declared with its type (the declarations and the loader are lineage's): an unknown key or a value
of another type is a SpecError naming the file and the field.

``RowStage`` has what hopattn.build needs of a stage (number, slug, arch, lineage, kernel_path,
the source hashes), so build.compile_stage and build.build_stages compile it unchanged, into
``build/kernels/rmsnorm-stageNN-slug-<key>.so``. Standard library only.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from . import cpp
from .lineage import (
    _FOLDER_RE,
    ARCHES,
    BOOL,
    COMMON_DIR_NAME,
    POSITIVE,
    RMSNORM_DIR,
    TEXT,
    Kind,
    SpecError,
    _choice,
    _is_int,
    _list_of,
    _load,
    _table,
    _tables,
    key,
    optional,
    source_bytes_hash,
    source_files,
    source_hash,
)

OWNERS = ("thread", "warp", "cta", "cluster")     # who holds a row, at some row length
LEVELS = ("thread", "warp", "cta", "cluster")     # the levels of a row's reduction: registers, shuffles,
                                                  # shared memory, distributed shared memory
HELD = ("none", "registers", "smem")              # where the row waits between its two uses
DTYPES = ("bf16", "fp16", "fp32")
LINEAGES = (RMSNORM_DIR,)

CONSTANTS = Kind("a table of integer constants (name = value)",
                 lambda v: isinstance(v, dict) and bool(v) and all(_is_int(x) for x in v.values()), dict)


@dataclass(frozen=True)
class Launch:
    threads: int = key(POSITIVE, doc="threads per CTA, a multiple of 32 (the largest, where it depends on the row)")
    cluster: int = optional(POSITIVE, 1, doc="CTAs of a cluster that share a row, at most")


@dataclass(frozen=True)
class Row:
    owners: tuple[str, ...] = key(_list_of(f"a list drawn from {OWNERS}", lambda x: x in OWNERS),
                                  doc="who holds a row, from the shortest rows to the longest")
    reduction: tuple[str, ...] = key(_list_of(f"a list drawn from {LEVELS}", lambda x: x in LEVELS),
                                     doc="the levels the sum of squares passes through, in order")
    held: str = key(_choice(HELD), doc="where the row waits between the sum and the output: none (read again)")
    reads: int = key(POSITIVE, doc="times each element of x leaves memory, on the stage's main path")
    vector_bytes: int = key(POSITIVE, doc="bytes per global access on the main path")
    vectors_per_thread: int = optional(Kind("an integer >= 0", lambda v: _is_int(v) and v >= 0), 0,
                                       doc="16-byte vectors of the row a thread holds (0: none)")


_COUNT = Kind("an integer >= 0", lambda v: _is_int(v) and v >= 0)
# How a cluster's CTAs exchange a row's partial results: st.shared::cluster stores and a cluster barrier,
# or st.async stores that count their bytes off each peer's mbarrier (no cluster barrier).
EXCHANGES = ("st.shared::cluster", "st.async")
VECTOR_BYTES = 16  # the held configurations' loads and stores: a uint4 of the row


@dataclass(frozen=True)
class Config:
    """One launch configuration (a family of template instances, one per dtype): the launcher takes
    the first of the stage's [[config]], in their order, that holds a row aligned to 16 bytes."""

    kernel: str = key(TEXT, doc="the __global__ function it launches")
    threads_per_row: int = key(POSITIVE, doc="threads that share a row: 1 (a thread's own), 32 (a warp), "
                                              "a multiple of 32 (a CTA's warps)")
    rows_per_cta: int = optional(POSITIVE, 1, doc="rows one CTA holds")
    vectors: int = optional(_COUNT, 0, doc="16-byte vectors of the row each thread holds in registers; "
                                           "0: the row is streamed, and read again for the output")
    cluster: int = optional(POSITIVE, 1, doc="CTAs of a thread-block cluster that share a row")
    unroll: int = optional(POSITIVE, 1, doc="loads a thread has in flight per loop step, when streamed")
    max_cols: int | None = optional(POSITIVE, None, doc="a streamed configuration's longest row, in columns; "
                                                        "left out: any (a held one holds what its vectors hold)")

    @property
    def cta_threads(self) -> int:
        return self.threads_per_row * self.rows_per_cta

    @property
    def warps_per_row(self) -> int:
        """Warps whose sums meet in shared memory (0: less than a warp, a thread's own row)."""
        return self.threads_per_row // 32

    @property
    def owner(self) -> str:
        """Who holds a row: thread, warp, cta or cluster."""
        if self.cluster > 1:
            return "cluster"
        return "thread" if self.threads_per_row == 1 else "warp" if self.threads_per_row == 32 else "cta"

    @property
    def levels(self) -> tuple[str, ...]:
        """The levels a row's sum of squares passes through (LEVELS' names)."""
        out = ["thread"]
        if self.threads_per_row >= 32:
            out.append("warp")
        if self.warps_per_row > 1:
            out.append("cta")
        if self.cluster > 1:
            out.append("cluster")
        return tuple(out)

    @property
    def reads(self) -> int:
        """Times each element of x leaves memory: once where the row is held, twice where it is streamed."""
        return 1 if self.vectors else 2

    def holds(self, cols: int, element_bytes: int) -> bool:
        """Whether this configuration takes a row of ``cols`` elements of that size."""
        if self.vectors:
            return cols * element_bytes <= self.threads_per_row * self.vectors * VECTOR_BYTES * self.cluster
        return self.max_cols is None or cols <= self.max_cols


@dataclass(frozen=True)
class WalkConfig(Config):
    """A [[config]] of Part II's other lineages (hopattn.rowwise_backward, hopattn.softmax_lineage): the
    forward's keys, how often a streamed configuration walks the row, and how a cluster's CTAs exchange
    their partial results."""

    passes: int | None = optional(POSITIVE, None, doc="times a streamed configuration reads each element (its "
                                                      "walks over the row); left out: 2")
    exchange: str | None = optional(_choice(EXCHANGES), None, doc="how a cluster's CTAs exchange their partial "
                                                                 "results; left out: st.shared::cluster")

    @property
    def reads(self) -> int:
        return 1 if self.vectors else (self.passes or 2)


@dataclass(frozen=True)
class Supports:
    dtypes: tuple[str, ...] = key(_list_of(f"a list drawn from {DTYPES}", lambda x: x in DTYPES))
    tails: bool = key(BOOL, doc="any row length, not only multiples of the vector")
    strided: bool = key(BOOL, doc="rows a stride apart (the last axis contiguous)")
    backward: bool = optional(BOOL, False, doc="has a backward")


@dataclass(frozen=True)
class RowSpec:
    title: str = key(TEXT)
    change: str = key(TEXT, doc="one sentence")
    arch: str = key(_choice(ARCHES))
    kernel: str = key(TEXT, doc="the main __global__ function's name")
    launch: Launch = key(_table(Launch))
    row: Row = key(_table(Row))
    supports: Supports = key(_table(Supports))
    constants: dict = key(CONSTANTS, doc="kernel.cu's constexpr integers the prose and figures use")
    config: tuple[Config, ...] = key(_tables(Config), doc="the launch configurations, in the launcher's order "
                                                          "(rows aligned to 16 bytes); the last takes any row")

    def config_for(self, cols: int, element_bytes: int = 2) -> Config:
        """The configuration that runs a row of ``cols`` elements (bf16 unless told)."""
        return next(c for c in self.config if c.holds(cols, element_bytes))


def load_spec(path: Path) -> RowSpec:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{path}: not valid TOML: {err}") from None
    spec = _load(RowSpec, data, path, "", "")
    if spec.launch.threads % 32:
        raise SpecError(f"{path}: field 'launch.threads' must be a multiple of 32 (got {spec.launch.threads!r})")
    if ("cluster" in spec.row.owners) != (spec.launch.cluster > 1):
        raise SpecError(f"{path}: field 'launch.cluster' must be > 1 exactly when row.owners has 'cluster' "
                        f"(got {spec.launch.cluster} and {list(spec.row.owners)})")
    _check_configs(spec, path)
    return spec


def _check_configs(spec: RowSpec, path: Path, held_in: tuple[str, ...] = ("registers",),
                   threads: tuple[int, ...] = ()) -> None:
    """[[config]] against itself and against the rest of the spec: what the figures draw from the
    configurations is what [row] and [launch] say of the stage. ``held_in``: the row.held of a stage whose
    configurations hold the row; ``threads``: launch.threads that may stand for another kernel's CTA."""
    def fail(field: str, expected: str, got) -> SpecError:
        return SpecError(f"{path}: field '{field}' must be {expected} (got {got!r})")

    cap = spec.launch.threads if spec.launch.threads not in threads else max(c.cta_threads for c in spec.config)
    for i, c in enumerate(spec.config):
        at = f"config[{i}]"
        if c.threads_per_row != 1 and c.threads_per_row % 32:
            raise fail(f"{at}.threads_per_row", "1 or a multiple of 32", c.threads_per_row)
        if c.cta_threads > cap:
            raise fail(f"{at}.rows_per_cta", f"at most launch.threads / threads_per_row = "
                       f"{cap // c.threads_per_row}", c.rows_per_cta)
        if c.cluster > 1 and (c.rows_per_cta != 1 or not c.vectors or c.cluster > spec.launch.cluster):
            raise fail(f"{at}.cluster", f"1, or at most launch.cluster ({spec.launch.cluster}) for a held row "
                       "(vectors > 0) of one row a CTA", c.cluster)
        if c.vectors and c.max_cols is not None:
            raise fail(f"{at}.max_cols", "left out where the row is held (vectors > 0: it holds what they hold)",
                       c.max_cols)
        if getattr(c, "passes", None) is not None and c.vectors:
            raise fail(f"{at}.passes", "left out where the row is held (vectors > 0: it is read once)", c.passes)
        if getattr(c, "exchange", None) is not None and c.cluster == 1:
            raise fail(f"{at}.exchange", "left out where no cluster shares the row (cluster 1)", c.exchange)
    last = spec.config[-1]
    if last.vectors or last.max_cols is not None:
        raise fail(f"config[{len(spec.config) - 1}]", "a configuration that takes any row (vectors 0, no max_cols)",
                   f"vectors {last.vectors}, max_cols {last.max_cols}")
    owners = tuple(dict.fromkeys(c.owner for c in spec.config))
    if owners != spec.row.owners:
        raise fail("row.owners", f"the owners of its [[config]], in their order: {list(owners)}",
                   list(spec.row.owners))
    levels = tuple(level for level in LEVELS if any(level in c.levels for c in spec.config))
    if levels != spec.row.reduction:
        raise fail("row.reduction", f"the levels of its [[config]]: {list(levels)}", list(spec.row.reduction))
    held = max(c.vectors for c in spec.config)
    if (spec.row.held in held_in) != bool(held) or spec.row.vectors_per_thread != held:
        raise fail("row.vectors_per_thread", f"the most vectors a [[config]] holds ({held}), and row.held "
                   f"{' or '.join(repr(h) for h in held_in)} exactly when it is > 0", spec.row.vectors_per_thread)
    if spec.row.reads != min(c.reads for c in spec.config):
        raise fail("row.reads", f"{min(c.reads for c in spec.config)} (the fewest of its [[config]])", spec.row.reads)
    most = max(c.cta_threads for c in spec.config)
    if spec.launch.threads != most and spec.launch.threads not in threads:
        raise fail("launch.threads", f"the largest CTA of its [[config]] ({most})"
                   + "".join(f" or {t}" for t in threads), spec.launch.threads)
    if max(c.cluster for c in spec.config) != spec.launch.cluster:
        raise fail("launch.cluster", f"the largest cluster of its [[config]] ({max(c.cluster for c in spec.config)})",
                   spec.launch.cluster)


@dataclass(frozen=True)
class RowStage:
    number: int
    slug: str
    dir: Path
    spec: RowSpec

    @property
    def id(self) -> str:
        return f"{self.number:02d}"

    @property
    def name(self) -> str:
        return f"{self.number:02d}-{self.slug}"

    @property
    def lineage(self) -> str:
        """The lineage folder's name ("rmsnorm"): build.library_path prefixes it."""
        return self.dir.parent.name

    title = property(lambda self: self.spec.title)
    change = property(lambda self: self.spec.change)
    arch = property(lambda self: self.spec.arch)
    kernel = property(lambda self: self.spec.kernel)
    threads = property(lambda self: self.spec.launch.threads)

    @property
    def kernel_path(self) -> Path:
        return self.dir / "kernel.cu"

    @property
    def notes_path(self) -> Path:
        return self.dir / "notes.md"

    @property
    def spec_path(self) -> Path:
        return self.dir / "stage.toml"

    def source_files(self) -> list[Path]:
        return source_files(self.kernel_path)

    def source_hash(self) -> str:
        return source_hash(self.kernel_path)

    def source_lines_hash(self) -> str:
        """The tokens and their lines: what the compiler facts' source lines depend on (as lineage.Stage's)."""
        return source_hash(self.kernel_path, lines=True)

    def source_bytes_hash(self) -> str:
        return source_bytes_hash(self.kernel_path)

    def constants(self) -> dict[str, int]:
        return cpp.constants(self.kernel_path.read_text())


def load_stage(folder: Path) -> RowStage:
    folder = Path(folder)
    m = _FOLDER_RE.match(folder.name)
    if not m:
        raise SpecError(f"{folder}: stage folders are named NN_slug (two digits, lower-case slug)")
    for name in ("kernel.cu", "stage.toml", "notes.md"):
        if not (folder / name).is_file():
            raise SpecError(f"{folder}: missing {name}")
    return RowStage(number=int(m.group(1)), slug=m.group(2), dir=folder, spec=load_spec(folder / "stage.toml"))


def discover(root: Path = RMSNORM_DIR) -> list[RowStage]:
    """All stages under ``root`` in order; numbering must run 01, 02, ... without gaps."""
    root = Path(root)
    stages = [load_stage(p) for p in sorted(root.iterdir()) if p.is_dir() and p.name != COMMON_DIR_NAME]
    for expected, stage in enumerate(stages, start=1):
        if stage.number != expected:
            raise SpecError(f"{stage.dir}: stage numbers must run 01, 02, ... without gaps or repeats; "
                            f"expected {expected:02d} here")
    return stages


_LAUNCHER_RE = re.compile(r"\bint\s+with_config\s*\(")
_CONFIG_USE_RE = re.compile(r"\bConfig<([^<>]*)>\s*\{\s*\}")
_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_LOCAL_RE = re.compile(r"\bconstexpr\s+(?:int|int64_t|auto)\s+([^;]+);")


def launcher_configs(source: str) -> list[tuple[int, ...]] | None:
    """The template arguments of every ``Config<...>{}`` the launcher ``with_config`` returns, in its
    order, evaluated over the file's constants and the function's own (None: no such launcher, a
    stage whose rows are not held)."""
    m = _LAUNCHER_RE.search(source)
    if not m:
        return None
    start = source.index("{", m.end())
    depth, end = 0, start
    for end in range(start, len(source)):
        depth += {"{": 1, "}": -1}.get(source[end], 0)
        if depth == 0:
            break
    body = source[start:end]
    env = cpp.constants(source)
    for statement in _LOCAL_RE.findall(body):  # constexpr int kV = kVec16<T>, kN = kVectorsPerThread;
        for part in statement.split(","):
            name, _, expr = part.partition("=")
            value = cpp.evaluate(expr, env)
            if value is not None:
                env[name.strip()] = value
    out = []
    for args in _CONFIG_USE_RE.findall(body):
        values = tuple(cpp.evaluate(a, env) for a in args.split(","))
        out.append(values)
    return out


def config_mismatches(stage: RowStage) -> list[str]:
    """[[config]] entries that kernel.cu does not launch so: the held configurations against its
    launcher's ``Config<threads per row, vectors[, cluster]>`` in order, a streamed one's max_cols and
    CTA size against its constants."""
    source = stage.kernel_path.read_text()
    found = launcher_configs(source) or []
    held = [c for c in stage.spec.config if c.vectors]
    wanted = [(c.threads_per_row, c.vectors) + ((c.cluster,) if c.cluster > 1 else ()) for c in held]
    shown = [(a[:2] if len(a) > 2 and a[2] == 1 else a) for a in found]
    out = []
    if wanted != shown:
        out.append(f"{stage.spec_path}: the held [[config]] (threads_per_row, vectors[, cluster]) are {wanted}, "
                   f"kernel.cu's with_config launches {shown}")
    values = set(stage.constants().values())
    for i, c in enumerate(stage.spec.config):
        if c.vectors:
            continue
        if c.max_cols is not None and c.max_cols not in values:
            out.append(f"{stage.spec_path}: config[{i}].max_cols = {c.max_cols} is none of kernel.cu's constants")
        if c.cta_threads not in values:
            out.append(f"{stage.spec_path}: config[{i}] has CTAs of {c.cta_threads} threads, none of kernel.cu's "
                       "constants")
    if any(isinstance(c, WalkConfig) for c in stage.spec.config):  # the other lineages' cluster exchange
        uses = bool(re.search(r"\bst_async|st\.async", _COMMENT_RE.sub("", source)))
        for i, c in enumerate(stage.spec.config):
            if c.cluster > 1 and (c.exchange == "st.async") != uses:
                out.append(f"{stage.spec_path}: config[{i}].exchange = {c.exchange or 'st.shared::cluster'!r}, but "
                           f"kernel.cu {'exchanges through st.async' if uses else 'has no st.async'}")
    for i, c in enumerate(stage.spec.config):
        if not re.search(rf"__global__ void [^;{{}}]*?\b{c.kernel}\(", source):  # __launch_bounds__ may break the line
            out.append(f"{stage.spec_path}: config[{i}].kernel = {c.kernel!r} is no __global__ of kernel.cu")
    return out


def constant_mismatches(stage: RowStage) -> list[str]:
    """[constants] entries of stage.toml that kernel.cu does not define with that value."""
    found = stage.constants()
    return [f"{stage.spec_path}: constants.{name} = {value}, kernel.cu has "
            f"{found[name] if name in found else 'no such constexpr'}"
            for name, value in stage.spec.constants.items() if found.get(name) != value]
