"""Progress lines while running and the summary table at the end."""

from __future__ import annotations

import sys
import time

from bench import peers
from bench.shapes import ALL_SHAPES


class Log:
    """Prints timestamped progress lines (seconds since start) and keeps them for the --raw file."""

    def __init__(self, stream=None, clock=time.monotonic):
        self.stream = stream if stream is not None else sys.stdout
        self.clock = clock
        self.start = clock()
        self.lines: list[str] = []

    def elapsed(self) -> float:
        return self.clock() - self.start

    def header(self, line: str) -> None:
        """A line without the timestamp: the log's first, the command that made it (runs.log_header)."""
        self.lines.append(line)
        print(line, file=self.stream, flush=True)

    def __call__(self, message: str) -> None:
        for part in str(message).splitlines() or [""]:
            line = f"[{self.elapsed():7.1f}s] {part}"
            self.lines.append(line)
            print(line, file=self.stream, flush=True)


def config_name(shape_name: str, causal: bool) -> str:
    return f"{shape_name} {'causal' if causal else 'non-causal'}"


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


COLUMNS = ("arm", "shape", "status", "TFLOP/s", "ms", "spread%", "vs fa3", "vs fa4", "vs cudnn", "rel err", "note")


def summary_rows(entries: list[dict]) -> list[tuple[str, ...]]:
    shape_order = {name: i for i, name in enumerate(ALL_SHAPES)}
    kind_order = {"stage": 0, "peer": 1}
    peer_order = {name: i for i, name in enumerate(peers.ORDER)}

    def key(e):
        return (e["causal"], shape_order.get(e["shape"], 9), e["shape"], kind_order[e["kind"]],
                peer_order.get(e["name"], 0), e["name"])

    rows = []
    for e in sorted(entries, key=key):
        ratios = e.get("ratios") or {}
        rows.append((
            f"stage {e['name']}" if e["kind"] == "stage" else e["name"],
            config_name(e["shape"], e["causal"]),
            e["status"],
            _num(e.get("tflops"), ".1f"),
            _num(e.get("median_ms"), ".4f"),
            _num(e.get("spread_pct"), ".2f"),
            _num(ratios.get("fa3"), ".3f"),
            _num(ratios.get("fa4"), ".3f"),
            _num(ratios.get("cudnn"), ".3f"),
            _num(e.get("rel_err"), ".2e"),
            (e.get("reason") or "")[:90],
        ))
    return rows


def summary_table(entries: list[dict]) -> str:
    """A plain-text table: one line per arm and shape, grouped by mask and shape."""
    rows = [COLUMNS, *summary_rows(entries)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    out = []
    for n, r in enumerate(rows):
        cells = [r[i].ljust(widths[i]) if i < 3 else r[i].rjust(widths[i]) for i in range(len(widths))]
        out.append(("  ".join(cells) + "  " + r[-1]).rstrip())
        if n == 0:
            out.append("-" * len(out[0]))
    return "\n".join(out)
