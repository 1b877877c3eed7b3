"""The lineage: discovery and validation of the numbered stages under kernels/attention/.

A stage is a folder ``NN_slug`` holding ``kernel.cu`` (a complete checkpoint), ``stage.toml``
(the machine-readable spec its diagrams draw) and ``notes.md`` (its prose). This module is the one
place that reads those folders; the build, the API, the benchmark harness and the site generator all
take their ``Stage`` objects from here. It imports nothing heavier than the standard library.

stage.toml is read through one typed spec (``StageSpec`` and its tables, below): every key of
every table is declared with its type and default, and a key no table declares, or a value of
another type, is a SpecError naming the file and the field. Each fact is stated once (a persistent
stage is one whose launch.grid is "num_sms").
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

from . import cpp, source_identity

ATTENTION_DIR = Path(__file__).resolve().parent.parent / "attention"
BACKWARD_DIR = ATTENTION_DIR.parent / "attention_backward"  # Act V: the backward pass, same form
RMSNORM_DIR = ATTENTION_DIR.parent / "rmsnorm"  # Part II: a rowwise lineage (its spec: hopattn.rowwise)
COMMON_DIR_NAME = "common"
HEAD_DIM_TILE = "HeadDimTile"  # kernel.cu's tile per head dim, a specialisation each (stage 24 on)

ARCHES = ("sm_80", "sm_90a")
LAYOUTS = ("bhsd", "bshd")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "s32": 4, "u64": 8}
SMEM_LAYOUTS = ("row-major", "xor-swizzle", "tma-swizzle-128b", "mbarrier")
SCHEDULE_KINDS = ("load_q", "load_k", "load_v", "load_kv", "qk", "softmax", "pv", "store_o",
                  # the backward's (Act V): dO's load, its GEMMs beside qk, dQ's accumulation, dK and dV stored
                  "load_do", "dp", "dv", "dk", "dq", "store_dkdv")
SCHEDULE_UNITS = ("load", "tensor", "softmax", "epilogue")

_FOLDER_RE = re.compile(r"^(\d\d)_([a-z0-9]+(?:-[a-z0-9]+)*)$")
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


class SpecError(ValueError):
    """A stage folder or its stage.toml is invalid; the message names the file and the field."""


# --- the spec: every key of every table of stage.toml, declared with its type -----------------
#
# Each table is a dataclass; each key a field whose metadata holds its Kind (what the TOML value
# must be, and the typed value made from it) and its default (REQUIRED: the key must be there).
# load_spec reads a stage.toml through these declarations only: a key no table declares, a value
# of the wrong type or a missing required key is a SpecError naming the file and the field, never
# a silent default.

REQUIRED = object()


@dataclass(frozen=True)
class Kind:
    """What a key holds: ``expected`` (said in errors), ``ok`` (accepts the value TOML gives),
    ``make`` (the typed value from it); ``table``: a table (or, with ``array``, an array of tables)
    declared by that dataclass."""

    expected: str
    ok: Callable[[Any], bool] = lambda v: True
    make: Callable[[Any], Any] = lambda v: v
    table: type | None = None
    array: bool = False


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _choice(options) -> Kind:
    return Kind(f"one of {', '.join(options)}", lambda v: isinstance(v, str) and v in options)


def _list_of(expected: str, item) -> Kind:
    return Kind(expected, lambda v: isinstance(v, list) and len(v) > 0 and all(item(x) for x in v), tuple)


TEXT = Kind("a non-empty string", lambda v: isinstance(v, str) and bool(v.strip()))
POSITIVE = Kind("a positive integer", lambda v: _is_int(v) and v > 0)
BOOL = Kind("true or false", lambda v: isinstance(v, bool))
STRINGS = Kind("a list of strings", lambda v: isinstance(v, list) and all(isinstance(s, str) and s for s in v), tuple)
ENGINES = Kind("a non-empty string or a list of them",  # one mechanism, or the steps of a path
               lambda v: TEXT.ok(v) or (isinstance(v, list) and len(v) > 0 and all(TEXT.ok(x) for x in v)),
               lambda v: (v,) if isinstance(v, str) else tuple(v))


def _table(cls) -> Kind:
    return Kind("a table", table=cls)


def _tables(cls) -> Kind:
    return Kind("an array of tables", table=cls, array=True)


def key(kind: Kind, default=REQUIRED, doc: str = ""):
    """A declared key. The default lives in the declaration (the dataclass itself keeps positional
    construction, e.g. Role("producer", (0,), 24, ()))."""
    return field(metadata={"kind": kind, "default": default, "doc": doc})


def optional(kind: Kind, default, doc: str = ""):
    """A key that may be left out, with the same default for the loader and the constructor."""
    return field(default=default, metadata={"kind": kind, "default": default, "doc": doc})


GRIDS = ("tiles", "num_sms")
CTA_ORDERS = ("blockidx", "heavy-first")
P_OPERANDS = ("smem", "registers")
DQ_CONVERTS = ("rows", "fragments", "staged rows")  # how a backward stage writes dQ from its accumulator
DQ_DETERMINISTIC = ("second pass", "ordered")  # how a backward stage's deterministic mode sums dQ


@dataclass(frozen=True)
class Tile:
    block_m: int = key(POSITIVE, doc="query rows per CTA")
    block_n: int = key(POSITIVE, doc="key/value rows per iteration")
    head_dim: int = key(POSITIVE)


@dataclass(frozen=True)
class Launch:
    threads: int = key(POSITIVE, doc="a multiple of 32")
    grid: str = optional(_choice(GRIDS), "tiles",
                         doc="tiles: a CTA per output tile (q-blocks, heads, batch); num_sms: a CTA per SM "
                             "looping over the output tiles (persistent)")
    cluster: int = optional(POSITIVE, 1, doc="CTAs of a cluster multicasting K/V")
    cta_order: str = optional(_choice(CTA_ORDERS), "blockidx",
                              doc="backward stages: blockidx: a CTA's key block, K/V head and batch are its "
                                  "blockIdx (x, y, z); heavy-first: causal CTAs map their linear index to the "
                                  "heaviest key blocks first, a window of (K/V head, batch) pairs at a time")


def _is_head_dim(v) -> bool:
    return _is_int(v) and v > 0 and v % 8 == 0  # rows of 16-byte multiples: the loads and the copy engine


def _is_head_dim_entry(v) -> bool:
    return _is_head_dim(v) or (isinstance(v, list) and len(v) == 2 and all(_is_head_dim(x) for x in v))


def _head_dim_pair(v) -> tuple[int, int]:
    return (v, v) if _is_int(v) else (v[0], v[1])


# [supports] head_dims: d (q, k, v and the output of head dim d), or [d, dv] (q and k of d, v and
# the output of dv: DeepSeek's MLA prefill is [192, 128]); a kernel picks its tile by q's head dim,
# so no d twice.
HEAD_DIMS = Kind("a list of head dims (positive multiples of 8), each d or [d, dv] (q and k of d, v of dv), "
                 "no d twice",
                 lambda v: isinstance(v, list) and len(v) > 0 and all(_is_head_dim_entry(x) for x in v)
                 and len({_head_dim_pair(x)[0] for x in v}) == len(v),
                 lambda v: tuple(_head_dim_pair(x) for x in v))


@dataclass(frozen=True)
class Supports:
    causal: bool = key(BOOL)
    layouts: tuple[str, ...] = key(_list_of(f"a list drawn from {LAYOUTS}", lambda x: x in LAYOUTS))
    tails: bool = key(BOOL, doc="any len_q and len_k, not only multiples of the tiles")
    gqa: bool = key(BOOL, False, doc="k and v may have fewer heads than q (a divisor of q's), read without a copy")
    lse: bool = key(BOOL, False, doc="can return the log-sum-exp of each query row")
    deterministic: bool = key(BOOL, False, doc="backward stages: has a mode whose gradients are identical run to run")
    head_dims: tuple[tuple[int, int], ...] | None = key(
        HEAD_DIMS, None, doc="the (q and k, v) head dims the stage serves; left out: tile.head_dim only")


@dataclass(frozen=True)
class Pipeline:
    kv_stages: int = key(POSITIVE, doc="K/V buffers in flight")


@dataclass(frozen=True)
class Movement:
    """How the operands travel (the memory diagram draws these mechanisms; engines.family folds the
    names). A key left out is found from the schedule's engines and the buffers."""

    q_load: str | None = optional(TEXT, None, doc="how Q leaves global memory (cp.async, tma, ...)")
    kv_load: str | None = optional(TEXT, None, doc="how K and V leave global memory")
    kv_fragments: str | None = optional(TEXT, None, doc="how operands reach the tensor cores (ld.shared, ldmatrix, ...)")
    o_store: tuple[str, ...] | None = optional(ENGINES, None,
                                               doc='"st.global", or the path ["stmatrix", "tma.store"]')
    dq_convert: str | None = optional(_choice(DQ_CONVERTS), None,
                                      doc="backward stages: how the last launch writes the bf16 dQ from the fp32 "
                                          "accumulator: rows (a row-major accumulator, 16-byte stores), fragments "
                                          "(kept in wgmma fragment order, each thread's 4-byte pieces stored where "
                                          "they belong) or staged rows (fragments through a shared tile, then "
                                          "16-byte stores of whole rows)")


