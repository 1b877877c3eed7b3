"""Restamps committed records with the sources' token identity (hopattn.source_identity), where
their stamp is the byte hash of the sources as they are today.

    python -m hopattn.records.restamp           # rewrite the records that need it, say what changed
    python -m hopattn.records.restamp --check   # only say; exit 1 if a record would change

Records used to carry a hash of their sources' bytes; they now carry a hash of their tokens, so a
comment fix leaves them current. A record whose stamp equals today's byte hash was made from
sources that differ from today's in nothing at all: it gets today's token hash (and stays current).
Any other stamp is left as it is, so a record made from other sources stays stale, as it must.
Running it twice changes nothing the second time; it needs no GPU.

What it restamps, wherever it appears in a record: ``source_hash`` (a stage's: the benchmark
results' stage entries, the trace records, the compiler facts) and ``recorder_hash`` (the trace
recorder's, in trace records). A compiler facts file restamped also gets its ``source_lines_hash``
(its line numbers are those of today's sources, byte for byte).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .. import lineage
from . import files

REPO_ROOT = Path(__file__).resolve().parents[3]


class RestampError(ValueError):
    """A record cannot be read; the message names the file."""


@dataclass
class Stamps:
    """Today's byte hashes -> what replaces them."""

    stages: dict[str, lineage.Stage]  # byte hash -> the stage whose sources have it today
    recorder: dict[str, str] = field(default_factory=dict)  # byte hash -> token hash

    @classmethod
    def of(cls, stages: list[lineage.Stage]) -> "Stamps":
        return cls({s.source_bytes_hash(): s for s in stages},
                   {lineage.trace_recorder_bytes_hash(): lineage.trace_recorder_hash()})


def restamp(data, stamps: Stamps, facts: bool = False) -> int:
    """Restamp ``data`` (a parsed record) in place; returns how many stamps changed. ``facts``: the
    record is a compiler facts file (its source_lines_hash follows its source_hash)."""
    changed = 0
    if isinstance(data, dict):
        stage = stamps.stages.get(data.get("source_hash"))
        if stage is not None:
            data["source_hash"] = stage.source_hash()
            if facts:
                data["source_lines_hash"] = stage.source_lines_hash()
            changed += 1
        new = stamps.recorder.get(data.get("recorder_hash"))
        if new is not None:
            data["recorder_hash"] = new
            changed += 1
        for value in data.values():
            if isinstance(value, (dict, list)):
                changed += restamp(value, stamps, facts=False)
    elif isinstance(data, list):
        for item in data:
            changed += restamp(item, stamps, facts=False)
    return changed


def restamp_file(path: Path, stamps: Stamps, facts: bool = False, write: bool = True) -> int:
    """Restamp one record file (rewritten in the records' one JSON form only if something
    changed); returns how many stamps changed."""
    data = files.read_json(path, RestampError)
    changed = restamp(data, stamps, facts)
    if changed and write:
        files.write_atomic(path, files.dumps(data))
    return changed


def record_files(root: Path) -> list[tuple[Path, bool]]:
    """(path, is compiler facts) of every committed record under ``root`` that may carry a stamp:
    bench/results/*.json (results and model runs), bench/results/traces/<gpu>/*.json and
    kernels/compiler_facts/<lineage>/*.json."""
    root = Path(root)
    results = root / "bench" / "results"
    out = [(p, False) for p in sorted(results.glob("*.json"))]
    out += [(p, False) for p in sorted((results / "traces").glob("*/*.json"))]
    out += [(p, True) for p in sorted((root / "kernels" / "compiler_facts").glob("*/*.json"))]
    return out


def restamp_all(root: Path = REPO_ROOT, write: bool = True) -> dict[Path, int]:
    """Restamp every record under ``root`` against the lineage there (and the trace recorder that
    lineage.trace_recorder names, the one trace records are judged by); {path: stamps changed}."""
    root = Path(root)
    stamps = Stamps.of(lineage.discover(root / "kernels" / "attention"))
    return {path: restamp_file(path, stamps, facts, write) for path, facts in record_files(root)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hopattn.records.restamp", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a record would change")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    try:
        counts = restamp_all(args.root, write=not args.check)
    except (RestampError, lineage.SpecError) as err:
        print(err, file=sys.stderr)
        return 1
    root = args.root.resolve()
    for path, n in counts.items():
        if n:
            shown = path.resolve().relative_to(root) if path.resolve().is_relative_to(root) else path
            print(f"{'would restamp' if args.check else 'restamped'} {n:4d}  {shown}")
    total = sum(counts.values())
    print(f"{total} stamp(s) {'to change' if args.check else 'changed'} in {sum(1 for n in counts.values() if n)} "
          f"of {len(counts)} record file(s)")
    return 1 if args.check and total else 0


if __name__ == "__main__":
    sys.exit(main())
