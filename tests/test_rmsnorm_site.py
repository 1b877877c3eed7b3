"""Part II on the site: a page per RMSNorm stage (/rmsnorm/NN-slug/) with its anchors, figures, diff,
compiler facts by template instance and benchmark section; the part's overview (/rmsnorm/) with the
climb against the copy ceiling; the attention pages unchanged beside it; the not-measured state and a
measured record; determinism; bad input naming its file; the figures' numbers against the spec."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from conftest import make_site
from hopattn import lineage, rowwise
from hopattn.records import compiler_facts
from hopattn.records import rowwise as records

from site_gen import nav, site
from site_gen.benchmark_section import rowwise as numbers
from site_gen.compiler_section import rowwise as instances
from site_gen.diagrams.rowwise import model, rowwise_diagrams
from site_gen.diagrams.rowwise.holders import boxes
from site_gen.diagrams.rowwise.reduction import level_text
from site_gen.diagrams.rowwise.traffic import bound
from site_gen.diagrams.svg import text_problems

STAGES = rowwise.discover()
ANCHORS = ("diagrams", "diff", "compiler", "benchmark", "holders", "reduction", "traffic")


def add_rmsnorm(root, facts=True):
    """The RMSNorm lineage copied into a fixture tree, with its committed compiler facts."""
    dest = root / "kernels" / lineage.RMSNORM_DIR.name
    shutil.copytree(lineage.RMSNORM_DIR, dest)
    if facts:
        folder = compiler_facts.folder_for(dest)
        folder.mkdir(parents=True)
        for s in STAGES:
            shutil.copy(compiler_facts.path_for(s), folder)
    return root


@pytest.fixture
def rms_root(tmp_path):
    return add_rmsnorm(make_site(tmp_path / "repo"))


def render(root, **kw):
    return site.generate(root, **kw)[0]


# --- the pages ---------------------------------------------------------------------------------


def test_a_page_per_stage_with_its_anchors_figures_and_sections(rms_root):
    out = render(rms_root)
    for s in STAGES:
        page = out.pages[f"rmsnorm/{s.name}.md"]
        assert page.startswith(f"# RMSNorm {s.id} · {s.title}\n")
        for anchor in ANCHORS:
            assert f"{{#{anchor}}}" in page, (s.name, anchor)
        assert " ".join(s.change.split())[:60] in " ".join(page.split())  # the one change
        assert "## Prediction" in page  # the notes
        for kind in ("holders", "reduction", "traffic"):
            fid = f"r{s.id}-{kind}"
            part = page[page.index(f"{{#{kind}}}"):]
            part = part[:part.index("###") if "###" in part else part.index("## ")]
            if f"fig-{fid}" in part or "Drawn at the top of this page" in part:
                assert f"fig-{fid}" in out.fragments and f"assets/generated/diagrams/{fid}.svg" in out.assets, fid
            else:  # the same picture as the stage before's: linked, not drawn again
                assert "Unchanged since [RMSNorm stage" in part and f"#{kind})" in part, fid
        assert "Every template instance" in page and "**none spills**" in page  # compiler facts by instance
        assert "[Part II overview](index.md)" in page
        assert f"diff-rmsnorm-{s.name}" in out.fragments
    first, fourth = out.pages["rmsnorm/01-row-per-thread.md"], out.pages["rmsnorm/04-row-in-registers.md"]
    assert first.index("fig-r01-holders") < first.index("## Diagrams")  # the lead: what the change changes
    assert fourth.index("fig-r04-traffic") < fourth.index("## Diagrams")
    assert "Drawn at the top of this page" in fourth
    assert "nothing to compare against" in out.fragments["diff-rmsnorm-01-row-per-thread"]
    assert "Against <a href=\"../03-cta-per-row/\">03" in out.fragments["diff-rmsnorm-04-row-in-registers"]
    assert "Kernel `void rmsnorm_rows<__nv_bfloat16, 1024, 8, 1>(RmsNormParams)`" in fourth
    assert "| `rmsnorm_rows<T, 1024, 8, 1>` (the main one) | 64k | 56 | 58 | 50 |" in fourth
    assert "dynamic shared memory | 0 B |" in fourth
    # the figures: a 64k row at stage 04 is 1024 threads of 128 B; 05 reduces a 256k row across 4 CTAs
    holders = out.assets["assets/generated/diagrams/r04-holders.svg"]
    assert "1024 threads a row, 8 × 16 B held a thread" in holders and "128 B of the row" in holders
    reduction = out.assets["assets/generated/diagrams/r05-reduction.svg"]
    assert "st.shared::cluster" in reduction and "barrier.cluster" in reduction and "of a 256k row" in reduction


def test_the_overview_and_the_nav(rms_root):
    out = render(rms_root)
    index = out.pages["rmsnorm/index.md"]
    assert index.startswith("# Part II · memory-bound kernels: RMSNorm\n")
    for anchor in ("climb", "stages", "numbers", "compiler", "environment"):
        assert f"{{#{anchor}}}" in index, anchor
    for s in STAGES:
        assert f"]({s.name}.md)" in index and f"]({s.name}.md#compiler)" in index
    assert "| [04 · The row held in registers](04-row-in-registers.md) |" in index
    assert "| CTA / CTA / CTA / cluster | 1× |" in index  # stage 05: who holds a row at 4k, 16k, 64k, 256k
    assert "| thread / thread / thread / thread | 2× |" in index and "| CTA / CTA / CTA / CTA | 1× or 2× |" in index
    assert "## Part II: memory-bound kernels {#part-ii}" in out.pages["index.md"]
    assert "(rmsnorm/index.md)" in out.pages["index.md"]
    entries = nav.nav(rms_root / "docs", sorted(out.pages))
    part = {nav.PART_II: ["rmsnorm/index.md"] + [f"rmsnorm/{s.name}.md" for s in STAGES]}
    assert part in entries
    stages_at = entries.index(next(e for e in entries if isinstance(e, dict) and "Stages" in e))
    assert entries.index(part) == stages_at + 1 and entries[entries.index(part) + 1] == "gallery.md"


def test_part_ii_comes_after_act_v(rms_root):
    generated = ["index.md", "gallery.md", "stages/01-baseline.md", "backward/01-baseline.md", "rmsnorm/index.md",
                 "rmsnorm/01-row-per-thread.md"]
    entries = nav.nav(rms_root / "docs", generated)
    keys = [next(iter(e)) if isinstance(e, dict) else e for e in entries]
    assert keys.index(nav.PART_II) == keys.index(nav.ACT_V) + 1
    assert entries[keys.index(nav.PART_II)][nav.PART_II] == ["rmsnorm/index.md", "rmsnorm/01-row-per-thread.md"]


def test_the_attention_pages_are_byte_identical_with_part_ii_beside_them(tmp_path):
    alone = render(make_site(tmp_path / "a"))
    both = render(add_rmsnorm(make_site(tmp_path / "b")))
    attention = {p: t for p, t in alone.pages.items() if p != "index.md"}
    assert attention and all(both.pages[p] == t for p, t in attention.items())
    assert all(both.assets[p] == t for p, t in alone.assets.items())
    assert all(both.fragments[n] == h for n, h in alone.fragments.items())
    assert "rmsnorm/" not in " ".join(alone.pages) and "Part II" not in alone.pages["index.md"]


# --- the numbers -------------------------------------------------------------------------------


def test_not_measured_yet_is_said_plainly(rms_root):
    out = render(rms_root)
    for s in STAGES:
        page = out.pages[f"rmsnorm/{s.name}.md"]
        bench = page[page.index("## Benchmark {#benchmark}"):]
        assert "**Not measured yet.**" in bench and numbers.COMMAND in bench
        assert "GB/s" not in bench.split("**Not measured yet.**")[1].split("\n")[0].replace("GB/s per", "")
        assert "Not measured yet" in out.fragments[f"headline-rmsnorm-{s.name}"]
    index = out.pages["rmsnorm/index.md"]
    climb = index[index.index("{#climb}"):index.index("{#stages}")]
    assert "**Not measured yet.**" in climb and "climb-rmsnorm" in climb  # the chart's frame, empty
    empty = out.assets["assets/generated/progression-rmsnorm.svg"]
    assert "Not measured yet" in empty and all(s.title.split(":")[0] in empty for s in STAGES)
    assert "<path" not in empty and "<circle" not in empty and "dasharray" not in empty  # no line, point, ceiling
    assert not re.search(r">\s*[\d,.]+\s*<", empty)  # and no number on an axis
    assert index.count(" | not measured yet" * 4 + " |") == len(STAGES)
    assert "No RMSNorm run recorded yet" in index


def _record(root, gbps: dict, *, stale: bool = False) -> None:
    """A record as python -m bench.rowwise writes it (bench.rowwise.record), for the stages and arms in
    ``gbps`` ({arm: GB/s}, every size), into the fixture's bench/results/rmsnorm/nvidia-h200.json."""
    from bench import rowwise as bench

    hashes = {s.number: ("0" * 16 if stale else s.source_hash()) for s in rowwise.discover(root / "kernels" / "rmsnorm")}
    entries = []
    for size in ("4k", "16k", "64k", "256k"):
        rows, cols = records.SIZES[size]
        moved = 2 * rows * cols * 2
        for arm, rate in gbps.items():
            kind = "ceiling" if arm == "copy" else "stage" if arm.startswith("stage") else "peer"
            ms = moved / (rate * 1e9) * 1e3
            entries.append({"size": size, "rows": rows, "cols": cols, "dtype": "bf16", "arm": arm, "kind": kind,
                            "bytes": moved, "variant": None, "status": "ok", "max_rel_err": 0.004 if kind != "ceiling"
                            else None, "median_ms": ms, "min_ms": ms, "max_ms": ms, "spread_pct": 0.5, "samples": 5,
                            "gbps": rate, "vs": {o: rate / r for o, r in gbps.items() if o != arm}})
    entries.append({"size": "4k", "rows": 32768, "cols": 4096, "dtype": "bf16", "arm": "quack", "kind": "peer",
                    "bytes": 1, "status": "missing", "reason": "not importable: no module named quack"})
    env = {"gpu_name": "NVIDIA H200", "torch": "2.9.0", "cuda": "13.0", "driver": "580.0"}
    data = bench.record(entries, env, "python -m bench.rowwise", hashes, "nvidia-h200")
    data["run"] = dict(data["run"], date="2026-12-02T10:00:00Z", git_commit="0" * 40, git_dirty=False)
    path = root / "bench" / "results" / "rmsnorm" / "nvidia-h200.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def test_a_measured_record_on_the_pages_the_overview_and_the_climb(rms_root):
    _record(rms_root, {"copy": 4200.0, "stage 04": 3360.0, "stage 05": 3570.0, "eager": 2500.0, "liger": 2100.0})
    out = render(rms_root)
    page = out.pages["rmsnorm/05-cluster-rows.md"]
    bench = page[page.index("## Benchmark {#benchmark}"):]
    assert "Not measured yet" not in bench
    assert "| 256k | **3570** | " in bench and "| 0.850× | 1.062× | 1.428× | 1.700× | 4.0e-03 |\n" in bench
    assert "vs 04 | vs eager | vs Liger |" in bench and "vs QuACK" not in bench  # QuACK did not run
    cards = out.fragments["headline-rmsnorm-05-cluster-rows"]
    assert "3570 <span>GB/s</span>" in cards and "0.850× the copy, same run" in cards
    assert "**Not measured yet.**" in out.pages["rmsnorm/01-row-per-thread.md"]  # no entry of stage 01
    index = out.pages["rmsnorm/index.md"]
    assert "climb-rmsnorm" in out.fragments and "**3360**<br><small>0.800× copy</small>" in index
    assert "| *copy (the ceiling)* | *4200* | *4200* | *4200* | *4200* |" in index
    assert "run 2026-12-02T10:00:00Z, commit `000000000000`" in index
    climb = out.assets["assets/generated/progression-rmsnorm.svg"]
    assert "The RMSNorm climb" in climb and "256k: copy 4,200" in climb and "Liger" in climb
    # a token edit makes the numbers (and the facts) stale; the attention pages do not notice
    kernel = rms_root / "kernels" / "rmsnorm" / "05_cluster-rows" / "kernel.cu"
    kernel.write_text(kernel.read_text() + "constexpr int EDITED_AFTER_THE_RUN = 1;\n")
    again = render(rms_root)
    assert 'class="hd-stale"' in again.pages["rmsnorm/05-cluster-rows.md"]
    assert '!!! warning "Stale compiler facts"' in again.pages["rmsnorm/05-cluster-rows.md"]
    assert "--lineage rmsnorm" in again.pages["rmsnorm/05-cluster-rows.md"]
    assert again.pages["stages/01-baseline.md"] == out.pages["stages/01-baseline.md"]


