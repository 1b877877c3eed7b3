"""Part II's rowwise lineages (RMSNorm now; softmax and cross-entropy to come): the stages under
kernels/<op>/NN_slug/, each ``kernel.cu`` (a complete checkpoint), ``stage.toml`` (its spec) and
``notes.md`` (its prose), discovered and typed here, as hopattn.lineage does for attention.

A rowwise stage.toml says what the figures of a memory-bound kernel draw — who holds a row
(thread, warp, CTA, cluster), the levels of the reduction tree, where the row waits between its two
uses, how often each element is read — and, under [constants], the values of kernel.cu's
``constexpr`` integers that the prose relies on (tests compare them with the source). Every key is
declared with its type (the declarations and the loader are lineage's): an unknown key or a value
of another type is a SpecError naming the file and the field.

``RowStage`` has what hopattn.build needs of a stage (number, slug, arch, lineage, kernel_path,
the source hashes), so build.compile_stage and build.build_stages compile it unchanged, into
``build/kernels/rmsnorm-stageNN-slug-<key>.so``. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import cpp
from .lineage import (
    ARCHES, BOOL, COMMON_DIR_NAME, POSITIVE, RMSNORM_DIR, TEXT, Kind, SpecError, _FOLDER_RE, _choice, _is_int,
    _list_of, _load, _table, key, optional, source_bytes_hash, source_files, source_hash,
)
import tomllib

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
    return spec


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


def constant_mismatches(stage: RowStage) -> list[str]:
    """[constants] entries of stage.toml that kernel.cu does not define with that value."""
    found = stage.constants()
    return [f"{stage.spec_path}: constants.{name} = {value}, kernel.cu has "
            f"{found[name] if name in found else 'no such constexpr'}"
            for name, value in stage.spec.constants.items() if found.get(name) != value]
