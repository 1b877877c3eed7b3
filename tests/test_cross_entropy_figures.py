"""Part II's figures for the cross-entropy lineage: each stage.toml's [[config]] against kernel.cu's
launcher (and the stage 02 kernels stages 03 and 04 include), the compiled instances and the committed
fused benchmark record's variants; and the three figures drawn from them for every stage, at the
benchmark's lengths (4k, 32k, 128k, 256k), in the lineage's words, legible and deterministic. Pure
Python: no GPU, no build."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from hopattn import cross_entropy_lineage, lineage, rowwise

from site_gen.diagrams.rowwise import holders, model, rowwise_diagrams
from site_gen.diagrams.svg import text_problems, wrap

STAGES = cross_entropy_lineage.discover()
IDS = [s.name for s in STAGES]
REPO = lineage.RMSNORM_DIR.parent.parent


def _svgs(stage) -> dict[str, str]:
    return {d.kind: d.svg for d in rowwise_diagrams(stage, STAGES)}


@pytest.mark.parametrize("stage", STAGES, ids=IDS)
def test_configs_match_the_launcher(stage):
    assert cross_entropy_lineage.config_mismatches(stage) == []
    assert cross_entropy_lineage.constant_mismatches(stage) == []
    held = [c for c in stage.spec.config if c.vectors]
    assert (rowwise.launcher_configs(stage.kernel_path.read_text()) is None) == (not held)
    assert stage.spec.config[-1].vectors == 0  # the last takes any row


def test_the_configs_are_the_kernels_constants():
    """What each stage's launcher does, from its constants: stage 01 a CTA of kThreads a row; stage 02 a
    warp a row up to kWarpMaxCols (kRowsPerCta a CTA), then a CTA of kCtaThreads, kUnroll loads in
    flight; stage 03 up to kMaxThreadsPerRow threads of kVectorsPerThread, then stage 02's CTA kernel;
    stage 04 CTAs of kMaxCtaThreads up to a cluster of kMaxCluster, then kLongCtaThreads; stage 05 as 04."""
    one, two, three, four, five = STAGES
    k1, k2 = one.constants(), two.constants()
    assert [(c.threads_per_row, c.reads, c.payload) for c in one.spec.config] == [(k1["kThreads"], 3, "max, then sum")]
    warp, cta = two.spec.config
    assert (warp.threads_per_row, warp.rows_per_cta, warp.max_cols, warp.unroll) == (
        32, k2["kRowsPerCta"], k2["kWarpMaxCols"], k2["kUnroll"])
    assert warp.cta_threads == k2["kThreads"] and (cta.threads_per_row, cta.unroll) == (k2["kCtaThreads"], k2["kUnroll"])
    assert {c.reads for c in two.spec.config} == {2} and {c.payload for c in two.spec.config} == {"(max, sum)"}
    for stage, most in ((three, "kMaxThreadsPerRow"), (four, "kLongCtaThreads"), (five, "kLongCtaThreads")):
        k = stage.constants()
        held = [c for c in stage.spec.config if c.vectors]
        assert max(c.vectors for c in held) == k["kVectorsPerThread"]
        assert max(c.threads_per_row for c in held) == k[most]
        assert all(c.rows_per_cta == max(1, k["kMinCtaThreads"] // c.threads_per_row) for c in held)
        assert stage.spec.config[-1] == cta  # longer rows: stage 02's CTA-per-row kernel, included
    assert max(c.cluster for c in four.spec.config) == four.constants()["kMaxCluster"]
    assert {c.threads_per_row for c in four.spec.config if c.cluster > 1} == {
        four.constants()["kMaxCtaThreads"], four.constants()["kLongCtaThreads"]}
    assert [(c.threads_per_row, c.vectors, c.rows_per_cta, c.cluster) for c in five.spec.config] == [
        (c.threads_per_row, c.vectors, c.rows_per_cta, c.cluster) for c in four.spec.config]  # 04's table


def test_a_row_goes_to_the_first_config_that_holds_it():
    one, two, three, four, *_ = STAGES
    assert [two.spec.config_for(n).threads_per_row for n in (1024, 1025)] == [32, 512]
    assert [three.spec.config_for(n).threads_per_row for n in (256, 2048, 4096, 32768)] == [32, 32, 64, 512]
    assert three.spec.config_for(32769).vectors == 0 and three.spec.config_for(32769).reads == 2
    assert [four.spec.config_for(n).cluster for n in (16384, 32768, 65536, 131072, 262144)] == [1, 2, 4, 8, 8]
    assert [four.spec.config_for(n).threads_per_row for n in (131072, 131073, 262144)] == [256, 512, 512]
    assert four.spec.config_for(262145).vectors == 0


def test_every_config_is_a_compiled_bf16_instance():
    """Each [[config]] against the committed compiler facts: a held one by its template arguments <T,
    threads per row, vectors, rows per CTA[, cluster]>, stage 02's kernel by <T, 8, threads per row>
    (16-byte loads), stage 01's by its one instance <T>."""
    from hopattn.compiler.facts import _INT_ARG_RE, _matches_kernel, instance_dtype
    from hopattn.records import compiler_facts

    for stage in STAGES:
        facts = compiler_facts.load(stage)
        instances = [(f["function"], tuple(int(n) for n in _INT_ARG_RE.findall(f["function"])))
                     for f in [facts, *facts["other_functions"]] if instance_dtype(f["function"]) == "bf16"]
        for i, c in enumerate(stage.spec.config):
            mine = [ints for fn, ints in instances if _matches_kernel(fn, c.kernel)]
            assert mine, (stage.name, i, c.kernel)
            if c.vectors:
                assert (c.threads_per_row, c.vectors, c.rows_per_cta, c.cluster) in mine or (
                    c.threads_per_row, c.vectors, c.rows_per_cta) in mine, (stage.name, i, mine)
            elif c.kernel == "cross_entropy_online":
                assert (8, c.threads_per_row) in mine, (stage.name, i, mine)
            else:
                assert () in mine, (stage.name, i, mine)