def test_the_benchmark_writes_what_the_site_reads(monkeypatch):
    from bench import rowwise as bench

    monkeypatch.setenv("HOPATTN_GIT_COMMIT", "0" * 40)
    monkeypatch.setenv("HOPATTN_GIT_DIRTY", "0")
    assert bench.SIZES is records.SIZES
    entry = {"size": "4k", "rows": 32768, "cols": 4096, "dtype": "bf16", "arm": "stage 04", "kind": "stage",
             "bytes": 536870912, "variant": "row in registers", "status": "ok", "median_ms": 0.16, "min_ms": 0.15,
             "max_ms": 0.17, "spread_pct": 12.5, "samples": 5, "gbps": 3355.4, "vs": {"copy": 0.8}, "max_rel_err": None}
    data = bench.record([entry], {"gpu_name": "NVIDIA H200"}, "python -m bench.rowwise", {4: "a" * 16}, "nvidia-h200")
    records.validate(data)


def test_a_bad_record_names_its_file_and_field(rms_root):
    _record(rms_root, {"copy": 4200.0, "stage 04": 3360.0})
    path = rms_root / "bench" / "results" / "rmsnorm" / "nvidia-h200.json"
    data = json.loads(path.read_text())
    data["entries"][1]["gbps"] = -1
    path.write_text(json.dumps(data))
    with pytest.raises(records.RowResultsError, match=r"rmsnorm/nvidia-h200.json: field 'entries\[1\].gbps' must be "
                                                      r"a positive number \(got -1\)"):
        render(rms_root)


