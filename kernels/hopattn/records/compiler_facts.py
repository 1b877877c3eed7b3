"""The compiler facts of a stage (kernels/compiler_facts/<lineage>/<NN-slug>.json): what nvcc,
ptxas and cuobjdump made of its kernel.cu, stamped with the source hash (tokens), the source lines
hash (tokens and their lines, for the line numbers the facts show) and nvcc flags it was made
from. hopattn.compiler writes them; the site reads them and never compiles.

Also the vocabulary both sides share: the groups SASS opcodes are counted in.
"""

from __future__ import annotations

import re
from pathlib import Path

from .. import build, lineage
from . import files
from .fields import Checker, counts, is_text, nonneg_int

SCHEMA_VERSION = 1
ARCH = "sm_90a"  # the code Hopper runs; sm_80 stages embed sm_80 code too, which is ignored

# Opcode groups in display order. A key is a base opcode, except MUFU which keeps its function
# (EX2, RCP): the exponentials of the softmax are what a reader looks for there.
GROUPS: tuple[tuple[str, str, frozenset[str]], ...] = (
    ("tensor", "tensor core", frozenset({"HMMA", "HGMMA", "IMMA", "IGMMA", "QGMMA", "BMMA", "DMMA"})),
    ("memory", "data movement", frozenset({
        "LDG", "STG", "LDS", "STS", "LDSM", "STSM", "LD", "ST", "LDGSTS", "UTMALDG", "UTMASTG",
        "UTMAPF", "UTMAREDG", "UTMACCTL", "UTMACMDFLUSH", "UBLKCP", "UBLKPF", "UBLKRED", "ATOM",
        "ATOMG", "ATOMS", "RED", "REDG", "LDGMC"})),
    ("softmax", "softmax arithmetic", frozenset({
        "MUFU", "FFMA", "FMUL", "FADD", "FMNMX", "FSETP", "FSEL", "F2FP", "FCHK", "SHFL", "FSWZADD"})),
    ("sync", "synchronization", frozenset({
        "BAR", "SYNCS", "WARPGROUP", "DEPBAR", "LDGDEPBAR", "MEMBAR", "FENCE", "WARPSYNC", "ERRBAR",
        "ARRIVES", "USETMAXREG", "CCTL"})),
    ("local", "local memory (spills, stack)", frozenset({"LDL", "STL"})),
)
OTHER = ("other", "other (integer, address, control)")
GROUP_ORDER = tuple(g[0] for g in GROUPS) + (OTHER[0],)
GROUP_LABELS = {g[0]: g[1] for g in GROUPS} | {OTHER[0]: OTHER[1]}

_HASH_RE = re.compile(r"^[0-9a-f]{16}$")
_ADDRESS_RE = re.compile(r"^0x[0-9a-f]{4,}$")
_FUNCTION_INTS = ("registers", "barriers", "static_smem", "stack_frame", "spill_stores", "spill_loads",
                  "instructions")


class FactsError(ValueError):
    """A facts file is invalid; the message names the file and the field."""


def group_of(key: str) -> str:
    base = key.split(".")[0]
    for name, _, members in GROUPS:
        if base in members:
            return name
    return OTHER[0]


def folder_for(lineage_dir: Path) -> Path:
    """Where the facts of the lineage in ``lineage_dir`` (kernels/<name>) live."""
    lineage_dir = Path(lineage_dir)
    return lineage_dir.parent / "compiler_facts" / lineage_dir.name


def path_for(stage: lineage.Stage) -> Path:
    return folder_for(stage.dir.parent) / f"{stage.name}.json"


def flags_text(stage: lineage.Stage) -> str:
    return " ".join(build.nvcc_flags(stage))


# --- validation --------------------------------------------------------------------------------


def _check_function(c: Checker, obj, f: str) -> None:
    if not isinstance(obj, dict):
        raise c.fail(f, "an object", obj)
    p = f"{f}." if f else ""
    c.get(obj, "function", f"{p}function", "the mangled name (a string)", is_text)
    c.get(obj, "signature", f"{p}signature", "a string", is_text)
    for key in _FUNCTION_INTS:
        c.get(obj, key, f"{p}{key}", "a non-negative integer", nonneg_int)
    c.get(obj, "advisories", f"{p}advisories", "a list of strings",
          lambda v: isinstance(v, list) and all(isinstance(a, str) for a in v))


def _check_loop(c: Checker, loop) -> None:
    if not isinstance(loop, dict):
        raise c.fail("loop", "an object or null", loop)
    for key in ("start", "end"):
        c.get(loop, key, f"loop.{key}", "an address like '0x0a40'", lambda v: isinstance(v, str) and bool(_ADDRESS_RE.match(v)))
    c.get(loop, "instructions", "loop.instructions", "a non-negative integer", nonneg_int)
    c.get(loop, "opcodes", "loop.opcodes", "an object of opcode -> count", counts)
    c.get(loop, "groups", "loop.groups", f"an object of group ({', '.join(GROUP_ORDER)}) -> count",
          lambda v: counts(v) and set(v) <= set(GROUP_ORDER))
    c.get(loop, "source_lines", "loop.source_lines", "[first, last] line numbers or null",
          lambda v: isinstance(v, list) and len(v) == 2 and all(nonneg_int(n) for n in v), nullable=True)
    c.get(loop, "listing", "loop.listing", "a list of strings",
          lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v))


