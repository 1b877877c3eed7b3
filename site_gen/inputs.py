"""Everything the site is made from, read and validated before anything is rendered: the lineages
(kernels/attention, the backward's kernels/attention_backward and Part II's kernels/rmsnorm where
they exist), the benchmark results (bench/results, and Part II's bench/results/rmsnorm), the per-warp
trace records (bench/results/traces/<gpu>/, the backward's in its backward/ folder) and the compiler
facts (kernels/compiler_facts). Bad
input fails here, naming the file and the field, and the previous site stays as it was.

The backward's stages are kept apart from the forward's (``backward``, ``backward_hashes``,
``backward_facts``): the two lineages number their stages alike (both have a 01-baseline), so
nothing keyed by a stage's id or name mixes them (nor do their traces, ``backward_traces``); so are Part II's (``rmsnorm``, typed by
hopattn.rowwise, with its own hashes, facts and results), and Part II's other lineages' (``part_ii``:
the RMSNorm backward's, the softmax's and the softmax backward's stages by lineage folder, with their
facts in ``part_ii_facts`` and their records, bench/results/<folder>, in ``part_ii_results``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hopattn import cross_entropy_lineage, lineage, rowwise, rowwise_backward, softmax_lineage
from hopattn.records import compiler_facts, results, traces
from hopattn.records import rowwise as rowwise_results


@dataclass(frozen=True)
class Inputs:
    root: Path
    stages: list[lineage.Stage]
    hashes: dict[str, str]  # stage id -> its source hash now
    results: list[results.GpuResults]  # the GPU with the most measured stages first
    facts: dict[str, tuple[dict | None, str | None]]  # stage name -> (usable facts or None, problem or None)
    # GPU slug -> {(stage id, causal, head dim): record}
    traces: dict[str, dict[tuple[str, bool, int], dict]] = field(default_factory=dict)
    backward: list[lineage.Stage] = field(default_factory=list)  # Act V: kernels/attention_backward
    backward_hashes: dict[str, str] = field(default_factory=dict)  # backward stage id -> its source hash now
    backward_facts: dict[str, tuple[dict | None, str | None]] = field(default_factory=dict)  # by stage name
    rmsnorm: list[rowwise.RowStage] = field(default_factory=list)  # Part II: kernels/rmsnorm
    rmsnorm_hashes: dict[str, str] = field(default_factory=dict)  # RMSNorm stage id -> its source hash now
    rmsnorm_facts: dict[str, tuple[dict | None, str | None]] = field(default_factory=dict)  # by stage name
    rmsnorm_results: list[rowwise_results.RowResults] = field(default_factory=list)  # bench/results/rmsnorm
    backward_traces: dict[str, dict[tuple[str, bool, int], dict]] = field(default_factory=dict)  # the backward's
    # Part II's other lineages, by folder (rmsnorm_backward, softmax, softmax_backward, cross_entropy), and their
    # facts by stage name
    part_ii: dict[str, list[rowwise.RowStage]] = field(default_factory=dict)
    part_ii_facts: dict[str, dict[str, tuple[dict | None, str | None]]] = field(default_factory=dict)
    part_ii_results: dict[str, list[rowwise_results.RowResults]] = field(default_factory=dict)  # bench/results/<folder>

    @property
    def trace_gpu(self) -> str | None:
        """The GPU whose traces the pages draw: the main results' GPU when it has any, else the first."""
        if self.results and self.results[0].gpu in self.traces:
            return self.results[0].gpu
        return next(iter(sorted(self.traces)), None)

    def trace(self, stage: lineage.Stage, causal: bool, head_dim: int | None = None) -> dict | None:
        """The stage's trace record on the trace GPU at ``head_dim`` (default: the one its figures draw;
        None: not recorded); a backward stage's from the backward's records."""
        found = self.backward_traces if getattr(stage, "backward", False) else self.traces
        return found.get(self.trace_gpu, {}).get((stage.id, causal, head_dim or stage.head_dim))

    def other_head_dims(self, stage: lineage.Stage) -> list[int]:
        """The head dims besides the one its figures draw at which the stage has a trace (stage 24's)."""
        found = self.traces.get(self.trace_gpu, {})
        return sorted({d for sid, _, d in found if sid == stage.id and d != stage.head_dim})

    def facts_of(self, stage: lineage.Stage) -> tuple[dict | None, str | None]:
        if isinstance(stage, rowwise.RowStage):
            if stage.lineage in self.part_ii_facts:
                return self.part_ii_facts[stage.lineage][stage.name]
            return self.rmsnorm_facts[stage.name]
        return (self.backward_facts if stage.backward else self.facts)[stage.name]

    def stale_facts(self) -> list[str]:
        """'NN-slug: why' for every stage whose compiler facts are missing or stale (the backward's
        as 'backward NN-slug: why')."""
        return ([f"{name}: {problem}" for name, (_, problem) in self.facts.items() if problem]
                + [f"backward {name}: {problem}" for name, (_, problem) in self.backward_facts.items() if problem]
                + [f"rmsnorm {name}: {problem}" for name, (_, problem) in self.rmsnorm_facts.items() if problem]
                + [f"{folder} {name}: {problem}" for folder, found in self.part_ii_facts.items()
                   for name, (_, problem) in found.items() if problem])