def test_deterministic_with_part_ii(rms_root, tmp_path):
    warm = render(rms_root)
    again = render(rms_root)
    cold = render(add_rmsnorm(make_site(tmp_path / "other")), use_cache=False)
    assert warm == again == cold
    assert [d.svg for s in STAGES for d in rowwise_diagrams(s, STAGES)] == \
        [d.svg for s in STAGES for d in rowwise_diagrams(s, STAGES)]


def test_a_bad_spec_names_its_file_and_field(rms_root):
    spec = rms_root / "kernels" / "rmsnorm" / "04_row-in-registers" / "stage.toml"
    spec.write_text(spec.read_text().replace("reads = 1 ", "reads = 2 ", 1))
    with pytest.raises(lineage.SpecError, match=r"rmsnorm/04_row-in-registers/stage.toml: field 'row.reads' must be 1"):
        render(rms_root)


def test_a_figure_that_fails_names_the_stage_and_its_spec(rms_root, monkeypatch):
    from site_gen.diagrams.rowwise import holders

    def broken(stage, stages=()):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(holders, "boxes", lambda lay: broken(None))
    with pytest.raises(site.SectionError, match=r"kernels/rmsnorm/01_row-per-thread/stage.toml: the diagrams of "
                                                r"RMSNorm stage 01-row-per-thread failed: ZeroDivisionError: planted "
                                                r"\(site_gen/diagrams/rowwise/"):
        render(rms_root, use_cache=False)


