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


def layout(stage, label: str) -> Layout:
    rows, cols = SIZES[label]
    return Layout(label, cols, rows, stage.spec.config_for(cols, ELEMENT), stage.spec.row.vector_bytes)


def layouts(stage) -> list[Layout]:
    return [layout(stage, label) for label in LENGTHS]


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