def test_the_figures_rows_are_the_benchmarks():
    from bench import rowwise_cross_entropy

    assert model.lengths(STAGES[0]) == ("4k", "32k", "128k", "256k")
    for label in model.lengths(STAGES[0]):
        assert model.SIZES_OF["cross_entropy"][label] == rowwise_cross_entropy.SIZES[label]


@pytest.mark.parametrize("stage", STAGES, ids=IDS)
def test_the_configs_are_what_the_benchmark_ran(stage):
    """The configuration the figures deal each length to is the one the committed fused H200 run reports
    having launched (its entries' variant); for a stage the latest run did not bench (a run of some stages
    only, `--stages 4-5`), the one the fused lines of the log its notes' "## Measured" quotes report."""
    data = json.loads((REPO / "bench" / "results" / "cross_entropy_fused" / "nvidia-h200.json").read_text())
    variants = {e["size"]: e["variant"] for e in data["entries"] if e["arm"] == f"stage {stage.id}" and "variant" in e}
    notes = stage.notes_path.read_text()
    if stage == STAGES[-1] and not variants and "**Not measured yet.**" in notes:
        pytest.skip(f"{stage.name} awaits its GPU run (research/cross_entropy/gpu_run.sh)")
    if not variants:  # measured by an earlier run: its log's fused lines end with the variant
        measured = notes[notes.index("## Measured"):]
        log = re.findall(r"`(bench/logs/[^`]+\.log)`", measured)[0]
        line = re.compile(rf"\] fused (\d+k) stage {stage.id} .* err \S+\s+(.+)$")
        variants = {m.group(1): m.group(2).strip() for m in map(line.search, (REPO / log).read_text().splitlines()) if m}
    assert set(variants) >= set(model.lengths(stage))
    for lay in model.layouts(stage):
        v, c = variants[lay.label], lay.config
        if c.vectors:
            assert f"{c.threads_per_row} threads/row, {c.vectors} vectors" in v, (lay.label, v, c)
            # the ABI's variant is 64 bytes: stage 05's longer label is cut before the cluster's number
            # (its notes say so; the build log's describe gives the cluster whole)
            assert ", cluster " not in v or f"cluster {c.cluster}" in v or len(v) == 63, (lay.label, v, c)
        else:
            assert ("CTA per row" if c.threads_per_row > 32 else "warp per row") in v, (lay.label, v)
            assert ("three passes" in v) == (c.reads == 3), (lay.label, v)


