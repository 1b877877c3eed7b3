"""The lineage: discovery and validation of the numbered stages under kernels/attention/.

A stage is a folder ``NN_slug`` holding ``kernel.cu`` (a complete checkpoint), ``stage.toml``
(the machine-readable spec its diagrams draw) and ``notes.md`` (its prose). This module is the one
place that reads those folders; the build, the API, the benchmark harness and the site generator all
take their ``Stage`` objects from here. It imports nothing heavier than the standard library.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from . import cpp, source_identity

ATTENTION_DIR = Path(__file__).resolve().parent.parent / "attention"
COMMON_DIR_NAME = "common"

ARCHES = ("sm_80", "sm_90a")
LAYOUTS = ("bhsd", "bshd")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "s32": 4, "u64": 8}
SMEM_LAYOUTS = ("row-major", "xor-swizzle", "tma-swizzle-128b", "mbarrier")
SCHEDULE_KINDS = ("load_q", "load_k", "load_v", "load_kv", "qk", "softmax", "pv", "store_o")
SCHEDULE_UNITS = ("load", "tensor", "softmax", "epilogue")

_FOLDER_RE = re.compile(r"^(\d\d)_([a-z0-9]+(?:-[a-z0-9]+)*)$")
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


class SpecError(ValueError):
    """A stage folder or its stage.toml is invalid; the message names the file and the field."""


@dataclass(frozen=True)
class Role:
    name: str
    warps: tuple[int, ...]
    registers: int  # setmaxnreg budget per thread; 0 = left to the compiler
    tasks: tuple[str, ...]


@dataclass(frozen=True)
class SmemBuffer:
    name: str
    shape: tuple[int, ...]
    dtype: str
    buffers: int
    layout: str

    @property
    def bytes(self) -> int:
        n = DTYPE_BYTES[self.dtype] * self.buffers
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class ScheduleOp:
    op: str
    kind: str
    unit: str
    engine: str
    role: str
    after: tuple[str, ...]  # "name" (same iteration), "prev.name", "prev2.name" (earlier iterations)


@dataclass(frozen=True)
class Stage:
    number: int
    slug: str
    dir: Path
    title: str
    change: str
    arch: str
    kernel: str
    block_m: int
    block_n: int
    head_dim: int
    threads: int
    kv_stages: int
    causal: bool
    layouts: tuple[str, ...]
    tails: bool
    roles: tuple[Role, ...]
    smem: tuple[SmemBuffer, ...]
    schedule: tuple[ScheduleOp, ...]
    raw: dict = field(repr=False, compare=False, hash=False)
    gqa: bool = False  # k and v may have fewer heads than q (a divisor of q's), read without a copy
    lse: bool = False  # can return the log-sum-exp of each query row

    @property
    def persistent(self) -> bool:
        """A grid of one CTA per SM that loops over output tiles (no grid.y / grid.z limits)."""
        return self.raw.get("launch", {}).get("grid") == "num_sms"

    @property
    def strided(self) -> bool:
        """Reads and writes through the caller's (batch, head, row) strides: the 4-D tensor maps of
        the stages that read BSHD in place. The others need contiguous tensors."""
        return "bshd" in self.layouts

    @property
    def id(self) -> str:
        return f"{self.number:02d}"

    @property
    def name(self) -> str:
        """Folder name and URL slug: ``NN-slug``."""
        return f"{self.number:02d}-{self.slug}"

    @property
    def kernel_path(self) -> Path:
        return self.dir / "kernel.cu"

    @property
    def notes_path(self) -> Path:
        return self.dir / "notes.md"

    @property
    def spec_path(self) -> Path:
        return self.dir / "stage.toml"

    @property
    def warps(self) -> int:
        return self.threads // 32

    @property
    def smem_bytes(self) -> int:
        return sum(b.bytes for b in self.smem)

    def source_files(self) -> list[Path]:
        """kernel.cu and every project header it includes, transitively, in a stable order."""
        return source_files(self.kernel_path)

    def source_hash(self) -> str:
        """The identity of the stage's sources that its records carry: their tokens, so a comment
        or whitespace edit keeps every record current (hopattn.source_identity)."""
        return source_hash(self.kernel_path)

    def source_lines_hash(self) -> str:
        """The tokens and the line each is on: what -lineinfo and the compiler facts' source lines
        depend on (a comment that moves lines changes it; one within a line does not)."""
        return source_hash(self.kernel_path, lines=True)

    def source_bytes_hash(self) -> str:
        """The sources' bytes: the build cache's key (see source_bytes_hash below)."""
        return source_bytes_hash(self.kernel_path)

    def constants(self) -> dict[str, int]:
        """The ``constexpr`` integers of kernel.cu (the numbers specs are checked against)."""
        return cpp.constants(self.kernel_path.read_text())


def source_files(kernel: Path) -> list[Path]:
    seen: list[Path] = []
    todo = [kernel.resolve()]
    while todo:
        path = todo.pop(0)
        if path in seen:
            continue
        seen.append(path)
        for inc in _INCLUDE_RE.findall(path.read_text()):
            candidate = (path.parent / inc).resolve()
            if candidate.is_file():
                todo.append(candidate)
    return [seen[0]] + sorted(seen[1:])


# The recorder behind the trace points (common/trace.cuh): force-included by the traced build only,
# so it is in no stage's sources; trace records carry its hash beside the stage's.
TRACE_RECORDER = ATTENTION_DIR / "common" / "trace_recorder.cuh"


def trace_recorder() -> Path:
    """The recorder the traced build force-includes: common/trace_recorder.cuh, or for an experiment
    the file $HOPATTN_TRACE_RECORDER names (a drop-in that includes it, as research/trace_variants/ has)."""
    chosen = os.environ.get("HOPATTN_TRACE_RECORDER")
    return Path(chosen).resolve() if chosen else TRACE_RECORDER


def _recorder_files() -> list[Path]:
    chosen = trace_recorder()
    return [chosen] if chosen == TRACE_RECORDER else [chosen, TRACE_RECORDER]


def trace_recorder_hash(lines: bool = False) -> str:
    """Of the recorder the traced build uses (and of common/trace_recorder.cuh, when another one
    includes it): a trace record made with another recorder is stale against the committed one.
    A hash of tokens, as a stage's (source_identity): a comment in the recorder changes no record."""
    return source_identity.digest([(p.name, source_identity.read(p)) for p in _recorder_files()], lines)


