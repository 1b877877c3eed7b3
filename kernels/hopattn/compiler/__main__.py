"""`python -m hopattn.compiler [STAGES] [--lineage forward|backward|rmsnorm|rmsnorm_backward|softmax|softmax_backward|cross_entropy|all] [--check] [--force] [--jobs N]`:
refresh the committed compiler facts (needs nvcc, cuobjdump and nvdisasm; no GPU).

Every lineage by default: the forward (kernels/attention), the backward (kernels/attention_backward,
Act V) and Part II's RMSNorm, RMSNorm backward, softmax, softmax backward and cross-entropy
(kernels/rmsnorm, kernels/rmsnorm_backward, kernels/softmax, kernels/softmax_backward,
kernels/cross_entropy; their stages typed by hopattn.rowwise, hopattn.rowwise_backward,
hopattn.softmax_lineage and hopattn.cross_entropy_lineage), each into
kernels/compiler_facts/<lineage>/. Stage numbers select within each lineage chosen (``1`` is the
forward's 01, the backward's 01 and RMSNorm's 01); a number no chosen lineage has is an error."""

from __future__ import annotations

import argparse
import sys
import time

from .. import build, cross_entropy_lineage, cuda_tools, lineage, rowwise, rowwise_backward, softmax_lineage
from ..records import compiler_facts as record
from . import facts

COMMAND = "python -m hopattn.compiler"
LINEAGES = {"forward": lineage.ATTENTION_DIR, "backward": lineage.BACKWARD_DIR, "rmsnorm": lineage.RMSNORM_DIR,
            "rmsnorm_backward": rowwise_backward.RMSNORM_BACKWARD_DIR, "softmax": softmax_lineage.SOFTMAX_DIR,
            "softmax_backward": softmax_lineage.SOFTMAX_BACKWARD_DIR, "cross_entropy": cross_entropy_lineage.CROSS_ENTROPY_DIR}
# Part II's lineages, each typed by the module that owns its spec (every stage a rowwise.RowStage)
ROWWISE = {"rmsnorm": rowwise.discover, "rmsnorm_backward": rowwise_backward.discover,
           "softmax": softmax_lineage.discover, "softmax_backward": softmax_lineage.discover,
           "cross_entropy": cross_entropy_lineage.discover}


def lineage_dirs(which: str) -> list:
    """The lineage folders ``--lineage`` names that exist (the backward may be absent in a copy)."""
    names = list(LINEAGES) if which == "all" else [which]
    return [LINEAGES[n] for n in names if LINEAGES[n].is_dir()]


def _discover(folder) -> list:
    """A lineage's stages, typed by the module that owns its spec (ROWWISE's for Part II)."""
    return ROWWISE[folder.name](folder) if folder.name in ROWWISE else lineage.discover(folder)


def choose(args: list[str], which: str = "all") -> list[lineage.Stage]:
    """The stages the arguments select, lineage by lineage (forward first). ValueError naming the
    number when no chosen lineage has it."""
    lineages = [_discover(d) for d in lineage_dirs(which)]
    if not args:
        return [s for stages in lineages for s in stages]
    wanted = set(lineage.parse_selection(" ".join(args), sorted({s.number for st in lineages for s in st})))
    return [s for stages in lineages for s in stages if s.number in wanted]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description="Refresh the committed compiler facts.")
    parser.add_argument("stages", nargs="*", help="stage numbers or ranges (1 3-5); default: all")
    parser.add_argument("--lineage", choices=("all", *LINEAGES), default="all",
                        help="the lineages: all (default), forward (kernels/attention), backward "
                             "(kernels/attention_backward), rmsnorm, rmsnorm_backward, softmax, "
                             "softmax_backward, cross_entropy (Part II: kernels/<name>)")
    parser.add_argument("--jobs", type=int, default=2, help="stages compiled at once (default 2)")
    parser.add_argument("--force", action="store_true", help="recompute even when the facts are current")
    parser.add_argument("--check", action="store_true", help="only report missing or stale facts")
    args = parser.parse_args(argv)
    try:
        stages = choose(args.stages, args.lineage)
    except ValueError as err:
        parser.error(str(err))
    if args.check:
        bad = [(facts.status_key(s), p) for s in stages if (p := record.problem(s, record.load(s)))]
        for name, p in bad:
            print(f"  {name}: {p}")
        print(f"{len(stages) - len(bad)} of {len(stages)} stage(s) have current compiler facts")
        return 1 if bad else 0
    start = time.perf_counter()
    folders = sorted({str(record.folder_for(s.dir.parent)) for s in stages})
    print(f"compiler facts of {len(stages)} stage(s) -> {', '.join(folders)}", flush=True)
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
