"""Part II's other lineages on the site: a page per stage of the RMSNorm backward, the softmax and the
softmax backward (/<lineage>/NN-slug/) with the RMSNorm forward's anchors, its change, notes, diff
against the previous stage of the same lineage, compiler facts by template instance and the
benchmark section (the not-measured state, and the committed H200 records with the lineage's climb); the three figures
drawn from their [[config]] (tests/test_part_ii_figures.py); the nav after the
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
        # the three figures, drawn from [[config]] (or linked where unchanged since an earlier stage)
        diagrams = _section(page, "diagrams")
        assert "No figures" not in page and "[[config]]" in diagrams and "<svg" not in page
        if not hasattr(s.spec, "config"):  # the cross-entropy: no [[config]] yet, and the page says so
            assert "This stage has no diagrams yet" in diagrams and "{#holders}" not in diagrams
            continue
        for anchor in ("holders", "reduction", "traffic"):
            part = diagrams[diagrams.index(f"{{#{anchor}}}"):]
            assert 'data-slot="fig-' in part.split("\n###")[0] or "Unchanged since [" in part.split("\n###")[0]
        # neighbours in the same lineage, and Part II's overview
        assert "[Part II overview](../rmsnorm/index.md)" in page
        if i:
            assert f"[← {part_ii.title(stages[i - 1])}]({stages[i - 1].name}.md)" in page
        if i + 1 < len(stages):
            assert f"[{part_ii.title(stages[i + 1])} →]({stages[i + 1].name}.md)" in page


def test_the_figures_on_the_pages(rendered):
    """Each figure once, with its standalone file; one that did not change links the stage where it did."""
    _root, out = rendered
    page = out.pages["rmsnorm_backward/05-prefetch-next-row.md"]
    assert ("Unchanged since [RMSNorm backward stage 04](04-cluster-rows.md#traffic): each element is read and "
            "written as often as there.") in page
    assert 'data-slot="fig-rb05-holders"' in page and 'data-slot="fig-rb05-reduction"' in page
    six = out.pages["rmsnorm_backward/06-cluster-exchange-without-fences.md"]
    assert "Unchanged since [RMSNorm backward stage 05](05-prefetch-next-row.md#holders)" in six
    assert 'data-slot="fig-rb06-reduction"' in six  # st.async: a tree of its own
    for folder, stages in STAGES.items():
        for s in stages:
            page = out.pages[f"{folder}/{s.name}.md"]
            for d in (k for k in out.fragments if k.startswith("fig-") and k.endswith(tuple(
                    f"{s.id}-{kind}" for kind in ("holders", "reduction", "traffic")))):
                if f'data-slot="{d}"' in page:
                    assert f"assets/generated/diagrams/{d[4:]}.svg" in out.assets
    fig = out.fragments["fig-sm02-reduction"]
    assert "(max, sum) pair" in fig and "SVG file" in fig
    assert out.fragments["fig-sb01-traffic"].count("3 streams of 2 B an element") >= 1


@pytest.mark.parametrize("folder", list(STAGES))
def test_not_measured_yet_is_said_plainly(rendered, folder):
    root, out = rendered
    results = part_ii.BY_FOLDER[folder].results_folder
    assert not (root / "bench" / "results" / results).exists()
    for s in STAGES[folder]:
        page = out.pages[f"{folder}/{s.name}.md"]
        bench = _section(page, "benchmark")
        assert "**Not measured yet.**" in bench and part_ii.BY_FOLDER[folder].command in bench
        assert f"`bench/results/{results}/<gpu>.json`" in bench
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


# --- the measured state: the committed records of the H200 run -----------------------------------


def add_records(root, drop: tuple[str, str] | None = None):
    """The committed bench/results/<results>/nvidia-h200.json of the lineages (the cross-entropy's fused
    record) copied into a fixture tree; ``drop``: (folder, arm) whose entries are left out."""
    import json

    for folder in STAGES:
        results = part_ii.BY_FOLDER[folder].results_folder
        src = lineage.RMSNORM_DIR.parent.parent / "bench" / "results" / results / "nvidia-h200.json"
        data = json.loads(src.read_text())
        if drop and drop[0] == folder:
            data["entries"] = [e for e in data["entries"] if e["arm"] != drop[1]]
        dest = root / "bench" / "results" / results / "nvidia-h200.json"
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return root


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    root = add_records(add_part_ii(add_rmsnorm(make_site(tmp_path_factory.mktemp("p2m") / "repo"))))
    return root, site.generate(root)[0]


@pytest.mark.parametrize("folder", list(STAGES))
def test_a_measured_record_on_every_page(measured, folder):
    from hopattn.records import rowwise as records

    root, out = measured
    lin = part_ii.BY_FOLDER[folder]
    res = records.load(root / "bench" / "results" / lin.results_folder / "nvidia-h200.json")
    for s in STAGES[folder]:
        page = out.pages[f"{folder}/{s.name}.md"]
        bench = _section(page, "benchmark")
        if s == STAGES[folder][-1] and not any(e["arm"] == f"stage {s.id}" for e in res.entries):
            # the newest stage before its GPU run (its notes say so: tests/test_part_ii_notes.py)
            assert "**Not measured yet.**" in bench and "holds no entry of this stage" in bench
            continue
        assert "Not measured yet" not in bench
        if not any(e["arm"] == f"stage {s.id}" for e in res.entries):  # an earlier run measured it, not this one
            assert "**Not in the latest run.**" in bench and f"run {res.run['date']}" in bench
            assert f"`{part_ii.last_measured_log(s)}`" in bench and "Not in the latest run" in \
                out.fragments[f"headline-{folder}-{s.name}"]
            continue
        assert (f"Measured on NVIDIA H200 (run {res.run['date']}, `bench/results/{lin.results_folder}/nvidia-h200.json`)"
                in bench)
        for size in res.sizes():
            e = res.entry(f"stage {s.id}", size)
            assert f"| {size} | **{e['gbps']:.0f}**" in bench, (s.name, size)
        assert part_ii.BY_FOLDER[folder].gbps in bench
        assert ("hd-stale" in bench) == any(records.is_stale(e, s.source_hash()) for e in res.entries
                                            if e["arm"] == f"stage {s.id}")
        cards = out.fragments[f"headline-{folder}-{s.name}"]
        assert "Not measured yet" not in cards and cards.count('<div class="hd-card">') == 4  # lin.lengths
        assert f"climb-{folder}" in bench  # the lineage's climb, under the table
    chart = out.assets[f"assets/generated/progression-{folder}.svg"]
    assert f"The {part_ii.BY_FOLDER[folder].label} climb" in chart and "NVIDIA H200" in chart
    for size in lin.lengths:  # 4k, 16k, 64k, 256k (the cross-entropy's: 4k, 32k, 128k, 256k)
        assert f"{size}: copy {res.entry('copy', size)['gbps']:,.0f}" in chart
    assert "QuACK" in chart and "Liger" in chart


def test_the_numbers_are_the_logs_to_the_third_decimal(measured):
    """The rows of the committed bench logs (the RMSNorm backward's of 2026-12-02T13, the softmax's of
    2026-12-03T1223 and T1229), as the pages show them: three decimals,
    so 0.9286 of the copy is not shown as the 0.93 target."""
    _root, out = measured
    bench = _section(out.pages["softmax_backward/02-row-in-registers.md"], "benchmark")
    assert "| 4k | **4414** | 0.1824 | 0.2 % | 1.036× | 1.186× | 2.040× | 0.987× | 1.008× | 1.005× | 1.3e-03 |" in bench
    bench = _section(out.pages["rmsnorm_backward/06-cluster-exchange-without-fences.md"], "benchmark")
    assert "| 16k | **3962** | 0.4065 | 1.1 % | 0.929× | 0.996× |" in bench
    assert "| 256k | **3125** | 0.5153 | 1.1 % | 0.732× | 1.262× |" in bench and "| 1.785× |" in bench
    bench = _section(out.pages["softmax/04-cluster-rows.md"], "benchmark")  # the run of 20261203T1223
    assert "| 256k | **2247** | 0.4779 | 0.6 % | 0.533× | 0.822× |" in bench  # × copy, then over 03
    cards = out.fragments["headline-softmax_backward-02-row-in-registers"]
    assert "4414 <span>GB/s</span>" in cards and "1.036× the copy, same run" in cards


def test_a_stage_without_an_entry_says_so_beside_the_measured_ones(tmp_path):
    # stage 03 left out of the record: its notes quote the run that measured it, so the page names that log
    root = add_records(add_part_ii(add_rmsnorm(make_site(tmp_path / "repo"))), drop=("softmax", "stage 03"))
    out = site.generate(root)[0]
    bench = _section(out.pages["softmax/03-row-in-registers.md"], "benchmark")
    assert "**Not in the latest run.**" in bench and "holds no entry of this stage" in bench
    assert "`bench/logs/softmax-bench-nvidia-h200-20261202T1327.log`" in bench
    assert "`bench/results/softmax/nvidia-h200.json`" in bench and part_ii.BY_FOLDER["softmax"].command in bench
    assert "Not in the latest run" in out.fragments["headline-softmax-03-row-in-registers"]
    assert "Measured on NVIDIA H200" in _section(out.pages["softmax/04-cluster-rows.md"], "benchmark")
    # stage 04's table still compares it with stage 03: the ratio is the run's, in stage 04's entry
    assert "| vs 03 |" in out.pages["softmax/04-cluster-rows.md"]


def test_deterministic_with_records(measured, tmp_path):
    _root, warm = measured
    root = add_records(add_part_ii(add_rmsnorm(make_site(tmp_path / "other"))))
    assert site.generate(root, use_cache=False)[0] == warm


def test_the_configuration_that_ran_is_shown_whole(measured):
    """The variant, listed below the table (as a column it wrapped a word a line on a phone), its angle
    brackets escaped: unescaped, '<bf16, 64 threads/row, 8 vectors>' is a tag the browser drops."""
    _root, out = measured
    bench = _section(out.pages["softmax/04-cluster-rows.md"], "benchmark")
    assert "The configuration that ran, at each length:\n\n- 4k: row in registers&lt;bf16, 64 threads/row, 8 vectors, cluster 1&gt;\n" in bench
    assert "- 256k: row in registers&lt;bf16, 1024 threads/row, 8 vectors, cluster 4&gt;\n" in bench
    assert "registers<bf16" not in bench and "| Configuration |" not in bench


@pytest.mark.parametrize("folder", list(STAGES))
def test_the_climb_reads_without_clipping_or_overlap(folder):
    """The climb of each lineage from its committed record: no text clipped or overlapping (the first
    stage's rotated label once ran off the left edge), the stages named short."""
    from hopattn.records import rowwise as records

    from site_gen.diagrams.svg import text_problems

    lin = part_ii.BY_FOLDER[folder]
    results = records.load_all(lineage.RMSNORM_DIR.parent.parent / "bench" / "results" / lin.results_folder)
    d = part_ii.climb(lin, STAGES[folder], results)
    assert d is not None and d.id == f"climb-{folder}"
    assert text_problems(d.svg, d.width, d.height) == []
    assert all(len(part_ii.short_label(s)) <= part_ii.LABEL_CHARS + 1 for s in STAGES[folder])
    assert part_ii.climb(lin, STAGES[folder], []) is None


def test_the_overview_sets_every_lineage_against_the_targets(measured):
    """Part II's overview: each lineage's fastest stage at each length of the records, × the copy and × QuACK,
    in bold where both targets (≥ 0.93× the copy, ≥ 1.00× QuACK) are met; from the committed H200 records."""
    _root, out = measured
    index = out.pages["rmsnorm/index.md"]
    part = index[index.index("## Against the targets {#targets}"):index.index("## The stages")]
    assert "| Lineage | 4k | 8k | 16k | 32k | 64k | 128k | 256k |" in part  # 32k, 128k: the cross-entropy's
    backward = next(line for line in part.splitlines() if line.startswith("| RMSNorm backward |"))
    cells = backward.split(" | ")[1:]
    assert cells[0].startswith("0.884× copy<br>1.059× QuACK<br><small>[stage 04](../rmsnorm_backward/04-cluster")
    assert cells[2].startswith("**0.931× copy**<br>**1.458× QuACK**") and "both targets" in cells[2]  # 16k, stage 05
    assert cells[6].startswith("0.732× copy<br>1.785× QuACK") and "stage 06" in cells[6]
    softmax = next(line for line in part.splitlines() if line.startswith("| Softmax |"))
    assert softmax.split(" | ")[2] == "not in the run"  # the softmax bench has no 8k
    assert softmax.split(" | ")[1].startswith("**0.978× copy**<br>**1.004× QuACK**")  # 4k, stage 06: both met
    assert "**" not in " | ".join(softmax.split(" | ")[2:])  # no other length meets both
    assert "**1.036× copy**<br>**1.005× QuACK**" in part  # the softmax backward at 4k
    ce = next(line for line in part.splitlines() if line.startswith("| Cross-entropy |")).split(" | ")
    assert ce[2] == "not in the run" and "**" not in " | ".join(ce)  # no 8k; no target met
    # 32k: the fastest stage of the committed fused record, × the copy and × QuACK as the record has
    # them (a dash where QuACK was not in the run), and the link to that stage's page
    import json

    folder = next(f for f in STAGES if part_ii.BY_FOLDER[f].results_folder == "cross_entropy_fused")
    entries = json.loads((lineage.RMSNORM_DIR.parent.parent / "bench" / "results" / "cross_entropy_fused" /
                          "nvidia-h200.json").read_text())["entries"]
    at_32k = [e for e in entries if e["size"] == "32k" and e["kind"] == "stage" and e["status"] == "ok"]
    best = max(at_32k, key=lambda e: e["vs"]["copy"])
    quack = f'{best["vs"]["quack"]:.3f}×' if "quack" in best["vs"] else "–"
    assert ce[4].startswith(f'{best["vs"]["copy"]:.3f}× copy<br>{quack} QuACK<br><small>[{best["arm"]}]'
                            f'(../{folder}/{best["arm"][-2:]}-'), (ce[4], best["arm"])


def test_no_targets_without_records(rendered):
    _root, out = rendered
    assert "{#targets}" not in out.pages["rmsnorm/index.md"]