def validate(data, where="<compiler facts>") -> dict:
    """Raise FactsError (naming ``where`` and the field) unless ``data`` follows this schema."""
    c = Checker(where, FactsError)
    if not isinstance(data, dict):
        raise c.fail("<top level>", "an object", data)
    c.get(data, "schema_version", "schema_version", str(SCHEMA_VERSION), lambda v: v == SCHEMA_VERSION)
    c.get(data, "stage", "stage", "the stage name NN-slug", is_text)
    c.get(data, "source_hash", "source_hash", "16 lower-case hex digits",
          lambda v: isinstance(v, str) and bool(_HASH_RE.match(v)))
    if "source_lines_hash" in data:  # facts made before the records hashed tokens lack it (stale)
        c.get(data, "source_lines_hash", "source_lines_hash", "16 lower-case hex digits",
              lambda v: isinstance(v, str) and bool(_HASH_RE.match(v)))
    c.get(data, "nvcc_flags", "nvcc_flags", "a string", is_text)
    c.get(data, "arch", "arch", f"'{ARCH}'", lambda v: v == ARCH)
    c.get(data, "toolchain", "toolchain", "an object of tool -> release",
          lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()))
    _check_function(c, data, "")
    c.get(data, "dynamic_smem", "dynamic_smem", "a non-negative integer or null", nonneg_int, nullable=True)
    c.get(data, "dynamic_smem_expr", "dynamic_smem_expr", "a string", lambda v: isinstance(v, str))
    c.get(data, "opcodes", "opcodes", "an object of opcode -> count", counts)
    c.get(data, "groups", "groups", f"an object of group ({', '.join(GROUP_ORDER)}) -> count",
          lambda v: counts(v) and set(v) <= set(GROUP_ORDER))
    c.get(data, "tensor_shapes", "tensor_shapes", "an object of opcode -> count", counts)
    c.get(data, "setmaxnreg", "setmaxnreg", "an object of alloc/dealloc -> register counts",
          lambda v: isinstance(v, dict) and all(k in ("alloc", "dealloc") and isinstance(n, list)
                                                and all(nonneg_int(x) for x in n) for k, n in v.items()))
    loop = c.get(data, "loop", "loop", "an object or null", lambda v: isinstance(v, dict), nullable=True)
    if loop is not None:
        _check_loop(c, loop)
    others = c.get(data, "other_functions", "other_functions", "a list", lambda v: isinstance(v, list))
    for i, other in enumerate(others):
        _check_function(c, other, f"other_functions[{i}]")
    return data


# --- files -------------------------------------------------------------------------------------


def dumps(facts: dict) -> str:
    return files.dumps(facts)


def load(stage: lineage.Stage) -> dict | None:
    """The stage's facts (None when there are none). Facts of another schema version are returned
    unchecked, for ``problem`` to report; facts of this version are validated."""
    path = path_for(stage)
    if not path.is_file():
        return None
    data = files.read_json(path, FactsError)
    if isinstance(data, dict) and data.get("schema_version") != SCHEMA_VERSION:
        return data
    return validate(data, path)


def write(stage: lineage.Stage, facts: dict) -> bool:
    """Validate and write a stage's facts (atomically, only if changed); True if written."""
    path = path_for(stage)
    return files.write_if_changed(path, dumps(validate(facts, path)))


def problem(stage: lineage.Stage, facts: dict | None) -> str | None:
    """Why the facts cannot be trusted for the stage as it is now (None: they are current)."""
    if facts is None:
        return "missing"
    if facts.get("schema_version") != SCHEMA_VERSION:
        return "made by another version of the facts generator"
    if facts.get("source_hash") != stage.source_hash():
        return f"stale: made from sources {facts.get('source_hash')}, the stage is now {stage.source_hash()}"
    # source_hash leaves comments and whitespace out, but the facts show source lines (-lineinfo:
    # the main loop's span, a line per SASS instruction): an edit that moves lines, even a comment
    # alone, makes them stale; one within a line does not. `python -m hopattn.compiler` remakes
    # them (no GPU), from a library built afresh since the build cache keys on the bytes.
    if facts.get("source_lines_hash") != stage.source_lines_hash():
        return "stale: the sources' lines moved since the facts were made (their line numbers would be wrong)"
    if facts.get("nvcc_flags") != flags_text(stage):
        return "stale: made with other nvcc flags"
    return None