def test_without_facts_the_compiler_section_says_how_to_make_them(tmp_path):
    out = render(add_rmsnorm(make_site(tmp_path / "repo"), facts=False))
    page = out.pages["rmsnorm/02-warp-per-row.md"]
    assert '!!! note "No compiler facts yet"' in page and "python -m hopattn.compiler --lineage rmsnorm" in page
    assert "| [02 · A row per warp](02-warp-per-row.md#compiler) | — |" in out.pages["rmsnorm/index.md"]


# --- the figures against the spec ---------------------------------------------------------------


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_figures_read_without_clipping_or_overlap(stage):
    for d in rowwise_diagrams(stage, STAGES):
        assert text_problems(d.svg, d.width, d.height) == [], d.id
        assert d.svg.startswith("<svg") and f'id="{d.id}"' in d.svg and "<title" in d.svg


def test_who_holds_which_bytes_comes_from_the_spec():
    by = {(s.id, lay.label): lay for s in STAGES for lay in model.layouts(s)}
    one = by[("01", "256k")]
    assert (one.config.owner, one.thread_bytes, one.ctas, one.reads) == ("thread", 512 << 10, 8, 2)  # 8 CTAs of 132 SMs
    warp = by[("02", "256k")]
    assert (warp.thread_bytes, warp.thread_accesses, warp.ctas, warp.in_flight) == (16 << 10, 1024, 128, 64)
    held = by[("04", "64k")]
    assert (held.config.threads_per_row, held.thread_bytes, held.registers, held.reads) == (1024, 128, 32, 1)
    assert boxes(held)[0][1:3] == ("128 B of the row", "8 × 16 B, 32 registers")
    assert by[("04", "256k")].reads == 2 and by[("05", "256k")].reads == 1  # the cluster holds what one CTA cannot
    cluster = by[("05", "256k")]
    assert (cluster.config.cluster, cluster.cta_bytes, cluster.ctas) == (4, 128 << 10, 4096)
    assert boxes(cluster)[3][1] == "the whole row: 512 KiB"
    packed = by[("04", "4k")]
    assert (packed.config.threads_per_row, packed.config.rows_per_cta, packed.cta_bytes) == (64, 4, 32 << 10)