def test_a_wrong_config_fails_loudly(tmp_path):
    dest = tmp_path / "cross_entropy" / STAGES[3].dir.name
    shutil.copytree(STAGES[3].dir, dest)
    text = (dest / "stage.toml").read_text()
    (dest / "stage.toml").write_text(text.replace("threads_per_row = 512\nvectors = 8\ncluster = 8",
                                                  "threads_per_row = 1024\nvectors = 8\ncluster = 8"))
    with pytest.raises(lineage.SpecError, match=r"04_cluster-rows/stage.toml: field 'config\[10\].rows_per_cta' "
                                                r"must be at most"):
        cross_entropy_lineage.load_stage(dest)
    (dest / "stage.toml").write_text(text.replace("threads_per_row = 128\nvectors = 8\nrows_per_cta = 2",
                                                  "threads_per_row = 128\nvectors = 8\nrows_per_cta = 4", 1))
    found = cross_entropy_lineage.config_mismatches(cross_entropy_lineage.load_stage(dest))
    assert any("config[5].rows_per_cta = 4, kernel.cu's Config has 2" in f for f in found), found
    one = tmp_path / "cross_entropy" / STAGES[0].dir.name
    shutil.copytree(STAGES[0].dir, one)
    text = (one / "stage.toml").read_text()
    (one / "stage.toml").write_text(text.replace('reduce = "max, then sum"\n', ""))
    found = cross_entropy_lineage.config_mismatches(cross_entropy_lineage.load_stage(one))
    assert any("config[0].reduce = '(max, sum)', but cross_entropy_three_passes reduces the max alone" in f
               for f in found), found


@pytest.mark.parametrize("stage", STAGES, ids=IDS)
def test_every_stage_has_its_three_figures_legible(stage):
    ds = rowwise_diagrams(stage, STAGES)
    assert [d.kind for d in ds] == ["holders", "reduction", "traffic"]
    assert [d.id for d in ds] == [f"ce{stage.id}-{k}" for k in ("holders", "reduction", "traffic")]
    for d in ds:
        assert text_problems(d.svg, d.width, d.height) == [], d.id
        assert d.svg.startswith("<svg") and f'id="{d.id}"' in d.svg and "Cross-entropy" in d.title
        assert "bf16" in d.svg and "RMSNorm" not in d.svg and "Softmax" not in d.svg, d.id
    holders_svg, reduction_svg, traffic_svg = (d.svg for d in ds)
    for lay in model.layouts(stage):  # the row lengths and the configuration each runs
        assert f">{lay.label}<" in holders_svg and model.config_label(lay.config) in holders_svg, lay.label
        assert len(wrap(holders.where_of(lay, model.OPS["cross_entropy"], stage), holders.W - 12 - holders.BOX_X,
                        12)) <= 2
    assert "rows of 4k, 32k, 128k and 256k columns" in ds[0].caption
    assert f"of a {model.deepest(stage).label} row (bf16)" in reduction_svg
    assert "2 streams of 2 B an element: logits read, dlogits written (4 B, what GB/s counts)" in traffic_svg
    assert "16 B a row" in ds[2].caption


def test_the_figures_show_what_each_stage_changed():
    s1, s2, s3, s4, s5 = (_svgs(s) for s in STAGES)
    assert "the max, then the sums, of a 256k row" in s1["reduction"] and "Two trees" in s1["reduction"]
    assert "read three times: 4–8 B moved for 4 counted" in s1["traffic"]
    assert "1 in flight" in s1["holders"] and "loads of 2 B" in s1["holders"]  # an element an access
    assert "loads of 16 B, 4 in flight" in s2["holders"] and "read twice" in s2["traffic"]
    for svgs in (s2, s3, s4, s5):
        assert "statistics (m, s, Σ x)" in svgs["reduction"] and "32 lane records merged" in svgs["reduction"]
        assert "Σx + Σx′" in svgs["reduction"]
    assert "held in registers" in s3["holders"] and "read once" in s3["traffic"] and "read twice" in s3["traffic"]
    assert "a cluster of 8 CTAs × 512 threads a row" in s4["holders"] and "cluster (8 CTA records)" in s4["reduction"]
    assert "read twice" not in s4["traffic"]
    assert "a cluster of 8 CTAs × 512 threads a row" in s5["holders"] and "read twice" not in s5["traffic"]  # 04's rows


def test_deterministic():
    for s in STAGES:
        assert rowwise_diagrams(s, STAGES) == rowwise_diagrams(s, STAGES)
        assert [d.svg for d in rowwise_diagrams(s, STAGES)] == [d.svg for d in rowwise_diagrams(s, list(STAGES))]
