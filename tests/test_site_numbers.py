"""Benchmark tables and the progression chart, from the fixture results."""

from conftest import FIXTURES
from hopattn import lineage

from site_gen import numbers, plots, results_io


def fixture_inputs():
    stages = lineage.discover(FIXTURES / "lineage")
    nums = numbers.load_numbers(results_io.load_all(FIXTURES / "results"))[0]
    hashes = {s.id: s.source_hash() for s in stages}
    return stages, nums, hashes


def test_stage_table_ratios_and_stale_mark():
    stages, nums, hashes = fixture_inputs()
    fresh = numbers.stage_table(stages[0], None, hashes, nums)
    assert "stale" not in fresh and "| 4k | **100.0**" in fresh and "0.16×" in fresh
    stale = numbers.stage_table(stages[1], stages[0], hashes, nums)
    assert "hd-stale" in stale and hashes["02"] in stale
    assert "| vs 01 |" in stale and "2.00×" in stale  # 200 vs 100 TFLOP/s
    skipped = numbers.stage_table(stages[2], stages[1], hashes, nums)
    assert "skipped" in skipped and "no causal path" in skipped


def test_overview_tables_list_every_stage_and_the_references():
    stages, nums, hashes = fixture_inputs()
    md = numbers.overview_tables(stages, hashes, nums)
    for s in stages:
        assert f"(stages/{s.name}.md)" in md
    assert "FlashAttention-4 (CuTe DSL)" in md and "cuDNN (torch SDPA)" in md
    assert md.count("**Causal**") == 1


def test_environment_names_gpu_and_software():
    _, nums, _ = fixture_inputs()
    env = numbers.environment(nums)
    for text in ("NVIDIA H200", "132 SMs", "CUDA 13.0", "torch 2.11.0+cu130", "cuDNN 91900", "power limit 700 W"):
        assert text in env


def test_chart_is_deterministic_svg():
    stages, nums, _ = fixture_inputs()
    data = plots.progression_data(stages, nums)
    assert [x for x, _ in data["series"][False]["8k"]] == [1, 2, 3]
    assert [x for x, _ in data["series"][True]["8k"]] == [1, 2]  # stage 03 skipped causal
    a, b = plots.progression_svg(data), plots.progression_svg(data)
    assert a == b and a.lstrip().startswith("<?xml") and "<svg" in a
    assert "dc:date" not in a


def test_no_numbers_no_chart():
    assert plots.progression_svg({"series": {False: {}, True: {}}, "refs": {False: {}, True: {}}, "stages": []}) is None


def test_ratio_to_previous_stage_from_another_run_is_marked():
    stages, nums, hashes = fixture_inputs()
    same = numbers.stage_table(stages[1], stages[0], hashes, nums)
    assert "hd-cross-run" not in same
    for e in nums.data["results"]:
        if e["kind"] == "stage" and e["name"] == "02":
            e["run_id"] = "another-run"
    crossed = numbers.stage_table(stages[1], stages[0], hashes, nums)
    assert "hd-cross-run" in crossed and "timed in different runs" in crossed


def test_causal_table_folds_stages_without_a_causal_path_into_one_sentence():
    stages, nums, hashes = fixture_inputs()
    md = numbers.overview_tables(stages, hashes, nums)
    causal = md[md.index("**Causal**"):]
    assert f"(stages/{stages[2].name}.md)" not in causal  # stage 03 only ever skipped causal
    assert "Stage 03 has no causal path" in causal
    assert numbers._id_ranges(["01", "02", "03", "07", "09", "10"]) == "01–03, 07, 09–10"


def test_environment_counts_stages_timed_on_todays_sources():
    stages, nums, hashes = fixture_inputs()
    assert "Sources:" not in numbers.environment(nums)
    env = numbers.environment(nums, hashes)
    timed = {e["name"]: e["source_hash"] for e in nums.data["results"] if e.get("kind") == "stage"}
    same = sum(hashes.get(k) == h for k, h in timed.items())
    assert same < len(timed)  # the fixture has a stale stage
    assert f"{same} of the {len(timed)} stages it timed match today's sources" in env
