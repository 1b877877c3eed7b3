"""What the Part II figures draw, computed from a rowwise stage's spec alone (hopattn.rowwise): for a
row of a given length, the launch configuration that runs it ([[config]], the launcher's order) and
from it who holds which bytes (a thread, a warp, a CTA, a cluster), the levels of the sum of squares,
and the bytes each element costs. No number here is measured: they are the stage's own."""

from __future__ import annotations

from dataclasses import dataclass

from hopattn.records.rowwise import SIZES
from hopattn.rowwise import VECTOR_BYTES, Config

ELEMENT = 2  # bf16: the figures' dtype (the benchmark's)
LENGTHS = ("4k", "16k", "64k", "256k")  # the row lengths the figures draw (of the benchmark's SIZES)
# A lineage whose benchmark runs other lengths: its own, and its rows at each (bench.rowwise_cross_entropy's
# SIZES, the fused record's: tests/test_part_ii_figures.py checks they agree).
LENGTHS_OF = {"cross_entropy": ("4k", "32k", "128k", "256k")}
SIZES_OF = {"cross_entropy": {"4k": (16384, 4096), "32k": (2048, 32768), "128k": (512, 131072),
                              "256k": (256, 262144)}}
# Per element, with a weight: the square and its sum (one FMA, 2 FLOP), then x · rstd · weight (2).
FLOPS_PER_ELEMENT = 4
LEVEL_NAMES = {"thread": "in a thread (registers)", "warp": "across a warp (shuffles)",
               "cta": "across a CTA (shared memory)", "cluster": "across a cluster (distributed shared memory)"}