@dataclass(frozen=True)
class Diagram:
    """What the pictures need that the rest of the spec cannot say."""

    p_operand: str | None = optional(_choice(P_OPERANDS), None,
                                     doc="smem (wgmma SS) or registers; left out: smem if a P buffer exists. "
                                         "Backward stages: registers means a GEMM takes P or dS as its A from the "
                                         "registers that made them wherever they are held the way it needs them "
                                         "(with transposed_scores, dV's and dK's; dQ's then reads the dS buffer)")
    q_in_registers: bool = optional(BOOL, True, doc="false: Q fragments are loaded again every k-step")
    p_store: str = optional(TEXT, "st.shared", doc="how P reaches shared memory, when it goes there")
    pv_n: int | None = optional(POSITIVE, None, doc="N of the PV wgmma; left out: head_dim")
    transposed_scores: bool = optional(BOOL, False,
                                       doc="backward stages: true when the kernel computes Sᵀ = K Qᵀ and dPᵀ = V dOᵀ "
                                           "(M = the CTA's keys, FlashAttention-3's placement), so Pᵀ and dSᵀ are "
                                           "held keys by queries, in registers and in a P or dS buffer alike; false: "
                                           "S = Q Kᵀ and dP = dO Vᵀ (M = query rows, FlashAttention-2's)")
    dq_pass_keys: int | None = optional(POSITIVE, None,
                                        doc="backward stages: keys per step of the deterministic mode's dQ pass; "
                                            "left out: block_n")
    dq_deterministic: str | None = optional(_choice(DQ_DETERMINISTIC), None,
                                            doc="backward stages with supports.deterministic: how that mode sums dQ. "
                                                "second pass: the main kernel computes dK and dV only and a second "
                                                "kernel walks each query block's keys in order (dq_pass_keys a step); "
                                                "ordered: the same kernel, each query block's dQ additions made in "
                                                "key-block order (a turn counter per query block and dQ operation "
                                                "of the step). Left out: second pass")


