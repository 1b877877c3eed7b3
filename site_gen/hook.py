"""MkDocs hook (mkdocs.yml `hooks:`): the generated pages, handed to MkDocs in memory.

on_config renders the site (site_gen.site) and sets the navigation and the watched folders,
on_files adds the generated pages and assets (and MathJax, from its pip package), on_post_page
splices the heavy HTML fragments into the built pages.

`mkdocs serve` loads this file once and never reloads it, so it stays thin: each build drops the
generator's modules (site_gen, hopattn) from sys.modules and imports them afresh, so edits to the
generator take effect without restarting the server.
"""

from __future__ import annotations

import sys
from pathlib import Path, PurePosixPath

from mkdocs.exceptions import PluginError
from mkdocs.plugins import get_plugin_logger
from mkdocs.structure.files import File, Files

log = get_plugin_logger("site_gen")
MATHJAX = "assets/javascripts/mathjax"  # where mkdocs.yml's extra_javascript expects tex-svg.js
_state = {}  # what on_config rendered, for the later events of the same build


def _fresh_generator():
    for name in [n for n in sys.modules if n.split(".")[0] in ("site_gen", "hopattn")]:
        del sys.modules[name]
    from site_gen import fragments, nav, site  # plain imports: executed again now that they are dropped

    return site, nav, fragments


def on_config(config):
    site, nav, fragments = _fresh_generator()
    root = Path(config.config_file_path).resolve().parent  # the site being built (a fixture in tests)
    try:
        generated, inputs, seconds = site.generate(root)
    except (ValueError, site.SectionError) as err:  # SpecError, ResultsError, FactsError name the file
        raise PluginError(f"site_gen: {err}") from err
    log.info("generated %d pages in %.2f s", len(generated.pages), seconds)
    for problem in inputs.stale_facts():
        log.info("compiler facts of %s (run `python -m hopattn.compiler`)", problem)
    _state.update(site=generated, fragments=fragments)
    # The stages, their compiler facts and the results: the folders under kernels/ that are not a Python
    # package, so that tests or scripts run beside `mkdocs serve` (writing kernels/hopattn/__pycache__)
    # trigger no rebuild.
    kernels = root / "kernels"
    data = [p for p in sorted(kernels.iterdir()) if p.is_dir() and not (p / "__init__.py").exists()] \
        if kernels.is_dir() else []
    for path in (*data, root / "bench" / "results"):
        if path.is_dir() and str(path) not in config.watch:
            config.watch.append(str(path))
    if not config.nav:
        config.nav = nav.nav(Path(config.docs_dir), sorted(generated.pages))
    return config


def on_files(files, config):
    generated = _state["site"]
    for path, text in {**generated.pages, **generated.assets}.items():
        # These paths belong to the generator: a file left there on disk (by an older version that
        # wrote into docs/) gives way.
        if (old := files.get_file_from_path(path)) is not None:
            files.remove(old)
        files.append(File.generated(config, path, content=text))
    mathjax = _mathjax()
    for name, source in (("tex-svg.js", mathjax / "es5" / "tex-svg.js"), ("LICENSE", mathjax / "LICENSE")):
        files.append(File.generated(config, f"{MATHJAX}/{name}", abs_src_path=str(source)))
    # Pages in the order MkDocs walks docs/ (folders depth-first, index first), as if the generated
    # ones were on disk: the search index lists pages in this order.
    pages = sorted((f for f in files if f.is_documentation_page()), key=_walk_order)
    return Files(pages + [f for f in files if not f.is_documentation_page()])


def _walk_order(file: File) -> tuple:
    *folders, name = PurePosixPath(file.src_uri).parts
    return tuple(folders), PurePosixPath(name).stem not in ("index", "README"), name


def _mathjax() -> Path:
    """MathJax 3 from its pip package (django-static-mathjax: the MathJax files, Apache-2.0), so the
    site typesets offline without 2 MB of JavaScript in the repository."""
    try:
        import mathjax
    except ImportError:
        raise PluginError("site_gen: MathJax is not installed: pip install -e '.[docs]'") from None
    return Path(mathjax.__file__).parent / "static" / "mathjax"


def on_post_page(output, page, config):
    # Diffs and diagrams are spliced in here, after Markdown and search (see site_gen/fragments.py).
    return _state["fragments"].fill(output, _state["site"].fragments, _state["site"].later)
