"""Slots (heavy HTML spliced in after Markdown) and the disk cache behind the slow renderings."""

import pytest

from site_gen import slots
from site_gen.cache import DiskCache


def test_fill_replaces_placeholders(tmp_path):
    slots.slot_path(tmp_path, "diff-01-x").parent.mkdir(parents=True)
    slots.slot_path(tmp_path, "diff-01-x").write_text("<div>DIFF</div>")
    html = f"<p>a</p>{slots.placeholder('diff-01-x')}<p>b</p>"
    assert slots.fill(html, tmp_path) == "<p>a</p><div>DIFF</div><p>b</p>"
    assert slots.fill("<p>none</p>", tmp_path) == "<p>none</p>"


def test_missing_fragment_is_loud(tmp_path):
    with pytest.raises(slots.SlotError, match="diff-02-y"):
        slots.fill(slots.placeholder("diff-02-y"), tmp_path)
    with pytest.raises(ValueError):
        slots.placeholder("Bad Name")


def test_cache_hits_misses_and_prunes(tmp_path):
    calls = []

    def make():
        calls.append(1)
        return {"html": "<b>x</b>"}

    c = DiskCache(tmp_path)
    assert c.get("diff", ["a", "b"], make) == {"html": "<b>x</b>"}
    c2 = DiskCache(tmp_path)
    assert c2.get("diff", ["a", "b"], make) == {"html": "<b>x</b>"}
    assert len(calls) == 1
    c2.get("diff", ["a", "c"], make)
    c3 = DiskCache(tmp_path)
    c3.get("diff", ["a", "c"], make)
    c3.prune()
    assert len(list(tmp_path.rglob("*.json"))) == 1
    assert DiskCache(None).get("diff", [], make) == {"html": "<b>x</b>"} and len(calls) == 3
