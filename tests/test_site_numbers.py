"""Benchmark tables and the progression chart, from the fixture site's results (the committed
numbers of its three real stages)."""

import pytest
from hopattn import lineage
from hopattn.records import results

from site_gen.benchmark_section import chart, tables


@pytest.fixture
def inputs(site_root):
    stages = lineage.discover(site_root / "kernels" / "attention")
    nums = results.load_indexed(site_root / "bench" / "results")[0]
    return stages, nums, {s.id: s.source_hash() for s in stages}


def test_stage_table_numbers_ratios_and_stale_mark(inputs):
    stages, nums, hashes = inputs
    first = nums.stage("01", "8k", False)
    fresh = tables.stage_table(stages[0], None, hashes, nums)
    assert "stale" not in fresh and f"| 8k | **{first['tflops']:.1f}**" in fresh
    assert f"{first['ratios']['fa4']:.2f}×" in fresh
    second = nums.stage("02", "8k", False)
    table = tables.stage_table(stages[1], stages[0], hashes, nums)
    assert "| vs 01 |" in table and f"{second['tflops'] / first['tflops']:.2f}×" in table
    assert "hd-stale" not in table
    old = dict(hashes, **{"02": "0" * 16})  # as if stage 02 had changed since it was measured
    stale = tables.stage_table(stages[1], stages[0], old, nums)
    assert "hd-stale" in stale and "0" * 16 in stale
    assert "| 8k causal | skipped |" in table and "no causal support" in table


def test_overview_tables_list_every_stage_and_the_references(inputs):
    stages, nums, hashes = inputs
    md = tables.overview_tables(stages, hashes, nums)
    for s in stages:
        assert f"(stages/{s.name}.md)" in md
    assert "FlashAttention-4 (CuTe DSL)" in md and "cuDNN (torch SDPA)" in md
    # no fixture stage has a causal path: one sentence with the peers' causal numbers for reference
    assert "**Causal**: no stage has a measured causal number yet. For reference, causal TFLOP/s" in md


def test_environment_names_gpu_and_software(inputs):
    _, nums, hashes = inputs
    env = tables.environment(nums)
    run = next(iter(nums.data["runs"].values()))["environment"]
    for text in (run["gpu_name"], f"{run['sm_count']} SMs", f"CUDA {run['cuda']}", f"torch {run['torch']}"):
        assert text in env
    assert "Sources:" not in env
    assert "3 of the 3 stages it timed match today's sources" in tables.environment(nums, hashes)
    assert "0 of the 3 stages" in tables.environment(nums, {k: "0" * 16 for k in hashes})


def test_chart_is_deterministic_svg(inputs):
    stages, nums, _ = inputs
    data = chart.progression_data(stages, nums)
    assert [x for x, _ in data["series"][False]["8k"]] == [1, 2, 3]
    assert data["series"][True] == {}  # every causal entry skipped
    a, b = chart.progression_svg(data), chart.progression_svg(data)
    assert a == b and a.lstrip().startswith("<?xml") and "<svg" in a
    assert "dc:date" not in a


def test_no_numbers_no_chart():
    assert chart.progression_svg({"series": {False: {}, True: {}}, "refs": {False: {}, True: {}}, "stages": []}) is None


def test_ratio_to_previous_stage_from_another_run_is_marked(inputs):
    stages, nums, hashes = inputs
    assert "hd-cross-run" not in tables.stage_table(stages[1], stages[0], hashes, nums)
    for e in nums.data["results"]:
        if e["kind"] == "stage" and e["name"] == "02":
            e["run_id"] = "another-run"
    crossed = tables.stage_table(stages[1], stages[0], hashes, nums)
    assert "hd-cross-run" in crossed and "timed in different runs" in crossed


def test_causal_stages_without_a_path_fold_into_one_sentence():
    stages = lineage.discover()  # the real lineage: only its later stages have a causal path
    nums = results.load_indexed(lineage.ATTENTION_DIR.parent.parent / "bench" / "results")[0]
    md = tables.overview_tables(stages, {s.id: s.source_hash() for s in stages}, nums)
    causal = md[md.index("**Causal**"):]
    without = [s for s in stages if not s.causal]
    assert f"Stages {tables._id_ranges([s.id for s in without])} have no causal path" in causal
    assert all(f"(stages/{s.name}.md)" not in causal for s in without)
    assert tables._id_ranges(["01", "02", "03", "07", "09", "10"]) == "01–03, 07, 09–10"