_REGISTERS = Kind("0 or a setmaxnreg budget (24..256, multiple of 8)",
                  lambda v: _is_int(v) and (v == 0 or (24 <= v <= 256 and v % 8 == 0)))


@dataclass(frozen=True)
class Role:
    name: str = key(TEXT)
    warps: tuple[int, ...] = key(_list_of("a list of warp indices", lambda w: _is_int(w) and w >= 0))
    registers: int = key(_REGISTERS, 0, doc="setmaxnreg budget per thread; 0 = left to the compiler")
    tasks: tuple[str, ...] = key(STRINGS)


@dataclass(frozen=True)
class SmemBuffer:
    name: str = key(TEXT)
    shape: tuple[int, ...] = key(_list_of("a list of positive integers", lambda s: _is_int(s) and s > 0))
    dtype: str = key(_choice(tuple(DTYPE_BYTES)))
    buffers: int = key(POSITIVE, 1)
    layout: str = key(_choice(SMEM_LAYOUTS))

    @property
    def bytes(self) -> int:
        n = DTYPE_BYTES[self.dtype] * self.buffers
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class ScheduleOp:
    op: str = key(TEXT)
    kind: str = key(_choice(SCHEDULE_KINDS))
    unit: str = key(_choice(SCHEDULE_UNITS))
    engine: str = key(TEXT)
    role: str = key(TEXT, doc="one of the roles' names")
    after: tuple[str, ...] = key(STRINGS, (), doc='"name" (same iteration), "prev.name", "prev2.name" (earlier iterations)')
    rows: int | None = optional(POSITIVE, None, doc="query rows the op covers; left out: the CTA's rows split evenly "
                                                    "among the ops of its kind")