def trace_recorder_bytes_hash() -> str:
    """The same files' bytes: the traced build's cache key."""
    chosen = trace_recorder()
    data = chosen.read_bytes() + (b"" if chosen == TRACE_RECORDER else b"\0" + TRACE_RECORDER.read_bytes())
    return hashlib.sha256(data).hexdigest()[:16]


def _named_sources(kernel: Path) -> list[tuple[str, Path]]:
    """The stage's sources named relative to the lineage folder (kernels/attention, or a copy of
    it elsewhere: a copied stage keeps its hash)."""
    root = Path(kernel).resolve().parent.parent
    out = []
    for path in source_files(kernel):
        try:
            rel = path.relative_to(root).as_posix()
        except ValueError:
            rel = path.name
        out.append((rel, path))
    return out


def source_hash(kernel: Path, lines: bool = False) -> str:
    """16 hex digits of sha256 over the stage's sources, each named relative to the lineage folder,
    then its tokens (comments and whitespace left out; with each token's line when ``lines``)."""
    return source_identity.digest([(rel, source_identity.read(p)) for rel, p in _named_sources(kernel)], lines)


def source_bytes_hash(kernel: Path) -> str:
    """sha256 over the sources' names and bytes, every byte counting. The build cache keys on it:
    a library's -lineinfo (lines and columns) is then always that of the sources as they are. It is
    also the identity records carried before source_hash hashed tokens (hopattn.records.restamp)."""
    h = hashlib.sha256()
    for rel, path in _named_sources(kernel):
        data = path.read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:16]


