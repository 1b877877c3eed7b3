"""Write-if-changed, atomic, and pruning of files the generator no longer makes."""

import os

from site_gen.writer import write_if_changed, write_tree


def test_unchanged_content_is_not_rewritten(tmp_path):
    p = tmp_path / "a" / "page.md"
    assert write_if_changed(p, "hello")
    os.utime(p, (1, 1))
    assert not write_if_changed(p, "hello")
    assert p.stat().st_mtime == 1
    assert write_if_changed(p, "hello!")
    assert p.read_text() == "hello!"
    assert [x.name for x in p.parent.iterdir()] == ["page.md"]  # no temporary file left


def test_write_tree_prunes_owned_dirs_only(tmp_path):
    owned = tmp_path / "stages"
    owned.mkdir()
    (owned / "old.md").write_text("stale")
    (tmp_path / "hand.md").write_text("keep")
    changed = write_tree({owned / "new.md": "x", tmp_path / "index.md": "y"}, [owned])
    assert sorted(p.name for p in changed) == ["index.md", "new.md", "old.md"]
    assert not (owned / "old.md").exists()
    assert (tmp_path / "hand.md").read_text() == "keep"
    assert write_tree({owned / "new.md": "x", tmp_path / "index.md": "y"}, [owned]) == []
