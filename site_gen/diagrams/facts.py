"""What the pictures need to know about a stage, derived from its spec (never per-stage cases).

Sources, in order of precedence: the optional ``[movement]`` and ``[diagram]`` tables of
stage.toml (typed: hopattn.lineage.Movement and Diagram, for what the required fields cannot
say), then the required fields (schedule engines, smem buffers and layouts, roles, arch), then the
words of the role tasks (e.g. "ldmatrix"). Free-form engine names are folded by engines.family.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import engines

ELEM = 2  # bf16 bytes
ACC = 4  # fp32 accumulator bytes
TENSORS = ("Q", "K", "V", "P", "O")


def buffer_tensor(buf) -> str | None:
    """Which tile a shared-memory buffer holds: Q, K, V, KV, P, O, or None (barriers, scratch)."""
    if buf.layout == "mbarrier":
        return None
    words = [w for w in re.split(r"[^a-z0-9]+", buf.name.lower()) if w]
    for w in words:  # "K tile", "smem_k", "sV", "kv_ring", "O staging"
        if w in ("smem", "tile", "buf", "buffer", "ring", "staging"):
            continue
        if w.startswith("s") and w[1:] in ("q", "k", "v", "kv", "p", "o"):
            w = w[1:]
        if w in ("q", "k", "v", "kv", "p", "o"):
            return w.upper()
    return None


def smem_of(stage, tensor: str):
    """The buffers holding a tile ("K" also finds a joint "KV" buffer)."""
    out = []
    for b in stage.smem:
        t = buffer_tensor(b)
        if t == tensor or (t == "KV" and tensor in ("K", "V")):
            out.append(b)
    return out


def barriers(stage):
    return [b for b in stage.smem if b.layout == "mbarrier"]


def text_of(stage) -> str:
    words = [op.engine for op in stage.schedule]
    for r in stage.roles:
        words.extend(r.tasks)
    return " ".join(words).lower()


def ops_of(stage, *kinds):
    return [op for op in stage.schedule if op.kind in kinds]


def role(stage, name):
    for r in stage.roles:
        if r.name == name:
            return r
    raise KeyError(name)


def mma_family(stage) -> str:
    fams = {engines.family(op.engine) for op in ops_of(stage, "qk", "pv")}
    return "wgmma" if "wgmma" in fams else "mma.sync"


def load_family(stage, tensor: str) -> str:
    """How K or V leaves global memory: the engine of its load op (or of a joint load_kv)."""
    kind = {"K": "load_k", "V": "load_v", "Q": "load_q"}[tensor]
    ops = ops_of(stage, kind) or ops_of(stage, "load_kv")
    if tensor in ("K", "V") and stage.movement.kv_load:
        return engines.family(stage.movement.kv_load)
    if tensor == "Q" and not ops_of(stage, "load_q"):
        if stage.movement.q_load:
            return engines.family(stage.movement.q_load)
        # Q is loaded once, like K when it has a buffer next to K, else straight into registers.
        if smem_of(stage, "Q"):
            k = ops_of(stage, "load_k") or ops_of(stage, "load_kv")
            return engines.family(k[0].engine) if k else "ld.global"
        return "ld.global"
    return engines.family(ops[0].engine) if ops else "ld.global"


def fragment_family(stage) -> str:
    """How operands in shared memory reach the tensor cores."""
    if stage.movement.kv_fragments:
        return engines.family(stage.movement.kv_fragments)
    if mma_family(stage) == "wgmma":
        return "wgmma-desc"
    if "ldmatrix" in text_of(stage):
        return "ldmatrix"
    return "ld.shared" if smem_of(stage, "K") else "ld.global"


def cluster(stage) -> int:
    n = stage.cluster
    if n == 1 and any(engines.multicast(op.engine) for op in stage.schedule):
        n = 2
    return int(n)


def p_in_smem(stage) -> bool:
    if stage.diagram.p_operand is not None:
        return stage.diagram.p_operand == "smem"
    return bool(smem_of(stage, "P"))


def o_path(stage) -> list[str]:
    """Mechanisms O takes from the accumulator registers to global memory."""
    if stage.movement.o_store:
        return [engines.family(x) for x in stage.movement.o_store]
    stores = ops_of(stage, "store_o")
    fam = engines.family(stores[0].engine) if stores else "st.global"
    if smem_of(stage, "O") or fam == "tma-store":
        first = "stmatrix" if stage.arch == "sm_90a" else "st.shared"
        return [first, "tma-store" if fam in ("tma", "tma-store") else "st.global"]
    return ["st.global"]


def persistent(stage) -> bool:
    """launch.grid = "num_sms": the timeline shows the next output tile starting."""
    return stage.persistent


def qk_roles(stage) -> list[str]:
    """Roles that run the QK GEMM (the consumers), in spec order without repeats."""
    out = []
    for op in ops_of(stage, "qk"):
        if op.role not in out:
            out.append(op.role)
    return out


def consumer_warps(stage) -> int:
    return sum(len(role(stage, r).warps) for r in qk_roles(stage))


@dataclass(frozen=True)
class Tiles:
    """Bytes of one tile of each operand, from block_m, block_n and head_dim."""

    q: int
    k: int
    v: int
    s: int  # fp32 scores
    p: int  # bf16 probabilities
    o_acc: int  # fp32 accumulator
    o: int  # bf16 output

    @staticmethod
    def of(stage) -> Tiles:
        m, n, d = stage.block_m, stage.block_n, stage.head_dim
        return Tiles(q=m * d * ELEM, k=n * d * ELEM, v=n * d * ELEM, s=m * n * ACC, p=m * n * ELEM,
                     o_acc=m * d * ACC, o=m * d * ELEM)


def gemm_flops(stage) -> int:
    """FLOP of one GEMM (QKᵀ or PV) for the whole CTA tile in one KV iteration."""
    return 2 * stage.block_m * stage.block_n * stage.head_dim


def rows_per_op(stage, kind: str) -> int:
    """Query rows one op of this kind covers: the CTA's rows split evenly among the ops."""
    n = len(ops_of(stage, kind)) or 1
    return stage.block_m // n


def loaders(stage, tensor: str) -> int:
    """How many times a K/V tile crosses from L2 per iteration per CTA.

    Without a shared-memory buffer every warp that runs the GEMM loads the whole tile itself;
    with one, the CTA loads it once; with a multicasting cluster, each CTA fetches 1/cluster of it.
    """
    if smem_of(stage, tensor):
        return 1
    kind = "load_k" if tensor == "K" else "load_v"
    ops = ops_of(stage, kind) or ops_of(stage, "load_kv")
    return len(role(stage, ops[0].role).warps) if ops else consumer_warps(stage)


def l2_bytes_per_iter(stage, tensor: str) -> int:
    t = Tiles.of(stage)
    tile = t.k if tensor == "K" else t.v
    if smem_of(stage, tensor):
        return tile // cluster(stage)
    return tile * loaders(stage, tensor)


def smem_read_per_iter(stage, tensor: str) -> int:
    """Bytes the GEMMs read from shared memory per iteration: each consumer warp (mma.sync) or
    warpgroup (wgmma) reads the whole tile."""
    t = Tiles.of(stage)
    tile = {"K": t.k, "V": t.v, "Q": t.q, "P": t.p}[tensor]
    if not smem_of(stage, tensor) and not (tensor == "P" and p_in_smem(stage)):
        return 0
    if tensor in ("Q", "P"):
        return tile  # each warp/warpgroup reads only its own rows
    readers = consumer_warps(stage)
    if mma_family(stage) == "wgmma":
        readers = max(1, readers // 4)
    return tile * readers
