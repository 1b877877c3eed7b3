"""Fragments (heavy HTML spliced in after Markdown) and the disk cache behind the slow renderings."""

import pytest

from site_gen import fragments
from site_gen.cache import DiskCache


def test_fill_replaces_placeholders():
    html = f"<p>a</p>{fragments.placeholder('diff-01-x')}<p>b</p>"
    assert fragments.fill(html, {"diff-01-x": "<div>DIFF</div>"}) == "<p>a</p><div>DIFF</div><p>b</p>"
    assert fragments.fill("<p>none</p>", {}) == "<p>none</p>"


def test_missing_fragment_is_loud():
    with pytest.raises(fragments.FragmentError, match="diff-02-y"):
        fragments.fill(fragments.placeholder("diff-02-y"), {})
    with pytest.raises(ValueError):
        fragments.placeholder("Bad Name")


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


def test_cache_is_keyed_on_the_code_that_makes_the_value(tmp_path):
    code = tmp_path / "render.py"
    code.write_text("# version 1\n")
    calls = []

    def get(folder):
        return DiskCache(folder).get("diff", ["x"], lambda: calls.append(1) or len(calls), code=[code])

    folder = tmp_path / "cache"
    assert get(folder) == 1 and get(folder) == 1  # a hit
    other = tmp_path / "render2.py"
    other.write_text("# version 2\n")
    assert DiskCache(folder).get("diff", ["x"], lambda: "other code", code=[other]) == "other code"