# --- stage.toml validation -------------------------------------------------------------------


class _Fields:
    """Typed access to one table of a stage.toml that names the file and the field on error."""

    def __init__(self, data: dict, path: Path, where: str):
        self.data, self.path, self.where = data, path, where

    def fail(self, key: str, expected: str) -> SpecError:
        got = self.data.get(key, "<missing>")
        return SpecError(f"{self.path}: field '{self.where}{key}' must be {expected} (got {got!r})")

    def get(self, key, kind, expected, default=..., check=None):
        if key not in self.data:
            if default is ...:
                raise self.fail(key, expected)
            return default
        value = self.data[key]
        if kind is int and isinstance(value, bool) or not isinstance(value, kind):
            raise self.fail(key, expected)
        if check is not None and not check(value):
            raise self.fail(key, expected)
        return value

    def text(self, key, **kw):
        return self.get(key, str, "a non-empty string", check=lambda v: bool(v.strip()), **kw)

    def positive(self, key, **kw):
        return self.get(key, int, "a positive integer", check=lambda v: v > 0, **kw)

    def choice(self, key, options, **kw):
        return self.get(key, str, f"one of {', '.join(options)}", check=lambda v: v in options, **kw)

    def strings(self, key, **kw):
        return tuple(self.get(key, list, "a list of strings",
                              check=lambda v: all(isinstance(s, str) and s for s in v), **kw))

    def table(self, key) -> "_Fields":
        return _Fields(self.get(key, dict, "a table"), self.path, f"{self.where}{key}.")

    def tables(self, key, **kw) -> list["_Fields"]:
        items = self.get(key, list, "an array of tables",
                         check=lambda v: len(v) > 0 and all(isinstance(t, dict) for t in v), **kw)
        return [_Fields(t, self.path, f"{self.where}{key}[{i}].") for i, t in enumerate(items)]


def load_stage(folder: Path) -> Stage:
    folder = Path(folder)
    m = _FOLDER_RE.match(folder.name)
    if not m:
        raise SpecError(f"{folder}: stage folders are named NN_slug (two digits, lower-case slug)")
    for name in ("kernel.cu", "stage.toml", "notes.md"):
        if not (folder / name).is_file():
            raise SpecError(f"{folder}: missing {name}")
    path = folder / "stage.toml"
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{path}: not valid TOML: {err}") from None
    f = _Fields(data, path, "")
    tile, launch, supports = f.table("tile"), f.table("launch"), f.table("supports")
    pipeline = f.table("pipeline")
    threads = launch.positive("threads")
    if threads % 32:
        raise launch.fail("threads", "a multiple of 32")
    warp_count = threads // 32

    roles = []
    for r in f.tables("roles"):
        warps = r.get("warps", list, "a list of warp indices",
                      check=lambda v: v and all(isinstance(w, int) and 0 <= w < warp_count for w in v))
        roles.append(Role(r.text("name"), tuple(warps),
                          r.get("registers", int, "0 or a setmaxnreg budget (24..256, multiple of 8)", default=0,
                                check=lambda v: v == 0 or (24 <= v <= 256 and v % 8 == 0)),
                          r.strings("tasks")))
    owned = sorted(w for role in roles for w in role.warps)
    if owned != list(range(warp_count)):
        raise SpecError(f"{path}: field 'roles[].warps' must assign each of the {warp_count} warps "
                        f"(launch.threads / 32) to exactly one role (got {owned})")

    smem = []
    for b in f.tables("smem", default=[]) if "smem" in data else []:
        shape = b.get("shape", list, "a list of positive integers",
                      check=lambda v: v and all(isinstance(s, int) and s > 0 for s in v))
        smem.append(SmemBuffer(b.text("name"), tuple(shape), b.choice("dtype", tuple(DTYPE_BYTES)),
                               b.positive("buffers", default=1), b.choice("layout", SMEM_LAYOUTS)))

    role_names = {r.name for r in roles}
    schedule = []
    for s in f.tables("schedule"):
        schedule.append(ScheduleOp(s.text("op"), s.choice("kind", SCHEDULE_KINDS),
                                   s.choice("unit", SCHEDULE_UNITS), s.text("engine"),
                                   s.choice("role", tuple(sorted(role_names))), s.strings("after", default=[])))
    ops = {s.op for s in schedule}
    if len(ops) != len(schedule):
        raise SpecError(f"{path}: field 'schedule[].op' must be unique within the stage")
    for i, s in enumerate(schedule):
        for dep in s.after:
            target = dep.split(".", 1)[1] if dep.startswith(("prev.", "prev2.")) else dep
            if target not in ops:
                raise SpecError(f"{path}: field 'schedule[{i}].after' names '{dep}', which is no op of this stage")

    return Stage(
        number=int(m.group(1)), slug=m.group(2), dir=folder,
        title=f.text("title"), change=f.text("change"), arch=f.choice("arch", ARCHES), kernel=f.text("kernel"),
        block_m=tile.positive("block_m"), block_n=tile.positive("block_n"), head_dim=tile.positive("head_dim"),
        threads=threads, kv_stages=pipeline.positive("kv_stages"),
        causal=supports.get("causal", bool, "true or false"),
        layouts=supports.get("layouts", list, f"a list drawn from {LAYOUTS}",
                             check=lambda v: v and all(x in LAYOUTS for x in v)),
        tails=supports.get("tails", bool, "true or false"),
        roles=tuple(roles), smem=tuple(smem), schedule=tuple(schedule), raw=data,
        gqa=supports.get("gqa", bool, "true or false", default=False),
        lse=supports.get("lse", bool, "true or false", default=False),
    )


