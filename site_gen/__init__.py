"""site_gen: turns the kernel lineage and the benchmark results into the MkDocs site under docs/.

Entry points: ``python -m site_gen`` and ``site_gen.generate(repo_root, docs_dir)``; `mkdocs serve`
runs it through the hook in site_gen/hook.py.
"""

from __future__ import annotations


def generate(repo_root, docs_dir=None):
    """Regenerate docs/ (stage pages, overview, gallery, chart); return the changed paths."""
    from .build_site import generate as _generate  # lazy: importing the package stays cheap

    return _generate(repo_root, docs_dir)