def test_the_reduction_tree_and_the_bytes_come_from_the_spec():
    assert level_text(model.layout(STAGES[0], "4k")) == "thread"
    assert level_text(model.layout(STAGES[1], "4k")) == "thread → warp"
    assert level_text(model.layout(STAGES[2], "4k")) == "thread → warp → CTA (16 warp sums)"
    assert level_text(model.layout(STAGES[4], "256k")) == "thread → warp → CTA (32 warp sums) → cluster (4 CTA sums)"
    assert [model.deepest(s).label for s in STAGES] == ["256k", "256k", "256k", "64k", "256k"]
    assert bound(model.layout(STAGES[2], "256k")) == (pytest.approx(2 / 3), 1.0)  # read twice: 0.67-1.00 x copy
    assert bound(model.layout(STAGES[3], "64k")) == (1.0, 1.0)
    svg = rowwise_diagrams(STAGES[2], STAGES)[2].svg
    assert "read twice: 4–6 B moved for 4 counted, ≤ 0.67–1.00× the copy" in svg and "bounds, not measurements" in svg


def test_the_instances_table_maps_each_length_to_its_instance():
    rows = instances.instance_rows(STAGES[4], compiler_facts.load(STAGES[4]))
    runs = {r["ints"]: r["lengths"] for r in rows if r["kernel"] == "rmsnorm_rows"}
    assert runs[(64, 8, 4, 1)] == ["4k"] and runs[(256, 8, 1, 1)] == ["16k"]
    assert runs[(1024, 8, 1, 1)] == ["64k"] and runs[(1024, 8, 1, 4)] == ["256k"]
    assert sum(len(r["dtypes"]) for r in rows) == 1 + len(compiler_facts.load(STAGES[4])["other_functions"])