def _facts(stage: lineage.Stage) -> tuple[dict | None, str | None]:
    facts = compiler_facts.load(stage)
    problem = compiler_facts.problem(stage, facts)
    if facts is not None and facts.get("schema_version") != compiler_facts.SCHEMA_VERSION:
        return None, problem  # another format: nothing in it can be shown
    return facts, problem


def _traces(folder: Path, backward: bool = False) -> dict[str, dict[tuple[str, bool, int], dict]]:
    """Every GPU's trace records (a bad record fails the build, naming the file and the field);
    ``backward``: its backward stages', where it has any."""
    if not folder.is_dir():
        return {}
    return {gpu.name: traces.load_all(gpu, backward) for gpu in sorted(folder.iterdir()) if gpu.is_dir()
            if not backward or traces.backward_folder(gpu).is_dir()}


# Part II's other lineages: kernels/<folder> and the module that discovers its stages
PART_II = (("rmsnorm_backward", rowwise_backward.discover), ("softmax", softmax_lineage.discover),
           ("softmax_backward", softmax_lineage.discover), ("cross_entropy", cross_entropy_lineage.discover))
# where a lineage's benchmark record lies, bench/results/<this>/, where it is not its folder's name: the
# cross-entropy's pages show its fused forward (loss, lse and dlogits in one launch)
RESULTS = {"cross_entropy": "cross_entropy_fused"}


def load(root: Path) -> Inputs:
    root = Path(root).resolve()
    stages = lineage.discover(root / "kernels" / "attention")
    folder = root / "kernels" / lineage.BACKWARD_DIR.name
    backward = lineage.discover(folder) if folder.is_dir() else []
    folder = root / "kernels" / lineage.RMSNORM_DIR.name
    rmsnorm = rowwise.discover(folder) if folder.is_dir() else []
    part_ii = {name: discover(root / "kernels" / name) for name, discover in PART_II
               if (root / "kernels" / name).is_dir()}
    return Inputs(root=root, stages=stages, hashes={s.id: s.source_hash() for s in stages},
                  results=results.load_indexed(root / "bench" / "results"),
                  facts={s.name: _facts(s) for s in stages},
                  traces=_traces(root / "bench" / "results" / "traces"),
                  backward_traces=_traces(root / "bench" / "results" / "traces", backward=True),
                  backward=backward, backward_hashes={s.id: s.source_hash() for s in backward},
                  backward_facts={s.name: _facts(s) for s in backward},
                  rmsnorm=rmsnorm, rmsnorm_hashes={s.id: s.source_hash() for s in rmsnorm},
                  rmsnorm_facts={s.name: _facts(s) for s in rmsnorm},
                  rmsnorm_results=rowwise_results.load_all(root / "bench" / "results" / "rmsnorm") if rmsnorm else [],
                  part_ii=part_ii,
                  part_ii_facts={name: {s.name: _facts(s) for s in found} for name, found in part_ii.items()},
                  part_ii_results={name: rowwise_results.load_all(root / "bench" / "results" / RESULTS.get(name, name))
                                   for name in part_ii})
