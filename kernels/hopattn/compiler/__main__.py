"""`python -m hopattn.compiler [STAGES] [--check] [--force] [--jobs N]`: refresh the committed
compiler facts (needs nvcc, cuobjdump and nvdisasm; no GPU)."""

from __future__ import annotations

import argparse
import sys
import time

from .. import build, cuda_tools, lineage
from ..records import compiler_facts as record
from . import facts

COMMAND = "python -m hopattn.compiler"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description="Refresh the committed compiler facts.")
    parser.add_argument("stages", nargs="*", help="stage numbers or ranges (1 3-5); default: all")
    parser.add_argument("--jobs", type=int, default=2, help="stages compiled at once (default 2)")
    parser.add_argument("--force", action="store_true", help="recompute even when the facts are current")
    parser.add_argument("--check", action="store_true", help="only report missing or stale facts")
    args = parser.parse_args(argv)
    try:
        stages = lineage.select(lineage.discover(), args.stages)
    except ValueError as err:
        parser.error(str(err))
    if args.check:
        bad = [(s.name, p) for s in stages if (p := record.problem(s, record.load(s)))]
        for name, p in bad:
            print(f"  {name}: {p}")
        print(f"{len(stages) - len(bad)} of {len(stages)} stage(s) have current compiler facts")
        return 1 if bad else 0
    start = time.perf_counter()
    print(f"compiler facts of {len(stages)} stage(s) -> {record.folder_for(lineage.ATTENTION_DIR)}", flush=True)
    try:
        status = facts.refresh(stages, jobs=args.jobs, force=args.force, log=lambda m: print(m, flush=True))
    except (build.BuildError, cuda_tools.ToolError) as err:
        print(err, file=sys.stderr)
        return 1
    kept = sum(1 for v in status.values() if v == "kept")
    print(f"done in {time.perf_counter() - start:.1f} s ({kept} current, {len(status) - kept} recomputed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
