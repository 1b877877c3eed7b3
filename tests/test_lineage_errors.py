"""Bad stage folders stop everything with a message naming the file, the field and the expectation."""

import re
import shutil

import pytest
from hopattn import lineage

SOURCE = lineage.ATTENTION_DIR / "01_baseline"
PERSISTENT = lineage.ATTENTION_DIR / "14_persistent"  # has [[smem]] and launch.grid


def make_stage(root, name="01_baseline", source=SOURCE):
    folder = root / name
    shutil.copytree(source, folder)
    return folder


def edit(folder, old, new):
    path = folder / "stage.toml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_a_copy_of_a_real_stage_loads(tmp_path):
    make_stage(tmp_path)
    assert [s.name for s in lineage.discover(tmp_path)] == ["01-baseline"]


@pytest.mark.parametrize("old, new, message", [
    ("block_m = 128", "block_m = -1", "field 'tile.block_m' must be a positive integer"),
    ("block_m = 128", "block_m = true", "field 'tile.block_m' must be a positive integer"),
    ('arch = "sm_80"', 'arch = "sm_100"', "field 'arch' must be one of sm_80, sm_90a"),
    ("threads = 128", "threads = 100", "field 'launch.threads' must be a multiple of 32"),
    ('title = "Baseline"\n', "", "field 'title' must be a non-empty string"),
    ("warps = [0, 1, 2, 3]", "warps = [0, 1, 2]", "assign each of the 4 warps"),
    ('unit = "tensor"', 'unit = "gpu"', "field 'schedule[1].unit' must be one of"),
    ('after = ["load_k"]', 'after = ["nothing"]', "names 'nothing', which is no op"),
    ("[tile]", "[tiles]", "tiles: unknown key (known: title, change, arch, kernel, tile,"),
    ("[tile]\n", "[pipeline.extra]\n[tile]\n", "[pipeline].extra: unknown key (known: kv_stages)"),
    ("registers = 0", "registers = 12", "setmaxnreg budget"),
])
def test_invalid_field_is_named(tmp_path, old, new, message):
    folder = make_stage(tmp_path)
    edit(folder, old, new)
    with pytest.raises(lineage.SpecError) as err:
        lineage.discover(tmp_path)
    assert str(folder / "stage.toml") in str(err.value)
    assert message in str(err.value)


def test_invalid_toml_is_reported(tmp_path):
    folder = make_stage(tmp_path)
    (folder / "stage.toml").write_text("title = \n")
    with pytest.raises(lineage.SpecError, match="not valid TOML"):
        lineage.discover(tmp_path)


def test_gap_in_numbering_is_reported(tmp_path):
    make_stage(tmp_path)
    make_stage(tmp_path, "03_later")
    with pytest.raises(lineage.SpecError, match="expected 02 here"):
        lineage.discover(tmp_path)


def test_missing_file_is_reported(tmp_path):
    folder = make_stage(tmp_path)
    (folder / "notes.md").unlink()
    with pytest.raises(lineage.SpecError, match="missing notes.md"):
        lineage.discover(tmp_path)


def test_bad_folder_name_is_reported(tmp_path):
    make_stage(tmp_path, "1_Baseline")
    with pytest.raises(lineage.SpecError, match="NN_slug"):
        lineage.discover(tmp_path)


# --- every key of every table is declared: a typo is an error, never a default ------------------


@pytest.mark.parametrize("source, old, new, where", [
    (SOURCE, 'kernel = "attention_kernel"\n', 'kernel = "attention_kernel"\ntitel = "Baseline"\n', "titel"),
    (SOURCE, "head_dim = 128", "head_dim = 128\nblock_k = 64", "[tile].block_k"),
    (SOURCE, "threads = 128", "threads = 128\ngrids = \"num_sms\"", "[launch].grids"),
    (SOURCE, "tails = false", "tails = false\nmask = true", "[supports].mask"),
    (SOURCE, "kv_stages = 1", "kv_stages = 1\nq_stages = 2", "[pipeline].q_stages"),
    (SOURCE, 'o_store = "st.global"', 'o_store = "st.global"\nk_load = "tma"', "[movement].k_load"),
    (SOURCE, "q_in_registers = false", "q_in_registers = false\npersistnt = true", "[diagram].persistnt"),
    (SOURCE, "q_in_registers = false", "q_in_registers = false\npersistent = true", "[diagram].persistent"),
    (SOURCE, "registers = 0", "registers = 0\nregister = 24", "[[roles]][0].register"),
    (PERSISTENT, 'layout = "mbarrier"', 'layout = "mbarrier"\nbuffer = 2', "[[smem]][3].buffer"),
    (SOURCE, 'after = ["load_k"]', 'after = ["load_k"]\nrow = 32', "[[schedule]][1].row"),
], ids=["top", "tile", "launch", "supports", "pipeline", "movement", "diagram", "diagram-persistent",
        "roles", "smem", "schedule"])