@dataclass(frozen=True)
class Layout:
    """A row of ``cols`` bf16 elements as the stage runs it."""

    label: str  # "4k"
    cols: int
    rows: int  # rows of the benchmark's shape at this length (bench/results' SIZES)
    config: Config
    stream_bytes: int  # bytes a streamed access moves (row.vector_bytes); held rows move 16

    @property
    def row_bytes(self) -> int:
        return self.cols * ELEMENT

    @property
    def held(self) -> bool:
        return bool(self.config.vectors)

    @property
    def access_bytes(self) -> int:
        return VECTOR_BYTES if self.held else self.stream_bytes

    @property
    def threads(self) -> int:
        """Threads that share one row (across the cluster's CTAs)."""
        return self.config.threads_per_row * self.config.cluster

    @property
    def thread_bytes(self) -> int:
        """Bytes of the row one thread loads (and, held, keeps): its share, rounded up to whole accesses."""
        accesses = -(-self.row_bytes // (self.threads * self.access_bytes))
        return accesses * self.access_bytes

    @property
    def thread_accesses(self) -> int:
        return self.thread_bytes // self.access_bytes

    @property
    def thread_elements(self) -> int:
        return self.thread_bytes // ELEMENT

    @property
    def registers(self) -> int:
        """32-bit registers of row a thread holds (0: streamed)."""
        return self.config.vectors * VECTOR_BYTES // 4 if self.held else 0

    @property
    def in_flight(self) -> int:
        """Bytes of the row one thread has in flight: all it holds, or its unrolled loads."""
        return self.thread_bytes if self.held else self.config.unroll * self.access_bytes

    @property
    def warp_bytes(self) -> int:
        """Bytes of the row a warp holds (a row-per-thread warp: 32 rows' worth, one a lane)."""
        if self.config.threads_per_row == 1:
            return 32 * self.row_bytes
        return 32 * self.thread_bytes

    @property
    def cta_bytes(self) -> int:
        """Bytes a CTA holds: its slice of one row, times the rows it holds."""
        return self.row_bytes // self.config.cluster * self.config.rows_per_cta

    @property
    def ctas(self) -> int:
        """CTAs of the grid at the benchmark's shape."""
        return -(-self.rows // self.config.rows_per_cta) * self.config.cluster

    @property
    def reads(self) -> int:
        return self.config.reads

    @property
    def levels(self) -> tuple[str, ...]:
        return self.config.levels


STATS = "statistics (m, s, Σ x)"  # the cross-entropy's: a RowStats record (m, s, Σ x, the target's logit)


@dataclass(frozen=True)
class Op:
    """What a lineage's figures say of its rows: what they read and write, what the reduction carries,
    and its FLOP per element (the words; the numbers are the stage's spec)."""

    label: str  # "RMSNorm", how titles name the lineage
    prefix: str  # the figures' ids: "r" + stage id (unique across the site)
    reads: tuple[str, ...]  # the arrays a row is read from: ("x",), ("x", "dy")
    writes: str  # the array written: "out", "y", "dx"
    payload: str  # what the reduction carries: "sum of squares", "dot", "(max, sum) pair"
    unit: str  # one of it: "sum", "dot", "pair"
    flops: int  # FLOP per element
    flops_text: str  # how they are counted
    walks: dict  # passes -> what each walk over the row is for
    output: str  # the sentence below the reduction tree: what the one reduced value gives every thread
    uncounted: str  # the caption's sentence on what GB/s leaves out ("" : nothing)
    again: tuple = ()  # (kernel, where a streamed configuration's later walks read from), where not L1/L2

    @property
    def arrays(self) -> int:
        return len(self.reads)

    @property
    def streams(self) -> int:
        """Streams of ELEMENT bytes an element that GB/s counts: each array read once, the output written once."""
        return self.arrays + 1

    @property
    def inputs(self) -> str:
        return " and ".join(self.reads)


OPS = {
    "rmsnorm": Op("RMSNorm", "r", ("x",), "out", "sum of squares", "sum", FLOPS_PER_ELEMENT,
                  "x², its sum, · rstd, · weight", {1: ("the sum and the output",), 2: ("the sum", "the output")},
                  "", "The weight (the same for every row) is read from L2 and not counted."),
    "rmsnorm_backward": Op(
        "RMSNorm backward", "rb", ("x", "dy"), "dx", "dot", "dot", 9,
        "counted: w · dy 1, the dot's fmaf 2, x̂ = x · rstd 1, dx 3, dw's fmaf 2",
        {1: ("the dot, dx and dw",), 2: ("the dot", "dx and dw"), 3: ("the dot", "dx", "dw, down the columns")},
        "Then every thread that writes dx takes m = rstd · (Σ + drstd) / cols from the same dot, added in the same "
        "order in every thread and on every run: dx = rstd · (w · dy − x̂ · m).",
        "The weight, rstd and dw's fp32 partial rows are not counted.",
        (("rmsnorm_bwd_row_per_thread", "dx's walk from L1 or L2 if the row is still there; dw's kernel reads them "
          "again from HBM"),
         ("rmsnorm_bwd_row_dots", "the tile kernel's walk from HBM: it runs after the whole grid's dots"))),
    "softmax": Op(
        "Softmax", "sm", ("x",), "y", "(max, sum) pair", "pair", 5,
        "counted: the max, x − m, exp2 (as one), the sum, · 1/s",
        {1: ("the pair and the output",), 2: ("the (max, sum) pair", "the output"),
         3: ("the max", "the sum", "the output")},
        "Then every thread that writes the row takes y = exp(x − m) / s from the same (m, s), merged in the same "
        "order in every thread and on every run.", ""),
    "softmax_backward": Op(
        "Softmax backward", "sb", ("y", "dy"), "dx", "dot", "dot", 4,
        "counted: the dot's fmaf 2, dy − d 1, · y 1", {1: ("the dot and dx",), 2: ("the dot", "dx")},
        "Then every thread that writes the row takes dx = y · (dy − d) from the same dot d = Σ y · dy, added in "
        "the same order in every thread and on every run.", ""),
    "cross_entropy": Op(
        "Cross-entropy", "ce", ("logits",), "dlogits", STATS, "record", 10,
        "counted: the max, x − m, exp2 (as one), the sum, Σ x; for dlogits x − m, exp2, · 1/s, − ε/V, · g",
        {1: ("the statistics, the loss and dlogits",), 2: ("the statistics and the loss", "dlogits"),
         3: ("the max", "the sums and the loss", "dlogits")},
        "Then thread 0 writes loss = log s + (1 − ε)(m − x[t]) + ε (m − Σ x / V) and lse, and every thread that "
        "writes dlogits takes g · (exp(x − m) / s − (1 − ε)[c = t] − ε / V) from the same (m, s), merged in the "
        "same order in every thread and on every run.",
        "A row's target is read and its loss and lse written beside (16 B a row, which GB/s counts too: under "
        "0.01 B an element at 4k)."),
}


def op(stage) -> Op:
    return OPS[stage.lineage]


def payload(stage, config: Config) -> str:
    """What this configuration's reduction carries: the op's, or the max and then the sum (the softmax's,
    the cross-entropy's)."""
    reduce = getattr(config, "payload", None)
    return "max, then sum" if reduce == "max, then sum" else op(stage).payload


def persistent(stage, config: Config) -> bool:
    """Whether the grid is persistent for this configuration (the RMSNorm backward's held rows)."""
    wg = getattr(stage.spec, "weight_grad", None)
    return bool(wg is not None and wg.persistent and config.vectors)


def lengths(stage) -> tuple[str, ...]:
    """The row lengths the figures draw for this stage: its lineage's benchmark's."""
    return LENGTHS_OF.get(stage.lineage, LENGTHS)


def lengths_text(stage) -> str:
    """'4k, 16k, 64k and 256k'."""
    *head, last = lengths(stage)
    return f"{', '.join(head)} and {last}"


def layout(stage, label: str) -> Layout:
    rows, cols = SIZES_OF.get(stage.lineage, SIZES)[label]
    return Layout(label, cols, rows, stage.spec.config_for(cols, ELEMENT), stage.spec.row.vector_bytes)


def layouts(stage) -> list[Layout]:
    return [layout(stage, label) for label in lengths(stage)]


def deepest(stage) -> Layout:
    """The length whose reduction passes the most levels (of equals, a held row, then the longest):
    the tree the reduction figure draws."""
    return max(layouts(stage), key=lambda lay: (len(lay.levels), lay.held, lay.cols))


def config_label(config: Config) -> str:
    """'64 threads × 8 vectors, 4 rows a CTA', 'a warp a row, 8 rows a CTA', 'a cluster of 4 CTAs × 1024 threads'."""
    tpr = config.threads_per_row
    if tpr == 1:
        who = "a thread a row"
    elif tpr == 32:
        who = "a warp a row"
    elif config.cluster > 1:
        who = f"a cluster of {config.cluster} CTAs × {tpr} threads a row"
    else:
        who = f"{tpr} threads a row"
    held = f", {config.vectors} × 16 B held a thread" if config.vectors else ", streamed"
    rows = f", {config.rows_per_cta} rows a CTA" if config.rows_per_cta > 1 else ""
    return who + held + rows


def fmt(n: int) -> str:
    """Bytes as the figures write them: 16 B, 4 KiB, 512 KiB, 2 MiB."""
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10} KiB"
    if n >= 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n} B"
