"""The generator: lineage + results -> every generated page under docs/, written if changed.

Order matters for the quality bars: load and validate all inputs, render every page in memory,
and only then write (write-if-changed, atomic), so bad input or a rendering error leaves the
previous site untouched and names the culprit.
"""

from __future__ import annotations

import time
from pathlib import Path

from . import numbers, pages, plots, results_io, slots
from .cache import DiskCache
from .stage_diff import diff_section
from .writer import write_tree

GENERATED_DIRS = ("stages", "assets/generated")  # wholly owned: leftovers are deleted
CHART = "assets/generated/progression.svg"


def load_stages(repo_root: Path):
    from hopattn import lineage  # imported late so the hook's module reload picks up edits

    return lineage.discover(Path(repo_root) / "kernels" / "attention")


def render_site(repo_root: Path, docs_dir: Path, cache: DiskCache) -> dict[Path, str]:
    """Every generated file (path -> content), nothing written."""
    repo_root, docs_dir = Path(repo_root), Path(docs_dir)
    stages = load_stages(repo_root)
    all_numbers = numbers.load_numbers(results_io.load_all(repo_root / "bench" / "results"))
    hashes = {s.id: s.source_hash() for s in stages}
    # The diagrams are a pure function of the specs (their contract), so a kernel.cu or notes.md
    # edit need not redraw them: cache them on every stage.toml and on the lineage model's code.
    from hopattn import lineage

    spec_key = [[s.name, s.spec_path.read_text()] for s in stages] + [Path(lineage.__file__).read_text()]
    files: dict[Path, str] = {}

    def add_diagram_file(name: str, text: str) -> None:
        files[docs_dir / "assets" / "generated" / "diagrams" / name] = text

    def slot(name: str, html: str) -> str:
        files[slots.slot_path(docs_dir, name)] = html
        return slots.placeholder(name) + "\n"

    for i, stage in enumerate(stages):
        prev = stages[i - 1] if i else None
        nxt = stages[i + 1] if i + 1 < len(stages) else None
        files[docs_dir / "stages" / f"{stage.name}.md"] = pages.stage_page(
            stage, prev, nxt,
            diff_html=slot(f"diff-{stage.name}", diff_section(stage, prev, cache)),
            diagrams_md=pages.diagrams_section(stage, stages, lambda html, n=stage.name: slot(f"diagrams-{n}", html),
                                               cache, spec_key, add_diagram_file),
            compiler_md=pages.compiler_section(stage, prev),
            benchmark_md=pages.benchmark_section(stage, prev, hashes, all_numbers))

    main = all_numbers[0] if all_numbers else None
    chart_md = None
    if main is not None:
        data = plots.progression_data(stages, main)
        svg = cache.get("chart", [data["series"][False], data["series"][True],
                                  data["refs"][False], data["refs"][True], data["stages"]],
                        lambda: plots.progression_svg(data))
        if svg:
            files[docs_dir / CHART] = svg
            chart_md = (f"![TFLOP/s per stage, one line per shape; left non-causal, right causal]({CHART})"
                        f'{{ .hd-chart width="{int(plots.WIDTH_IN * 72)}" height="{int(plots.HEIGHT_IN * 72)}" }}')
    files[docs_dir / "index.md"] = pages.index_page(
        stages,
        numbers_md=numbers.overview_tables(stages, hashes, main) if main else "",
        chart=chart_md,
        environment_md="\n".join(f"**{n.gpu_name}** (`bench/results/{n.gpu}.json`)\n\n" + numbers.environment(n, hashes)
                                 for n in all_numbers),
        compiler_md=pages.overview_compiler(stages),
        gpu_name=main.gpu_name if main else None,
        reading_guide=next((n for n in ("reading-guide.md", "reading_guide.md") if (docs_dir / n).is_file()), None))
    files[docs_dir / "gallery.md"] = pages.gallery_page(stages, slot, cache, spec_key, add_diagram_file)
    return files


def generate(repo_root: Path, docs_dir: Path | None = None, *, use_cache: bool = True) -> list[Path]:
    """Regenerate the site's generated pages; return the paths written or deleted."""
    repo_root = Path(repo_root).resolve()
    docs_dir = Path(docs_dir).resolve() if docs_dir is not None else repo_root / "docs"
    cache = DiskCache(repo_root / ".cache" / "site_gen" if use_cache else None)
    files = render_site(repo_root, docs_dir, cache)
    changed = write_tree(files, [docs_dir / d for d in GENERATED_DIRS])
    cache.prune()
    return changed


def nav(docs_dir: Path) -> list:
    """The site navigation: overview, hand-written pages, the stages, the gallery.

    Built from what is on disk so a page added by the docs writers shows up without editing
    mkdocs.yml, and a missing one never breaks a strict build.
    """
    docs_dir = Path(docs_dir)
    preferred = ["introduction.md", "background.md", "method.md", "reading-guide.md", "reading_guide.md"]
    hand = sorted(p.name for p in docs_dir.glob("*.md") if p.name not in ("index.md", "gallery.md"))
    ordered = [n for n in preferred if n in hand] + [n for n in hand if n not in preferred]
    stages = sorted(f"stages/{p.name}" for p in (docs_dir / "stages").glob("*.md"))
    out: list = [{"Overview": "index.md"}, *ordered]
    if stages:
        out.append({"Stages": stages})
    if (docs_dir / "gallery.md").exists():
        out.append("gallery.md")
    return out


def timed_generate(repo_root: Path, docs_dir: Path | None = None) -> tuple[list[Path], float]:
    t0 = time.perf_counter()
    changed = generate(repo_root, docs_dir)
    return changed, time.perf_counter() - t0


def fill_slots(html: str, docs_dir: Path) -> str:
    """For the hook: the built page with its diff/diagram placeholders filled."""
    return slots.fill(html, docs_dir)