@dataclass(frozen=True)
class StageSpec:
    """A stage.toml, typed: what load_spec returns."""

    title: str = key(TEXT)
    change: str = key(TEXT, doc="one sentence")
    arch: str = key(_choice(ARCHES))
    kernel: str = key(TEXT, doc="the __global__ function's name")
    tile: Tile = key(_table(Tile))
    launch: Launch = key(_table(Launch))
    supports: Supports = key(_table(Supports))
    pipeline: Pipeline = key(_table(Pipeline))
    movement: Movement = key(_table(Movement), Movement())
    diagram: Diagram = key(_table(Diagram), Diagram())
    roles: tuple[Role, ...] = key(_tables(Role))
    smem: tuple[SmemBuffer, ...] = key(_tables(SmemBuffer), ())
    schedule: tuple[ScheduleOp, ...] = key(_tables(ScheduleOp), doc="one KV iteration per role, in program order")


def _type_error(path: Path, field_name: str, expected: str, value) -> SpecError:
    got = "'<missing>'" if value is REQUIRED else repr(value)
    return SpecError(f"{path}: field '{field_name}' must be {expected} (got {got})")


def _load(cls, data: dict, path: Path, where: str, place: str):
    """An instance of the table dataclass ``cls`` from ``data``. ``where``: the field prefix in type
    errors ('tile.', 'schedule[2].'); ``place``: the table in unknown-key errors ('[tile]',
    '[[schedule]][2]', '' at the top)."""
    declared = {f.name: f for f in fields(cls)}
    for name in data:
        if name not in declared:
            at = f"{place}.{name}" if place else name
            raise SpecError(f"{path}: {at}: unknown key (known: {', '.join(declared)})")
    values = {}
    for name, f in declared.items():
        kind, default = f.metadata["kind"], f.metadata["default"]
        value = data.get(name, REQUIRED)
        if value is REQUIRED:
            if default is REQUIRED:
                raise _type_error(path, where + name, kind.expected, value)
            values[name] = default
        elif kind.table is not None and kind.array:
            if not (isinstance(value, list) and value and all(isinstance(t, dict) for t in value)):
                raise _type_error(path, where + name, kind.expected, value)
            values[name] = tuple(_load(kind.table, t, path, f"{where}{name}[{i}].", f"[[{where}{name}]][{i}]")
                                 for i, t in enumerate(value))
        elif kind.table is not None:
            if not isinstance(value, dict):
                raise _type_error(path, where + name, kind.expected, value)
            values[name] = _load(kind.table, value, path, f"{where}{name}.", f"[{where}{name}]")
        else:
            if not kind.ok(value):
                raise _type_error(path, where + name, kind.expected, value)
            values[name] = kind.make(value)
    return cls(**values)


