"""The one writer of record files: atomic, write-if-changed, one JSON form; reading names the file."""

import os

import pytest
from hopattn.records import files


def test_unchanged_content_is_not_rewritten(tmp_path):
    p = tmp_path / "a" / "record.json"
    assert files.write_if_changed(p, "hello")
    os.utime(p, (1, 1))
    assert not files.write_if_changed(p, "hello")
    assert p.stat().st_mtime == 1
    assert files.write_if_changed(p, "hello!")
    assert p.read_text() == "hello!"
    assert [x.name for x in p.parent.iterdir()] == ["record.json"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file(tmp_path):
    p = tmp_path / "record.json"
    p.write_text("old")
    with pytest.raises(TypeError):
        files.write_atomic(p, 42)
    assert p.read_text() == "old" and [x.name for x in tmp_path.iterdir()] == ["record.json"]


def test_one_json_form():
    assert files.dumps({"b": 1, "a": "µ"}) == '{\n "a": "µ",\n "b": 1\n}\n'
    with pytest.raises(ValueError):
        files.dumps({"x": float("nan")})


def test_read_json_names_the_file(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{")
    with pytest.raises(ValueError, match=r"bad.json: not valid JSON \(line 1"):
        files.read_json(p, ValueError)
    with pytest.raises(ValueError, match="absent.json: cannot read"):
        files.read_json(tmp_path / "absent.json", ValueError)
