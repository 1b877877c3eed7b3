"""MkDocs hook (mkdocs.yml `hooks:`): generate the pages before every build and watch the sources.

`mkdocs serve` loads this file once and never reloads it, so it stays thin: each build drops the
generator's modules (and the lineage/results readers) from sys.modules and imports them afresh,
so edits to the generator take effect without restarting the server.
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent  # where site_gen and hopattn live
_RELOAD = ("site_gen", "hopattn.lineage", "hopattn.results")
log = logging.getLogger("mkdocs.hooks.site_gen")


def _fresh_generator():
    for path in (str(_REPO / "kernels"), str(_REPO)):
        if path not in sys.path:
            sys.path.insert(0, path)
    for name in list(sys.modules):
        if any(name == p or name.startswith(p + ".") for p in _RELOAD):
            del sys.modules[name]
    return importlib.import_module("site_gen.build_site")


_current = None  # the generator module loaded for the build in progress


def on_config(config):
    global _current
    gen = _current = _fresh_generator()
    root = Path(config.config_file_path).resolve().parent  # the site being built (a fixture in tests)
    docs = Path(config.docs_dir)
    try:
        changed, seconds = gen.timed_generate(root, docs)
    except ValueError as err:  # SpecError, ResultsError: the message names the file and the field
        from mkdocs.exceptions import PluginError

        raise PluginError(f"site_gen: {err}") from err
    log.info("site_gen: %d file(s) changed in %.2f s", len(changed), seconds)
    for path in (root / "kernels" / "attention", root / "bench" / "results"):
        if path.is_dir() and str(path) not in config.watch:
            config.watch.append(str(path))
    if not config.nav:
        config.nav = gen.nav(docs)
    # The diagrams stylesheet is another helper's file: link it only once it exists (a 404 is a
    # console error in the browser test).
    css = "assets/stylesheets/diagrams.css"
    if (docs / css).is_file() and css not in config.extra_css:
        config.extra_css.append(css)
    return config


def on_post_page(output, page, config):
    # Diffs and diagrams are spliced in here, after Markdown and search (see site_gen/slots.py).
    return _current.fill_slots(output, Path(config.docs_dir))
