"""The generator: lineage + records -> every generated page, asset and HTML fragment, in memory.

The inputs are loaded and validated first (inputs.py); then every page is rendered; MkDocs gets
the result through the hook (File.generated), so nothing is written into docs/ and read back. A
section that raises stops the build with an error naming the stage, the file the section is drawn
from, and the line of the generator that failed.
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from hopattn import lineage
from hopattn import rowwise as rowwise_spec
from hopattn.records import models as model_records

from . import fragments, inputs, models_page
from .benchmark_section import backward as backward_numbers
from .benchmark_section import chart, headline, model_vs_measured, tables
from .benchmark_section import rowwise as rowwise_numbers
from .benchmark_section import section as benchmark
from .cache import DiskCache
from .compiler_section import overview as compiler_overview
from .compiler_section import rowwise as rowwise_compiler
from .compiler_section import section as compiler
from .diagrams import Diagram, concept_diagrams, diagram, doc_diagrams, stage_diagrams, structure, timeline_section
from .diagrams import section as diagrams
from .diagrams.backward import backward_diagrams
from .diagrams.rowwise import rowwise_diagrams
from .diff_section import section as diff
from .html import figure
from .pages import backward, docs_figures, gallery, overview, part_ii, rowwise, stage

CHART = "assets/generated/progression.svg"
BACKWARD_CHART = "assets/generated/progression-backward.svg"
RMSNORM_CHART = "assets/generated/progression-rmsnorm.svg"
DIFFS = "assets/generated/diffs"  # each stage's diff, loaded by its page (site_gen/fragments.py)
PACKAGE = Path(__file__).resolve().parent


class SectionError(RuntimeError):
    """A part of the site failed to render; the message names the stage, its file and the code."""


@dataclass
class Site:
    """What the generator hands to MkDocs: pages (Markdown), assets (SVG) and the HTML fragments
    spliced into built pages, each keyed by its path under docs/ (fragments by name)."""

    pages: dict[str, str] = field(default_factory=dict)
    assets: dict[str, str] = field(default_factory=dict)
    fragments: dict[str, str] = field(default_factory=dict)
    later: dict[str, tuple[str, str]] = field(default_factory=dict)  # fragment -> (its file's URL, what)

    def add_asset(self, path: str, text: str) -> None:
        self.assets[path] = text

    def add_fragment(self, name: str, html: str, file: tuple[str, int, str] | None = None) -> str:
        """Keep ``html`` out of the Markdown; returns the placeholder line that stands for it.
        ``file``: (asset path, the page's depth below the docs root, what it is): the fragment is
        written there and the built page loads it (fragments.deferred) instead of carrying it."""
        self.fragments[name] = html
        if file is not None:
            path, depth, what = file
            self.add_asset(path, '<meta charset="utf-8">\n' + html + "\n")
            self.later[name] = ("../" * depth + path, what)
        return fragments.placeholder(name) + "\n"


def _where(err: BaseException) -> str:
    """The innermost line of this package that the error passed through, e.g. diagrams/memory.py:120."""
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        path = Path(frame.filename).resolve()
        if PACKAGE in path.parents:
            return f"site_gen/{path.relative_to(PACKAGE).as_posix()}:{frame.lineno} in {frame.name}"
    return "site_gen"


@contextmanager
def naming(what: str, source: Path, root: Path):
    """Turn any failure inside into a SectionError that names ``what`` failed and ``source`` (the
    file it is drawn from, shown relative to the repository)."""
    try:
        yield
    except Exception as err:
        shown = os.path.relpath(source, root) if Path(source).is_absolute() else source
        raise SectionError(f"{shown}: {what} failed: {type(err).__name__}: {err} ({_where(err)})") from err


def render(inp: inputs.Inputs, cache: DiskCache) -> Site:
    """Every generated file of the site from validated inputs; nothing is written."""
    site = Site()
    stages, root = inp.stages, inp.root
    drawn: dict = {}  # stage number -> (stage, its diagrams), for "unchanged since" and the gallery
    measured: dict = {}  # stage number -> its measured timeline (the trace its page opens on), for the gallery
    specs = [[st.name, st.spec_path.read_text()] for st in stages]  # all the diagrams are drawn from
    for i, s in enumerate(stages):
        prev = stages[i - 1] if i else None
        nxt = stages[i + 1] if i + 1 < len(stages) else None
        with naming(f"the diagrams of stage {s.name}", s.spec_path, root):
            mine = _diagrams(s, stages, specs, cache)
            drawn[s.number] = (s, mine)
            lead = stage.lead_for(s, mine)
            # the timeline part is the measured one (below); the model's own window is the gallery's for a
            # stage without a trace
            parts = diagrams.stage_parts(s, [d for d in mine if d.kind != "timeline"], drawn, lead, site)
            lead_md = diagrams.lead_figure(mine, lead, site)
        with naming(f"the timeline of stage {s.name}", root / "bench" / "results" / "traces", root):
            parts["timeline"] = timeline_section.stage_section(s, prev, inp, site, cache,  # measured + model
                                                               keep=measured)
        with naming(f"the diff of stage {s.name}", s.kernel_path, root):
            diff_md = site.add_fragment(f"diff-{s.name}", diff.diff_section(s, prev, cache),
                                        file=(f"{DIFFS}/{s.name}.html", 2, "the diff"))
        with naming(f"the compiler section of stage {s.name}", s.kernel_path, root):
            compiler_md = compiler.compiler_section(s, prev, inp.facts_of)
        with naming(f"the benchmark section of stage {s.name}", root / "bench" / "results", root):
            benchmark_md = benchmark.stage_section(s, prev, inp.hashes, inp.results)
            cards = headline.headline(s, prev, inp.hashes, inp.results)
            headline_md = site.add_fragment(f"headline-{s.name}", cards) if cards else ""
        with naming(f"the page of stage {s.name}", s.notes_path, root):
            site.pages[f"stages/{s.name}.md"] = stage.stage_page(
                s, prev, nxt, diff_html=diff_md, diagram_parts=parts, compiler_md=compiler_md,
                benchmark_md=benchmark_md, headline_md=headline_md, lead_md=lead_md)

    backward_drawn = _render_backward(inp, site, cache)
    rmsnorm_drawn = _render_rmsnorm(inp, site, cache)
    _render_part_ii(inp, site, cache)

    with naming("the overview", root / "bench" / "results", root):
        site.pages["index.md"] = _overview(inp, site, cache)
    with naming("the figures of the hand-written pages", root / "docs", root):
        docs = _doc_diagrams(stages, specs, cache)
        everything = {d.id: d for _s, mine in drawn.values() for d in mine} | {d.id: d for d in docs}
        everything |= {d.id: d for _s, mine in backward_drawn.values() for d in mine}
        everything |= {d.id: d for _s, mine in rmsnorm_drawn.values() for d in mine}
        docs_figures.add([everything[i] for i in docs_figures.referenced(root / "docs") if i in everything], site)
    with naming("the gallery", root / "docs", root):
        site.pages["gallery.md"] = gallery.gallery_page(stages, drawn, site, docs, root / "docs", measured=measured)
    with naming("the page of the models", root / "bench" / "results", root):
        site.pages["models.md"] = models_page.render(model_records.load_all(root / "bench" / "results"))
    return site


def _render_backward(inp: inputs.Inputs, site: Site, cache: DiskCache) -> dict:
    """Act V: a page per backward stage (backward/NN-slug.md), of the forward's form; returns
    {stage number: (stage, its diagrams)}."""
    stages, root = inp.backward, inp.root
    drawn: dict = {}
    specs = [[st.name, st.spec_path.read_text()] for st in stages]
    for i, s in enumerate(stages):
        prev = stages[i - 1] if i else None
        nxt = stages[i + 1] if i + 1 < len(stages) else None
        with naming(f"the diagrams of backward stage {s.name}", s.spec_path, root):
            mine = _backward_diagrams(s, stages, specs, cache)
            drawn[s.number] = (s, mine)
            lead = backward.lead_for(s, mine)
            parts = backward.diagram_parts(s, mine, drawn, lead, site, inp=inp, cache=cache, prev=prev)
            lead_md = backward.lead_figure(mine, lead, site)
        with naming(f"the diff of backward stage {s.name}", s.kernel_path, root):
            diff_md = site.add_fragment(f"diff-backward-{s.name}", diff.diff_section(s, prev, cache),
                                        file=(f"{DIFFS}/backward-{s.name}.html", 2, "the diff"))
        with naming(f"the compiler section of backward stage {s.name}", s.kernel_path, root):
            compiler_md = compiler.compiler_section(s, prev, inp.facts_of, name=backward.stage_name)
            compiler_md += backward.atomics_note(s, inp.facts_of(s)[0])
        with naming(f"the benchmark section of backward stage {s.name}", root / "bench" / "results", root):
            benchmark_md = backward_numbers.stage_section(s, prev, inp.backward_hashes, inp.results)
            cards = backward_numbers.headline(s, prev, inp.backward_hashes, inp.results)
            headline_md = site.add_fragment(f"headline-backward-{s.name}", cards) if cards else ""
        with naming(f"the page of backward stage {s.name}", s.notes_path, root):
            site.pages[backward.page_path(s)] = backward.backward_page(
                s, prev, nxt, diff_html=diff_md, diagram_parts=parts, compiler_md=compiler_md,
                benchmark_md=benchmark_md, headline_md=headline_md, lead_md=lead_md)
    return drawn


def _render_rmsnorm(inp: inputs.Inputs, site: Site, cache: DiskCache) -> dict:
    """Part II: a page per RMSNorm stage (rmsnorm/NN-slug.md) and the part's overview (rmsnorm/index.md),
    of the attention stages' form; returns {stage number: (stage, its diagrams)}."""
    stages, root = inp.rmsnorm, inp.root
    drawn: dict = {}
    if not stages:
        return drawn
    specs = [[st.name, st.spec_path.read_text()] for st in stages]
    where = root / "bench" / "results" / "rmsnorm"
    for i, s in enumerate(stages):
        prev = stages[i - 1] if i else None
        nxt = stages[i + 1] if i + 1 < len(stages) else None
        with naming(f"the diagrams of RMSNorm stage {s.name}", s.spec_path, root):
            mine = _rowwise_diagrams(s, stages, specs, cache)
            drawn[s.number] = (s, mine)
            lead = rowwise.lead_for(s, mine)
            parts = rowwise.diagram_parts(s, mine, drawn, lead, site)
            lead_md = rowwise.lead_figure(mine, lead, site)
        with naming(f"the diff of RMSNorm stage {s.name}", s.kernel_path, root):
            diff_md = site.add_fragment(f"diff-rmsnorm-{s.name}", diff.diff_section(s, prev, cache),
                                        file=(f"{DIFFS}/rmsnorm-{s.name}.html", 2, "the diff"))
        with naming(f"the compiler section of RMSNorm stage {s.name}", s.kernel_path, root):
            facts, _problem = inp.facts_of(s)
            compiler_md = compiler.compiler_section(s, prev, inp.facts_of, name=rowwise.stage_name, memory_bound=True)
            compiler_md += "\n" + rowwise_compiler.instances_section(s, facts)
        with naming(f"the benchmark section of RMSNorm stage {s.name}", where, root):
            benchmark_md = rowwise_numbers.stage_section(s, prev, inp.rmsnorm_hashes[s.id], inp.rmsnorm_results)
            headline_md = site.add_fragment(f"headline-rmsnorm-{s.name}", rowwise_numbers.headline(
                s, inp.rmsnorm_hashes[s.id], inp.rmsnorm_results))
        with naming(f"the page of RMSNorm stage {s.name}", s.notes_path, root):
            site.pages[rowwise.page_path(s)] = rowwise.stage_page(
                s, prev, nxt, diff_html=diff_md, diagram_parts=parts, compiler_md=compiler_md,
                benchmark_md=benchmark_md, headline_md=headline_md, lead_md=lead_md)
    with naming("the overview of Part II", where, root):
        site.pages[f"{rowwise.FOLDER}/index.md"] = _rmsnorm_overview(inp, site)
    return drawn


def _render_part_ii(inp: inputs.Inputs, site: Site, cache: DiskCache) -> None:
    """Part II's other lineages (the RMSNorm backward, the softmax, the softmax backward, the cross-entropy): a page per
    stage (<folder>/NN-slug.md), of the RMSNorm forward's form with its three figures (pages/part_ii.py), its
    numbers from bench/results/<folder> with the lineage's climb."""
    root = inp.root
    for folder, stages in inp.part_ii.items():
        lin, results = part_ii.BY_FOLDER[folder], inp.part_ii_results.get(folder, [])
        climb_md = ""
        with naming(f"the {lin.label} climb", root / "bench" / "results" / lin.results_folder, root):
            chart = part_ii.climb(lin, stages, results)
            if chart is not None:
                site.add_asset(part_ii.chart_path(lin), chart.standalone)
                climb_md = site.add_fragment(chart.id, figure(chart.id, chart.svg, chart.caption, chart.title,
                                                              "../../" + part_ii.chart_path(lin), kind="chart",
                                                              scroll=True))
        drawn: dict = {}
        specs = [[st.name, st.spec_path.read_text()] for st in stages]
        for i, s in enumerate(stages):
            prev = stages[i - 1] if i else None
            nxt = stages[i + 1] if i + 1 < len(stages) else None
            label = f"{part_ii.lineage_of(s).label} stage {s.name}"
            with naming(f"the diagrams of {label}", s.spec_path, root):
                # a stage.toml without [[config]] would have nothing for the figures to deal out
                mine = _rowwise_diagrams(s, stages, specs, cache) if hasattr(s.spec, "config") else []
                drawn[s.number] = (s, mine)
                parts = part_ii.diagram_parts(s, drawn[s.number][1], drawn, site)
            with naming(f"the diff of {label}", s.kernel_path, root):
                diff_md = site.add_fragment(f"diff-{folder}-{s.name}", diff.diff_section(s, prev, cache),
                                            file=(f"{DIFFS}/{folder}-{s.name}.html", 2, "the diff"))
            with naming(f"the compiler section of {label}", s.kernel_path, root):
                facts, _problem = inp.facts_of(s)
                compiler_md = compiler.compiler_section(s, prev, inp.facts_of, name=part_ii.stage_name,
                                                        memory_bound=True)
                compiler_md += "\n" + part_ii.instances_md(s, facts)
            with naming(f"the benchmark section of {label}", root / "bench" / "results" / lin.results_folder, root):
                current = s.source_hash()
                benchmark_md = part_ii.benchmark_md(s, prev, current, results, climb_md)
                headline_md = site.add_fragment(f"headline-{folder}-{s.name}", part_ii.headline_md(s, current, results))
            with naming(f"the page of {label}", s.notes_path, root):
                site.pages[part_ii.page_path(s)] = part_ii.stage_page(
                    s, prev, nxt, diff_html=diff_md, compiler_md=compiler_md, benchmark=benchmark_md,
                    headline=headline_md, overview=bool(inp.rmsnorm), diagrams=parts)


def _rowwise_diagrams(stage, stages, specs: list, cache: DiskCache) -> list[Diagram]:
    def make():
        return [dataclasses.asdict(d) for d in rowwise_diagrams(stage, stages)]

    drawn = cache.get("rowwise-diagrams", [stage.lineage, stage.name, specs] if stage.lineage != "rmsnorm"
                      else [stage.name, specs], make,
                      code=[Path(diagram.__file__).parent, Path(lineage.__file__), Path(rowwise_spec.__file__),
                            Path(rowwise_spec.__file__).parent / "rowwise_backward.py",
                            Path(rowwise_spec.__file__).parent / "softmax_lineage.py",
                            Path(rowwise_spec.__file__).parent / "cross_entropy_lineage.py"],
                      libraries=["svgwrite"])
    return [Diagram(**d) for d in drawn]


def _rmsnorm_overview(inp: inputs.Inputs, site: Site) -> str:
    """Part II's overview: the climb against the copy ceiling (or "not measured yet"), the stages, the
    numbers, the compiler at a glance and the run the numbers come from."""
    main = inp.rmsnorm_results[0] if inp.rmsnorm_results else None
    climb = None
    if main is not None:
        climb = rowwise_numbers.climb_diagram(rowwise_numbers.climb_data(inp.rmsnorm, main), main.gpu_name,
                                              main.run["date"])
    climb_md = ""
    if climb is None:  # the chart's frame, empty, and the sentence that says why
        where = f"`bench/results/rmsnorm/{main.gpu}.json`" if main else "`bench/results/rmsnorm/<gpu>.json`"
        climb_md = (f"**{rowwise_numbers.NOT_MEASURED}.** No RMSNorm stage has an entry in {where}: the climb, "
                    "GB/s per stage at 4k, 16k, 64k and 256k against the copy ceiling timed in the same run, appears "
                    f"once `{rowwise_numbers.COMMAND}` has run on a GPU (`{rowwise_numbers.GPU_COMMAND}` builds, tests "
                    "and times in one command).\n\n")
        climb = rowwise_numbers.empty_climb(inp.rmsnorm)
    site.add_asset(RMSNORM_CHART, climb.standalone)
    climb_md += site.add_fragment("climb-rmsnorm", figure(climb.id, climb.svg, climb.caption, climb.title,
                                                          "../" + RMSNORM_CHART, kind="chart"))
    if main is not None:
        env = main.run["environment"]
        environment_md = (f"**{main.gpu_name}** (`bench/results/rmsnorm/{main.gpu}.json`): run {main.run['date']}, "
                          f"commit `{(main.run.get('git_commit') or 'unknown')[:12]}`"
                          + (" with uncommitted changes" if main.run.get("git_dirty") else "")
                          + f", `{main.run.get('command', '')}`; torch {env.get('torch', '?')}, CUDA "
                          f"{env.get('cuda', '?')}, driver {env.get('driver', '?')}.\n")
    else:
        environment_md = f"No RMSNorm run recorded yet: {rowwise_numbers.NOT_MEASURED.lower()}.\n"
    lineages = [("RMSNorm", "", inp.rmsnorm, main)] + [
        (part_ii.BY_FOLDER[folder].label, f"../{folder}/", stages, (inp.part_ii_results.get(folder) or [None])[0])
        for folder, stages in inp.part_ii.items()]
    return rowwise.overview_page(
        inp.rmsnorm, climb_md=climb_md, targets_md=rowwise_numbers.targets_table(lineages),
        numbers_md=(f"Numbers from {main.gpu_name}; GB/s, and × the copy of the same run.\n\n" if main else
                    f"{rowwise_numbers.NOT_MEASURED}: every cell waits for a GPU run.\n\n")
        + rowwise_numbers.overview_table(inp.rmsnorm, inp.rmsnorm_hashes, main),
        compiler_md=rowwise_compiler.overview_table(inp.rmsnorm, inp.facts_of),
        environment_md=environment_md)


def _backward_diagrams(stage, stages, specs: list, cache: DiskCache) -> list[Diagram]:
    def make():
        return [dataclasses.asdict(d) for d in backward_diagrams(stage, stages)]

    # the kernel's source too: the CTA-order figure reads its WINDOW_WAVES
    drawn = cache.get("backward-diagrams", [stage.name, specs, stage.kernel_path.read_text()], make,
                      code=[Path(diagram.__file__).parent, Path(lineage.__file__)], libraries=["svgwrite"])
    return [Diagram(**d) for d in drawn]


def _backward_overview(inp: inputs.Inputs, site: Site) -> str:
    """The overview's Act V: the backward climb (or "not measured yet") and the backward stages."""
    if not inp.backward:
        return ""
    main = inp.results[0] if inp.results else None
    parts = []
    climb = backward_numbers.climb_diagram(backward_numbers.climb_data(inp.backward, main), main.gpu_name) \
        if main is not None else None
    if climb is not None:
        site.add_asset(BACKWARD_CHART, climb.standalone)
        parts.append(site.add_fragment("climb-backward", figure(climb.id, climb.svg, climb.caption, climb.title,
                                                                BACKWARD_CHART, kind="chart")))
    else:
        parts.append(f"**{backward_numbers.NOT_MEASURED}.** No backward stage has a backward entry in "
                     + (f"`bench/results/{main.gpu}.json`" if main else "the results")
                     + f": the climb against FlashAttention-4, cuDNN and FlashAttention-2 appears once "
                     f"`{backward_numbers.COMMAND}` has run on a GPU.\n")
    parts.append(backward_numbers.overview_table(inp.backward, inp.backward_hashes, main))
    parts.append("Compiler facts of the backward stages:\n\n"
                 + compiler_overview.overview_table(inp.backward, inp.facts_of, folder=backward.FOLDER))
    return "\n".join(parts)


def _diagrams(stage, stages, specs: list, cache: DiskCache) -> list[Diagram]:
    """The stage's diagrams and concept pictures: a pure function of the specs (and of the code
    that parses and draws them), so a kernel.cu or notes.md edit does not redraw them — except the
    figures read from kernel.cu itself (stage 23 on: the code by role, against the stage before
    23 and the previous stage; the tile of each head dim), whose sources are part of their key."""

    def make():
        return [dataclasses.asdict(d) for d in stage_diagrams(stage, stages) + concept_diagrams(stage, stages)]

    sources = ([[s.name, s.kernel_path.read_text()] for s in stages
                if structure.FIRST - 1 <= s.number <= stage.number] if structure.applies(stage) else [])
    drawn = cache.get("diagrams", [stage.name, specs, sources], make,
                      code=[Path(diagram.__file__).parent, Path(lineage.__file__)], libraries=["svgwrite"])
    return [Diagram(**d) for d in drawn]


def _doc_diagrams(stages, specs: list, cache: DiskCache) -> list[Diagram]:
    def make():
        return [dataclasses.asdict(d) for d in doc_diagrams(stages)]

    drawn = cache.get("doc-diagrams", [specs], make, code=[Path(diagram.__file__).parent], libraries=["svgwrite"])
    return [Diagram(**d) for d in drawn]


def _overview(inp: inputs.Inputs, site: Site, cache: DiskCache) -> str:
    main = inp.results[0] if inp.results else None
    chart_md = None
    if main is not None:
        data = chart.progression_data(inp.stages, main)
        climb = chart.progression_diagram(data, main.gpu_name)
        if climb is not None:
            site.add_asset(CHART, climb.standalone)
            chart_md = site.add_fragment("climb", figure(climb.id, climb.svg, climb.caption, climb.title, CHART,
                                                         kind="chart"))
    docs = inp.root / "docs"
    return overview.index_page(
        inp.stages,
        numbers_md=tables.overview_tables(inp.stages, inp.hashes, main) if main else "",
        chart=chart_md,
        users_md=tables.users_tables(inp.stages, inp.hashes, main) if main else "",
        head_dims_md=tables.head_dim_tables(inp.stages, inp.hashes, main) if main else "",
        environment_md="\n".join(f"**{n.gpu_name}** (`bench/results/{n.gpu}.json`)\n\n"
                                 + tables.environment(n, inp.hashes) for n in inp.results),
        compiler_md=compiler_overview.overview_table(inp.stages, inp.facts_of),
        model_md=model_vs_measured.overview_section(inp, site),
        gpu_name=main.gpu_name if main else None,
        reading_guide=next((n for n in ("reading-guide.md", "reading_guide.md") if (docs / n).is_file()), None),
        backward=inp.backward, backward_md=_backward_overview(inp, site), part_ii=inp.rmsnorm)


def generate(root: Path, *, use_cache: bool = True) -> tuple[Site, inputs.Inputs, float]:
    """Load, validate and render the site of the repository at ``root``; (site, its inputs, seconds)."""
    start = time.perf_counter()
    root = Path(root).resolve()
    cache = DiskCache(root / ".cache" / "site_gen" if use_cache else None)
    inp = inputs.load(root)
    site = render(inp, cache)
    cache.prune()
    return site, inp, time.perf_counter() - start
