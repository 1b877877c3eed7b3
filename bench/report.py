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


def _table(columns: tuple[str, ...], body: list[tuple[str, ...]]) -> str:
    rows = [columns, *body]
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns) - 1)]
    out = []
    for n, r in enumerate(rows):
        cells = [r[i].ljust(widths[i]) if i < 3 else r[i].rjust(widths[i]) for i in range(len(widths))]
        out.append(("  ".join(cells) + "  " + r[-1]).rstrip())
        if n == 0:
            out.append("-" * len(out[0]))
    return "\n".join(out)


def summary_table(entries: list[dict]) -> str:
    """A plain-text table: one line per arm and shape, grouped by mask and shape."""
    return _table(COLUMNS, summary_rows(entries))


BACKWARD_COLUMNS = ("arm", "shape", "status", "TFLOP/s", "ms", "spread%", "vs fa4", "vs cudnn", "vs fa2",
                    "vs default", "dq err", "dk err", "dv err", "note")


def backward_summary_rows(entries: list[dict]) -> list[tuple[str, ...]]:
    """The backward section's entries: stages (each default mode, then its deterministic one), then peers."""
    from bench import backward

    shape_order = {name: i for i, name in enumerate(ALL_SHAPES)}
    kind_order = {"stage": 0, "peer": 1}
    peer_order = {name: i for i, name in enumerate(backward.ORDER)}

    def key(e):
        return (e["causal"], shape_order.get(e["shape"], 9), e["shape"], kind_order[e["kind"]],
                peer_order.get(e["name"], 0), e["name"], e["deterministic"])

    rows = []
    for e in sorted(entries, key=key):
        ratios, errs = e.get("ratios") or {}, e.get("rel_errs") or {}
        arm = f"stage {e['name']}" + (" det" if e["deterministic"] else "") if e["kind"] == "stage" else e["name"]
        rows.append((
            arm, config_name(e["shape"], e["causal"]), e["status"],
            _num(e.get("tflops"), ".1f"), _num(e.get("median_ms"), ".4f"), _num(e.get("spread_pct"), ".2f"),
            _num(ratios.get("fa4"), ".3f"), _num(ratios.get("cudnn"), ".3f"), _num(ratios.get("fa2"), ".3f"),
            _num(e.get("vs_default"), ".3f"),
            _num(errs.get("dq"), ".2e"), _num(errs.get("dk"), ".2e"), _num(errs.get("dv"), ".2e"),
            (e.get("reason") or "")[:90],
        ))
    return rows


def backward_summary_table(entries: list[dict]) -> str:
    """The backward's plain-text table: one line per arm (a deterministic mode its own), mode and shape;
    'vs default': a deterministic mode's speed over its stage's default mode, in the same run."""
    return _table(BACKWARD_COLUMNS, backward_summary_rows(entries))
