"""Benchmark tables and the progression chart, from the fixture site's results (the committed
numbers of its three real stages)."""

import pytest
from hopattn import lineage
from hopattn.records import results

from site_gen.benchmark_section import chart, headline, tables

REPO = lineage.ATTENTION_DIR.parent.parent


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
    for key, ratio in first["ratios"].items():  # every reference peer of its run, and only those
        assert f"{ratio:.2f}×" in fresh, key
    second = nums.stage("02", "8k", False)
    table = tables.stage_table(stages[1], stages[0], hashes, nums)
    assert "| vs 01 |" in table and f"{second['tflops'] / first['tflops']:.2f}×" in table
    assert "hd-stale" not in table
    old = dict(hashes, **{"02": "0" * 16})  # as if stage 02 had changed since it was measured
    stale = tables.stage_table(stages[1], stages[0], old, nums)
    assert "hd-stale" in stale and "0" * 16 in stale
    assert "8k causal" in table and "Not run (" in table and "| 8k causal | skipped |" not in table


def test_overview_tables_list_every_stage_and_the_references(inputs):
    stages, nums, hashes = inputs
    md = tables.overview_tables(stages, hashes, nums)
    for s in stages:
        assert f"(stages/{s.name}.md)" in md
    peers = {e["label"] for e in nums.data["results"] if e["kind"] == "peer" and e["status"] == "ok"
             and e["shape"] in ("4k", "8k", "16k")}
    for label in peers:
        assert f"*{label}*" in md
    assert "in the same run" in md
    # the users' shapes are not in the lineage table
    assert "512x64" not in md and "32k" not in md.split("\n")[1]


def test_every_ratio_is_to_a_peer_of_the_same_run():
    """The headline and the tables name the fastest reference peer of the entry's own run."""
    real = lineage.discover()
    nums = results.load_indexed(lineage.ATTENTION_DIR.parent.parent / "bench" / "results")[0]
    hashes = {s.id: s.source_hash() for s in real}
    by = {s.number: s for s in real}
    e19, e18 = nums.stage("19", "8k", False), nums.stage("18", "8k", False)
    key, ratio = headline.best_peer(e19, nums)
    assert ratio == e19["ratios"][key]
    assert key == _fastest_peer(nums, e19)  # the fastest peer of its run, by median TFLOP/s
    names = {"fa3": "FlashAttention-3", "fa4": "FlashAttention-4", "cudnn": "cuDNN"}
    cards = headline.headline(by[19], by[18], hashes, [nums])
    assert f"{ratio:.3f}× {names[key]}, same run" in cards
    assert ("timed in another run" in cards) == (e18["run_id"] != e19["run_id"])
    key18, ratio18 = headline.best_peer(e18, nums)
    assert set(e18["ratios"]) <= {"fa3", "fa4", "cudnn"}  # ratios only to peers timed in 18's own run
    assert f"{ratio18:.3f}× {names[key18]}, same run" in headline.headline(by[18], by[17], hashes, [nums])
    assert "no causal path" in headline.headline(by[12], by[11], hashes, [nums])
    md = tables.overview_tables(real, hashes, nums)
    short = {"fa3": "FA3", "fa4": "FA4", "cudnn": "cuDNN"}
    assert f"{ratio:.2f}× {short[key]}" in md and f"{ratio18:.2f}× {short[key18]}" in md


def _fastest_peer(nums, entry) -> str:
    """The reference peer with the highest median TFLOP/s in the entry's own run, shape and mask: from
    the results file, or, where a later run replaced that run's peers there, from the run's log."""
    peers = {k: nums.peer(k, entry["shape"], entry["causal"]) for k in entry["ratios"]}
    speeds = {k: p["tflops"] for k, p in peers.items() if p and p["status"] == "ok" and p["run_id"] == entry["run_id"]}
    if len(speeds) < len(peers):
        from quoted_numbers import Records, parse_log

        log = Records.load().log_of_run(entry["run_id"])
        assert log, f"no log of run {entry['run_id']}"
        table = parse_log((REPO / "bench" / "logs" / log).read_text())
        speeds = {k: table[("peer", k, entry["shape"], entry["causal"])]["tflops"] for k in peers}
    return max(speeds, key=speeds.get)


def test_the_fastest_peer_is_the_fastest_by_tflops_not_the_smallest_ratio():
    """At 16k causal FA3 ran faster than FA4 (median TFLOP/s) in run 20261201T181312Z, while stages 17
    and 18 have a smaller per-round-median ratio to FA4: the cells name FA3, with the ratio to FA3,
    though a later run has replaced that run's peers in the file (their logs say who was fastest)."""
    real = lineage.discover()
    nums = results.load_indexed(lineage.ATTENTION_DIR.parent.parent / "bench" / "results")[0]
    hashes = {s.id: s.source_hash() for s in real}
    md = tables.overview_tables(real, hashes, nums)
    rows = {line.split("]")[0].lstrip("| ["): line for line in md.splitlines() if line.startswith("| [")}
    swapped = 0
    for s in real:
        for shape in ("4k", "8k", "16k"):
            for causal in (False, True):
                e = nums.stage(s.id, shape, causal)
                if e is None or e["status"] != "ok":
                    continue
                key, ratio = headline.best_peer(e, nums)
                assert key == _fastest_peer(nums, e) and ratio == e["ratios"][key], (s.id, shape, causal)
                swapped += key != min(e["ratios"], key=e["ratios"].get)
    assert swapped >= 2  # 17 and 18 at 16k causal at least, as recorded
    e17 = nums.stage("17", "16k", True)
    assert headline.best_peer(e17, nums)[0] == "fa3" and min(e17["ratios"], key=e17["ratios"].get) == "fa4"
    row = next(v for k, v in rows.items() if k.startswith("17 "))
    assert f"{e17['ratios']['fa3']:.2f}× FA3" in row and f"{e17['ratios']['fa4']:.2f}× FA4" not in row