def load_spec(path: Path) -> StageSpec:
    """The typed stage.toml at ``path``: every key declared above, each of its type (SpecError
    naming the file and the field otherwise), and the checks across keys."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{path}: not valid TOML: {err}") from None
    spec = _load(StageSpec, data, path, "", "")
    threads = spec.launch.threads
    if threads % 32:
        raise SpecError(f"{path}: field 'launch.threads' must be a multiple of 32 (got {threads!r})")
    warp_count = threads // 32
    for i, r in enumerate(spec.roles):
        if any(w >= warp_count for w in r.warps):
            raise SpecError(f"{path}: field 'roles[{i}].warps' must be a list of warp indices below "
                            f"{warp_count} (launch.threads / 32) (got {list(r.warps)!r})")
    owned = sorted(w for role in spec.roles for w in role.warps)
    if owned != list(range(warp_count)):
        raise SpecError(f"{path}: field 'roles[].warps' must assign each of the {warp_count} warps "
                        f"(launch.threads / 32) to exactly one role (got {owned})")
    served = spec.supports.head_dims
    if served is not None and (spec.tile.head_dim, spec.tile.head_dim) not in served:
        raise SpecError(f"{path}: field 'supports.head_dims' must include tile.head_dim "
                        f"({spec.tile.head_dim}, the head dim the figures draw) (got {[list(p) for p in served]})")
    if spec.diagram.dq_deterministic is not None and not spec.supports.deterministic:
        raise SpecError(f"{path}: field 'diagram.dq_deterministic' says how a deterministic mode sums dQ, and "
                        f"supports.deterministic is false (got {spec.diagram.dq_deterministic!r})")
    role_names = tuple(sorted({r.name for r in spec.roles}))
    for i, s in enumerate(spec.schedule):
        if s.role not in role_names:
            raise SpecError(f"{path}: field 'schedule[{i}].role' must be one of {', '.join(role_names)} "
                            f"(got {s.role!r})")
    ops = {s.op for s in spec.schedule}
    if len(ops) != len(spec.schedule):
        raise SpecError(f"{path}: field 'schedule[].op' must be unique within the stage")
    for i, s in enumerate(spec.schedule):
        for dep in s.after:
            target = dep.split(".", 1)[1] if dep.startswith(("prev.", "prev2.")) else dep
            if target not in ops:
                raise SpecError(f"{path}: field 'schedule[{i}].after' names '{dep}', which is no op of this stage")
    return spec


def spec_keys() -> dict[str, list[tuple[str, str, str]]]:
    """Every table of stage.toml and its keys: {table: [(key, what it holds, doc)]} (for readers
    and tests; the declarations above are the source)."""
    out: dict[str, list[tuple[str, str, str]]] = {}

    def walk(cls, name):
        rows = out.setdefault(name, [])
        for f in fields(cls):
            kind = f.metadata["kind"]
            rows.append((f.name, kind.expected, f.metadata["doc"]))
            if kind.table is not None:
                walk(kind.table, f"[[{f.name}]]" if kind.array else f"[{f.name}]")

    walk(StageSpec, "")
    return out


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
    gqa: bool = False  # k and v may have fewer heads than q (a divisor of q's), read without a copy
    lse: bool = False  # can return the log-sum-exp of each query row
    deterministic: bool = False  # backward: a mode with gradients identical run to run
    head_dims: tuple[tuple[int, int], ...] = ((128, 128),)  # supports.head_dims: (q and k, v) pairs served
    grid: str = "tiles"  # launch.grid: "tiles" or "num_sms"
    cluster: int = 1  # launch.cluster
    cta_order: str = "blockidx"  # launch.cta_order (backward stages)
    movement: Movement = Movement()
    diagram: Diagram = Diagram()

    @property
    def persistent(self) -> bool:
        """A grid of one CTA per SM that loops over output tiles (no grid.y / grid.z limits):
        launch.grid = "num_sms", the one place the spec says so."""
        return self.grid == "num_sms"

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
    def lineage(self) -> str:
        """The lineage folder's name: "attention" (the forward) or "attention_backward" (Act V)."""
        return self.dir.parent.name

    @property
    def backward(self) -> bool:
        return self.lineage == BACKWARD_DIR.name

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

    def head_dim_v(self, head_dim: int) -> int | None:
        """V's (and the output's) head dim when q and k have ``head_dim``; None: not served."""
        return dict(self.head_dims).get(head_dim)

    def head_dims_text(self) -> str:
        """The head dims served, for messages: '128', or '64, 96, 128, 192 (v 128) and 256'."""
        parts = [f"{d}" if d == dv else f"{d} (v {dv})" for d, dv in self.head_dims]
        return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"

    def constants(self, head_dim: int | None = None) -> dict[str, int]:
        """The ``constexpr`` integers of kernel.cu (the numbers specs are checked against). A kernel
        whose tile depends on the head dim (a ``HeadDimTile<D>`` per head dim, stage 24 on) gives
        those of ``head_dim``'s tile, HEAD_DIM among them (default: the head dim [tile] draws)."""
        text = self.kernel_path.read_text()
        tiles = cpp.specializations(text, HEAD_DIM_TILE)
        if not tiles:
            return cpp.constants(text)
        d = self.head_dim if head_dim is None else head_dim
        if str(d) not in tiles:
            raise KeyError(f"{self.kernel_path}: no {HEAD_DIM_TILE}<{d}> (it has {', '.join(tiles)})")
        return cpp.constants(text, seed={"HEAD_DIM": d, **tiles[str(d)]})

    def tile_head_dims(self) -> list[int]:
        """The head dims kernel.cu has a ``HeadDimTile<D>`` for, in file order ([] for a kernel of one tile)."""
        return [int(d) for d in cpp.specializations(self.kernel_path.read_text(), HEAD_DIM_TILE)]

    def at_head_dim(self, head_dim: int) -> Stage:
        """The stage as its kernel runs at ``head_dim`` (one it serves): the query rows, keys and
        threads of its ``HeadDimTile<D>``, and a consumer role per consumer warpgroup past the
        spec's (consumer2 at head dim 64, its warps 12-15); itself at the head dim [tile] draws.
        The roles' tasks, the buffers and the [[schedule]] stay the spec's, written for that one."""
        if head_dim == self.head_dim:
            return self
        if self.head_dim_v(head_dim) is None:
            raise ValueError(f"stage {self.id} serves head dims {self.head_dims_text()}, not {head_dim}")
        c = self.constants(head_dim)
        consumers = [r for r in self.roles if r.name.startswith("consumer")]
        extra = tuple(Role(f"consumer{n}", tuple(range(4 * n + 4, 4 * n + 8)), c["CONSUMER_REGS"], ())
                      for n in range(len(consumers), c["CONSUMERS"]))
        return replace(self, block_m=c["BLOCK_M"], block_n=c["BLOCK_N"], head_dim=head_dim,
                       threads=c["NUM_THREADS"], roles=self.roles + extra)


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