def discover(root: Path = ATTENTION_DIR) -> list[Stage]:
    """All stages under ``root``, in order; numbering must run 01, 02, ... without gaps."""
    root = Path(root)
    folders = sorted(p for p in root.iterdir() if p.is_dir() and p.name != COMMON_DIR_NAME)
    stages = [load_stage(p) for p in folders]
    for expected, stage in enumerate(stages, start=1):
        if stage.number != expected:
            raise SpecError(f"{stage.dir}: stage numbers must run 01, 02, ... without gaps or repeats; "
                            f"expected {expected:02d} here")
    return stages


def parse_selection(text: str, available: list[int]) -> list[int]:
    """Stage numbers from '1,2,5-6' (commas or spaces) -> [1, 2, 5, 6]; 'all' -> every available
    stage; 'none' -> []. ValueError naming the part that is wrong."""
    text = text.strip().lower()
    if text == "all":
        return sorted(available)
    if text == "none":
        return []
    wanted: set[int] = set()
    for part in text.replace(",", " ").split():
        lo, dash, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi if dash else lo)
        except ValueError:
            raise ValueError(f"{part!r} is not a stage number or range like 5-6") from None
        if first > last:
            raise ValueError(f"range {part!r} runs backwards")
        wanted.update(range(first, last + 1))
    missing = sorted(wanted - set(available))
    if missing:
        raise ValueError(f"no stage {missing[0]:02d}; the lineage has {', '.join(f'{n:02d}' for n in sorted(available))}")
    return sorted(wanted)


def select(stages: list[Stage], args: list[str]) -> list[Stage]:
    """The stages that command-line arguments such as ``1 3-5`` or ``7,9-11`` name (none: all)."""
    if not args:
        return stages
    numbers = set(parse_selection(" ".join(args), [s.number for s in stages]))
    return [s for s in stages if s.number in numbers]


def get_stage(number: int, root: Path = ATTENTION_DIR) -> Stage:
    stages = discover(root)
    for s in stages:
        if s.number == number:
            return s
    raise KeyError(number)
