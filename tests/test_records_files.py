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


def test_the_package_and_the_renderer_import_no_producer():
    """One direction of flow: bench/ imports hopattn, never the other way, and site_gen reads the
    records through hopattn.records (an import of bench from either would tie the site to the
    producers, or fail in silence where bench is not installed)."""
    import ast
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    bad = []
    for folder in (repo / "kernels" / "hopattn", repo / "site_gen"):
        for path in sorted(folder.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                bad += [f"{path.relative_to(repo)}:{node.lineno}: {n}" for n in names if n.split(".")[0] == "bench"]
    assert not bad, bad
