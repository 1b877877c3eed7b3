"""Each stage.toml against its kernel.cu: a diagram cannot drift from the code it draws."""

import re

import pytest
from hopattn import cpp, lineage

STAGES = lineage.discover()


def ids(stages):
    return [s.name for s in stages]


def test_numbering_is_contiguous():
    assert [s.number for s in STAGES] == list(range(1, len(STAGES) + 1))


@pytest.mark.parametrize("stage", STAGES, ids=ids(STAGES))
def test_tile_and_threads_match_the_source(stage):
    c = stage.constants()
    assert c["HEAD_DIM"] == stage.head_dim == 128
    assert c["BLOCK_M"] == stage.block_m
    assert c["BLOCK_N"] == stage.block_n
    assert c["NUM_THREADS"] == stage.threads
    assert c.get("KV_STAGES", 1) == stage.kv_stages


@pytest.mark.parametrize("stage", STAGES, ids=ids(STAGES))
def test_shared_memory_matches_the_source(stage):
    assert stage.constants().get("SMEM_BYTES", 0) == stage.smem_bytes


@pytest.mark.parametrize("stage", STAGES, ids=ids(STAGES))
def test_launch_uses_the_declared_kernel_and_threads(stage):
    src = stage.kernel_path.read_text()
    # (stage 24 on: the constant of the kernel's class template, Attention<D>::NUM_THREADS)
    assert re.search(rf"__global__ void __launch_bounds__\((?:\w+<\w+>::)?NUM_THREADS[^)]*\)\s+{stage.kernel}\(", src)
    # Launched by name, or (a template) through a variable holding one of its instantiations.
    direct = f"{stage.kernel}<<<" in src
    chosen = re.search(rf"const auto (\w+) = [^;]*{stage.kernel}<[^;]*;", src)
    assert direct or (chosen and f"{chosen.group(1)}<<<grid, NUM_THREADS" in src)


@pytest.mark.parametrize("stage", STAGES, ids=ids(STAGES))
def test_notes_and_change_are_written(stage):
    assert stage.change.endswith(".")
    notes = stage.notes_path.read_text()
    assert notes.startswith("# "), f"{stage.notes_path} must start with a title"


def test_every_key_is_declared_once():
    """One typed spec: each table's keys declared with their type, no key in two tables (a fact the
    spec states twice can disagree with itself), and no table has a 'persistent' key: launch.grid
    says it."""
    keys = lineage.spec_keys()
    assert set(keys) == {"", "[tile]", "[launch]", "[supports]", "[pipeline]", "[movement]", "[diagram]",
                         "[[roles]]", "[[smem]]", "[[schedule]]"}
    leaves = [name for table, rows in keys.items() for name, expected, _ in rows
              if table not in ("[[roles]]", "[[smem]]", "[[schedule]]") and expected != "a table"
              and expected != "an array of tables"]
    assert len(leaves) == len(set(leaves)), sorted(n for n in leaves if leaves.count(n) > 1)
    assert "persistent" not in leaves and all(expected for rows in keys.values() for _, expected, _ in rows)


@pytest.mark.parametrize("stage", STAGES, ids=ids(STAGES))
def test_persistent_is_the_grid(stage):
    """launch.grid = "num_sms" is the one statement of it (a [diagram] persistent key is an error)."""
    assert stage.persistent == (stage.grid == "num_sms") == (stage.number >= 14)
    assert "gridDim.x" in stage.kernel_path.read_text() or not stage.persistent  # it walks the tiles


def test_sm80_stages_use_no_hopper_instructions():
    for s in STAGES:
        if s.arch == "sm_80":
            for path in s.source_files():
                text = path.read_text()
                for word in ("wgmma", "setmaxnreg", "cp.async.bulk", "mbarrier"):
                    assert word not in text, f"{path} uses {word} but {s.name} is declared sm_80"


def test_source_hash_follows_headers(tmp_path):
    (tmp_path / "common").mkdir()
    header = tmp_path / "common" / "h.cuh"
    header.write_text("int x;")
    kernel = tmp_path / "kernel.cu"
    kernel.write_text('#include "common/h.cuh"\n')
    before = lineage.source_hash(kernel)
    header.write_text("int y;")
    assert lineage.source_hash(kernel) != before


def test_constants_parser_evaluates_expressions():
    src = "constexpr int A = 4;\n  constexpr int B = A * (3 + 1) / 2;\nconstexpr int C = f(A);\n"
    assert cpp.constants(src) == {"A": 4, "B": 8}


def test_source_hash_does_not_depend_on_where_the_lineage_is(tmp_path):
    import shutil

    stage = STAGES[1]
    shutil.copytree(lineage.ATTENTION_DIR / "common", tmp_path / "common")
    shutil.copytree(stage.dir, tmp_path / stage.dir.name)
    assert lineage.load_stage(tmp_path / stage.dir.name).source_hash() == stage.source_hash()


def test_parse_selection():
    assert lineage.parse_selection("1,3-4 7", [1, 2, 3, 4, 7]) == [1, 3, 4, 7]
    assert lineage.select(STAGES, []) == STAGES and [s.number for s in lineage.select(STAGES, ["2-3"])] == [2, 3]
    with pytest.raises(ValueError, match="runs backwards"):
        lineage.parse_selection("4-3", [3, 4])