def load_stage(folder: Path) -> Stage:
    folder = Path(folder)
    m = _FOLDER_RE.match(folder.name)
    if not m:
        raise SpecError(f"{folder}: stage folders are named NN_slug (two digits, lower-case slug)")
    for name in ("kernel.cu", "stage.toml", "notes.md"):
        if not (folder / name).is_file():
            raise SpecError(f"{folder}: missing {name}")
    spec = load_spec(folder / "stage.toml")
    return Stage(
        number=int(m.group(1)), slug=m.group(2), dir=folder,
        title=spec.title, change=spec.change, arch=spec.arch, kernel=spec.kernel,
        block_m=spec.tile.block_m, block_n=spec.tile.block_n, head_dim=spec.tile.head_dim,
        threads=spec.launch.threads, kv_stages=spec.pipeline.kv_stages,
        causal=spec.supports.causal, layouts=spec.supports.layouts, tails=spec.supports.tails,
        roles=spec.roles, smem=spec.smem, schedule=spec.schedule,
        gqa=spec.supports.gqa, lse=spec.supports.lse, deterministic=spec.supports.deterministic,
        head_dims=spec.supports.head_dims or ((spec.tile.head_dim, spec.tile.head_dim),),
        grid=spec.launch.grid, cluster=spec.launch.cluster, cta_order=spec.launch.cta_order,
        movement=spec.movement, diagram=spec.diagram,
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
