"""Bad stage folders stop everything with a message naming the file, the field and the expectation."""

import shutil

import pytest
from hopattn import lineage

SOURCE = lineage.ATTENTION_DIR / "01_baseline"


def make_stage(root, name="01_baseline"):
    folder = root / name
    shutil.copytree(SOURCE, folder)
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
    ("[tile]", "[tiles]", "field 'tile' must be a table"),
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