def test_unknown_key_is_named_with_the_known_ones(tmp_path, source, old, new, where):
    folder = make_stage(tmp_path, source=source)
    edit(folder, old, new)
    with pytest.raises(lineage.SpecError) as err:
        lineage.discover(tmp_path)
    table = re.sub(r"\[\d+\]$", "", where.rpartition(".")[0])  # '[[roles]][0].register' -> '[[roles]]'
    known = ", ".join(name for name, _, _ in lineage.spec_keys()[table])
    assert str(err.value) == f"{folder / 'stage.toml'}: {where}: unknown key (known: {known})"


@pytest.mark.parametrize("source, old, new, message", [
    (SOURCE, 'title = "Baseline"', "title = 1", "field 'title' must be a non-empty string (got 1)"),
    (SOURCE, "head_dim = 128", 'head_dim = "128"', "field 'tile.head_dim' must be a positive integer (got '128')"),
    (SOURCE, "threads = 128", 'threads = 128\ngrid = "all_sms"', "field 'launch.grid' must be one of tiles, num_sms"),
    (SOURCE, "threads = 128", "threads = 128\ncluster = 0", "field 'launch.cluster' must be a positive integer"),
    (SOURCE, "causal = false", "causal = 0", "field 'supports.causal' must be true or false (got 0)"),
    (SOURCE, 'layouts = ["bhsd"]', 'layouts = "bhsd"', "field 'supports.layouts' must be a list drawn from"),
    (SOURCE, "tails = false", "tails = false\ngqa = 1", "field 'supports.gqa' must be true or false"),
    (SOURCE, "kv_stages = 1", "kv_stages = 1.0", "field 'pipeline.kv_stages' must be a positive integer (got 1.0)"),
    (SOURCE, 'kv_load = "ld.global"', "kv_load = 4", "field 'movement.kv_load' must be a non-empty string (got 4)"),
    (SOURCE, 'o_store = "st.global"', "o_store = []", "field 'movement.o_store' must be a non-empty string or a list"),
    (SOURCE, "q_in_registers = false", 'q_in_registers = "no"', "field 'diagram.q_in_registers' must be true or false"),
    (SOURCE, "q_in_registers = false", 'p_operand = "tmem"', "field 'diagram.p_operand' must be one of smem, registers"),
    (SOURCE, "q_in_registers = false", "pv_n = -64", "field 'diagram.pv_n' must be a positive integer"),
    (SOURCE, "[diagram]", "[[diagram]]", "field 'diagram' must be a table (got [{'q_in_registers': False}])"),
    (SOURCE, 'tasks = ["Q', 'tasks = [1, "Q', "field 'roles[0].tasks' must be a list of strings (got [1, "),
    (SOURCE, "warps = [0, 1, 2, 3]", "warps = [0, 1, 2, 7]", "field 'roles[0].warps' must be a list of warp indices below 4"),
    (PERSISTENT, "buffers = 4", "buffers = 0", "field 'smem[1].buffers' must be a positive integer (got 0)"),
    (PERSISTENT, "shape = [1]", "shape = [1.5]", "field 'smem[3].shape' must be a list of positive integers"),
    (SOURCE, 'after = ["load_k"]', 'after = ["load_k"]\nrows = "32"', "field 'schedule[1].rows' must be a positive integer (got '32')"),
    (SOURCE, 'after = ["load_k"]', "after = [1]", "field 'schedule[1].after' must be a list of strings"),
    (SOURCE, 'role = "compute"', 'role = "computer"', "field 'schedule[0].role' must be one of compute (got 'computer')"),
], ids=["top", "tile", "launch-grid", "launch-cluster", "supports", "supports-layouts", "supports-gqa", "pipeline",
        "movement", "movement-o-store", "diagram", "diagram-p-operand", "diagram-pv-n", "diagram-table",
        "roles", "roles-warps", "smem", "smem-shape", "schedule-rows", "schedule-after", "schedule-role"])
def test_wrong_type_is_named(tmp_path, source, old, new, message):
    folder = make_stage(tmp_path, source=source)
    edit(folder, old, new)
    with pytest.raises(lineage.SpecError) as err:
        lineage.discover(tmp_path)
    assert str(err.value).startswith(f"{folder / 'stage.toml'}: {message}")


def test_optional_tables_and_keys_take_their_declared_defaults(tmp_path):
    folder = make_stage(tmp_path)
    text = (folder / "stage.toml").read_text()
    start, end = text.index("# How each operand travels"), text.index("[[roles]]")
    (folder / "stage.toml").write_text(text[:start] + text[end:])
    stage = lineage.discover(tmp_path)[0]
    assert stage.movement == lineage.Movement() and stage.diagram == lineage.Diagram()
    assert stage.diagram.q_in_registers and stage.grid == "tiles" and stage.cluster == 1 and not stage.persistent
    assert all(op.rows is None for op in stage.schedule) and stage.smem == ()