def test_users_shapes_table():
    real = lineage.discover()
    nums = results.load_indexed(lineage.ATTENTION_DIR.parent.parent / "bench" / "results")[0]
    md = tables.users_tables(real, {s.id: s.source_hash() for s in real}, nums)
    for shape in ("32k", "512x64", "odd", "512x32k", "8k-bshd", "8k-gqa"):
        assert f"`{shape}`" in md
    assert "a single long sequence" in md and "B1 H16 L32768 D128" in md
    assert "(stages/17-causal.md)" in md and "(stages/16-tile-shape.md)" not in md  # the full-contract stages
    wrong = [e for e in nums.data["results"] if e["status"] == "wrong" and e["shape"] not in ("4k", "8k", "16k")]
    assert ("wrong" in md) == bool(wrong)  # a wrong result says so instead of a number


def test_head_dims_have_a_view_of_their_own():
    real = lineage.discover()
    nums = results.load_indexed(lineage.ATTENTION_DIR.parent.parent / "bench" / "results")[0]
    hashes = {s.id: s.source_hash() for s in real}
    md = tables.head_dim_tables(real, hashes, nums)
    measured = [sh for sh in nums.shapes() if "-d" in sh]
    assert measured, "the committed record has head-dim points"
    rows = [line.split("|")[1].strip(" `") for line in md.splitlines() if line.startswith("| `")]
    half = rows[:len(rows) // 2]  # the non-causal table; the causal one repeats the shapes
    assert half == measured and rows[len(rows) // 2:] == measured
    dims = [int(sh.split("-d")[1].split("v")[0]) for sh in measured]
    assert dims == sorted(dims), "the head dims in order, 64 first"
    assert "head dim 192 (v 128)" in md and "D192 Dv128" in md
    assert "(stages/24-head-dims.md)" in md and "(stages/21-deferred-max.md)" not in md
    assert not any(f"`{sh}`" in tables.users_tables(real, hashes, nums) for sh in measured)  # not among the users' shapes


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
    a, b = chart.progression_diagram(data, "GPU"), chart.progression_diagram(data, "GPU")
    assert a == b and a.svg.startswith("<svg") and "var(--hd-" in a.svg and ">causal:" not in a.svg
    assert "01 Baseline" in a.svg  # stage names on the axis


def test_chart_marks_regressions_and_labels_peers():
    real = lineage.discover()
    nums = results.load_indexed(lineage.ATTENTION_DIR.parent.parent / "bench" / "results")[0]
    data = chart.progression_data(real, nums)
    drops = dict(chart.regressions(data["series"][False]["8k"]))
    assert 3 in drops and 11 in drops and 12 in drops  # 02 → 03, 10 → 11 → 12
    d = chart.progression_diagram(data, nums.gpu_name)
    for change in drops.values():
        assert f"{change * 100:.0f} %" in d.svg
    assert ">FA3<" in d.svg and ">cuDNN<" in d.svg  # the peers' columns
    assert f"causal: stages 17–{real[-1].number}" in d.svg


def test_chart_sets_each_shape_against_the_peers_at_that_shape():
    """Like with like: per panel and shape, the dashed line is the fastest peer at that very shape
    (the causal 16k line against the peers' 16k, not their 8k)."""
    real = lineage.discover()
    nums = results.load_indexed(lineage.ATTENTION_DIR.parent.parent / "bench" / "results")[0]
    data = chart.progression_data(real, nums)
    svg = chart.progression_diagram(data, nums.gpu_name).svg
    short = {"fa3": "FA3", "fa4": "FA4", "cudnn": "cuDNN"}
    for causal in (False, True):
        best = chart.fastest_peers(data, causal)
        for shape in chart.SHAPES:
            timed = {k: nums.peer(k, shape, causal)["tflops"] for k in short if nums.peer(k, shape, causal)}
            key = max(timed, key=timed.get)
            assert best[shape] == (key, timed[key])
            assert f">{shape}: {short[key]} {timed[key]:.0f}<" in svg


def test_no_numbers_no_chart():
    empty = {"series": {False: {}, True: {}}, "refs": {False: {}, True: {}}, "runs": {False: {}, True: {}},
             "stages": []}
    assert chart.progression_diagram(empty, "GPU") is None


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
    without = [s for s in stages if not s.causal]
    assert f"Stages {tables._id_ranges([s.id for s in without])} have no causal path" in md
    row = next(line for line in md.splitlines() if "(stages/01-baseline.md)" in line)
    assert row.count("| – ") == 3  # no causal numbers: a dash, not "skipped"
    assert tables._id_ranges(["01", "02", "03", "07", "09", "10"]) == "01–03, 07, 09–10"
