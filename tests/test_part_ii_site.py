"""Part II's other lineages on the site: a page per stage of the RMSNorm backward, the softmax and the
softmax backward (/<lineage>/NN-slug/) with the RMSNorm forward's anchors, its change, notes, diff
against the previous stage of the same lineage, compiler facts by template instance and the
not-measured benchmark section; no figures (their specs have no [[config]]); the nav after the
RMSNorm forward's pages; the RMSNorm forward's and the attention pages byte-identical beside them;
determinism."""

from __future__ import annotations

import shutil

import pytest
from conftest import make_site
from hopattn import lineage
from hopattn.records import compiler_facts
from test_rmsnorm_site import add_rmsnorm

from site_gen import nav, site
from site_gen.pages import part_ii

ANCHORS = ("diagrams", "diff", "compiler", "benchmark")
STAGES = {lin.folder: lin.discover() for lin in part_ii.LINEAGES}


def add_part_ii(root, facts=True):
    """The three lineages copied into a fixture tree (softmax_backward shares softmax/common), with their
    committed compiler facts."""
    for folder, stages in STAGES.items():
        src = lineage.RMSNORM_DIR.parent / folder
        dest = root / "kernels" / folder
        shutil.copytree(src, dest)
        if facts:
            out = compiler_facts.folder_for(dest)
            out.mkdir(parents=True)
            for s in stages:
                shutil.copy(compiler_facts.path_for(s), out)
    return root


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    root = add_part_ii(add_rmsnorm(make_site(tmp_path_factory.mktemp("p2") / "repo")))
    return root, site.generate(root)[0]


def _section(page: str, anchor: str) -> str:
    part = page[page.index(f"{{#{anchor}}}"):]
    return part[:part.index("\n## ", 1)] if "\n## " in part[1:] else part


@pytest.mark.parametrize("folder", list(STAGES))
def test_a_page_per_stage_with_its_anchors_and_sections(rendered, folder):
    _root, out = rendered
    lin = part_ii.BY_FOLDER[folder]
    stages = STAGES[folder]
    for i, s in enumerate(stages):
        page = out.pages[f"{folder}/{s.name}.md"]
        assert page.startswith(f"# {lin.label} {s.id} · {s.title}\n")
        for anchor in ANCHORS:
            assert page.count(f"{{#{anchor}}}") == 1, (s.name, anchor)
        assert " ".join(s.change.split())[:60] in " ".join(page.split())  # the one change
        notes = part_ii._notes_body(s.notes_path.read_text())
        assert notes and notes.strip().splitlines()[-1] in page  # the notes, to their last line
        # the diff, against the previous stage of the same lineage
        assert f"diff-{folder}-{s.name}" in out.fragments
        assert f"assets/generated/diffs/{folder}-{s.name}.html" in out.assets
        if i == 0:
            assert "## Source {#diff}" in page
            assert "nothing to compare against" in out.fragments[f"diff-{folder}-{s.name}"]
        else:
            assert f"## Diff against {part_ii.title(stages[i - 1])} {{#diff}}" in page
        # the compiler facts, every instance
        compiler = _section(page, "compiler")
        assert "Every template instance" in compiler and "**none spills**" in compiler
        assert f"`{compiler_facts.load(s)['signature']}`" in compiler
        if i:
            assert f"**Against {lin.label} stage {stages[i - 1].id}:**" in compiler
        # no figures: the spec has no [[config]]
        diagrams = _section(page, "diagrams")
        assert "No figures" in diagrams and "[[config]]" in diagrams and "<svg" not in page
        assert not any(k.startswith("fig-") and s.name in k for k in out.fragments)
        # neighbours in the same lineage, and Part II's overview
        assert "[Part II overview](../rmsnorm/index.md)" in page
        if i:
            assert f"[← {part_ii.title(stages[i - 1])}]({stages[i - 1].name}.md)" in page
        if i + 1 < len(stages):
            assert f"[{part_ii.title(stages[i + 1])} →]({stages[i + 1].name}.md)" in page


@pytest.mark.parametrize("folder", list(STAGES))
def test_not_measured_yet_is_said_plainly(rendered, folder):
    root, out = rendered
    assert not (root / "bench" / "results" / folder).exists()
    for s in STAGES[folder]:
        page = out.pages[f"{folder}/{s.name}.md"]
        bench = _section(page, "benchmark")
        assert "**Not measured yet.**" in bench and part_ii.BY_FOLDER[folder].command in bench
        assert f"`bench/results/{folder}/<gpu>.json`" in bench
        assert "Not measured yet" in out.fragments[f"headline-{folder}-{s.name}"]


def test_the_nav_puts_them_after_the_rmsnorm_forward(rendered):
    root, out = rendered
    entries = nav.nav(root / "docs", sorted(out.pages))
    part = next(e for e in entries if isinstance(e, dict) and nav.PART_II in e)[nav.PART_II]
    forward = ["rmsnorm/index.md"] + [p for p in sorted(out.pages) if p.startswith("rmsnorm/") and p != "rmsnorm/index.md"]
    assert part == forward + [f"{folder}/{s.name}.md" for folder, stages in STAGES.items() for s in stages]


def test_the_other_pages_are_byte_identical_beside_them(rendered, tmp_path):
    _root, both = rendered
    alone = site.generate(add_rmsnorm(make_site(tmp_path / "a")))[0]
    assert all(both.pages[p] == t for p, t in alone.pages.items())
    assert all(both.assets[p] == t for p, t in alone.assets.items())
    assert all(both.fragments[n] == h for n, h in alone.fragments.items())
    new = set(both.pages) - set(alone.pages)
    assert new == {f"{folder}/{s.name}.md" for folder, stages in STAGES.items() for s in stages}


def test_deterministic(rendered, tmp_path):
    _root, warm = rendered
    root = add_part_ii(add_rmsnorm(make_site(tmp_path / "other")))
    assert site.generate(root)[0] == warm
    assert site.generate(root, use_cache=False)[0] == warm


def test_without_facts_the_compiler_section_says_how_to_make_them(tmp_path):
    out = site.generate(add_part_ii(add_rmsnorm(make_site(tmp_path / "repo")), facts=False))[0]
    page = out.pages["softmax/02-online-max-and-sum.md"]
    assert '!!! note "No compiler facts yet"' in page and "python -m hopattn.compiler --lineage softmax" in page


def test_without_the_rmsnorm_forward_no_link_to_its_overview(tmp_path):
    out = site.generate(add_part_ii(make_site(tmp_path / "repo")))[0]
    page = out.pages["softmax_backward/02-row-in-registers.md"]
    assert "Part II overview" not in page and "[← Softmax backward 01" in page
