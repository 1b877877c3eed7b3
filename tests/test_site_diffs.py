"""Diffs: counts, pairing with intra-line marks, folding, escaping, line numbers of both files."""

import re

from site_gen.diff_section import compare, render


def numbered(n, fmt="int x{i} = {i};"):
    return "".join(fmt.format(i=i) + "\n" for i in range(n))


def test_counts_and_status():
    old = "a;\nb;\nc;\n"
    new = "a;\nB;\nc;\nd;\n"
    d = compare.diff_texts("k.cu", old, new)
    assert (d.status, d.added, d.removed) == ("modified", 2, 1)
    assert compare.diff_texts("k.cu", old, old).status == "unchanged"
    assert compare.diff_texts("k.cu", None, new).status == "added"
    assert compare.diff_texts("k.cu", old, None).status == "removed"


def test_intra_line_marks_cover_only_the_changed_token():
    d = compare.diff_texts("k.cu", "constexpr int BLOCK_N = 64;\n", "constexpr int BLOCK_N = 128;\n")
    (block,) = d.blocks
    old_row, new_row = block.old[0], block.new[0]
    assert ["constexpr int BLOCK_N = 64;"[a:b] for a, b in old_row.marks] == ["64"]
    assert ["constexpr int BLOCK_N = 128;"[a:b] for a, b in new_row.marks] == ["128"]
    html = render.render_unified(d)
    assert re.search(r'<span class="mi hd-x">128</span>', html)


def test_unrelated_lines_get_no_marks():
    d = compare.diff_texts("k.cu", "float acc = 0.f;\n", "__syncthreads();  // wait for the tile\n")
    assert all(not r.marks for b in d.blocks for r in b.old + b.new)


def test_long_unchanged_runs_fold_with_context():
    old = numbered(50)
    new = old.replace("int x25 = 25;", "int x25 = 2500;")
    html = render.render_unified(compare.diff_texts("k.cu", old, new))
    assert html.count("<details") == 2
    # lines 1-22 fold before the change, 3 lines of context (23-25) stay visible, then 27-29
    assert "22 unchanged lines (lines 1–22)" in html
    assert "21 unchanged lines (lines 30–50)" in html
    for n in (23, 24, 25, 27, 28, 29):
        assert f'data-n="{n}"' in html.split("</details>")[1]


def test_autojunk_is_off_for_long_files():
    # 300 lines with a very frequent line: autojunk would declare it junk and mis-align the diff
    old = "".join("}\n" if i % 3 == 0 else f"x{i};\n" for i in range(300))
    new = old.replace("x100;\n", "y100;\n")
    d = compare.diff_texts("k.cu", old, new)
    assert (d.added, d.removed) == (1, 1)


def test_both_line_numbers_and_escaping():
    old = "if (a < b) {}\n"
    new = "// new\nif (a < b && c > d) {}\n"
    d = compare.diff_texts("k.cu", old, new)
    unified = render.render_unified(d)
    split = render.render_split(d)
    assert "&lt;" in unified and "&amp;&amp;" in unified and "<b" not in unified.replace("<br", "")
    # the kept-but-changed line is old 1 / new 2
    assert 'data-n="1"' in split and 'data-n="2"' in split
    assert split.count('class="hd-row') == 2  # one removed/added pair + one pure addition


def test_render_is_deterministic():
    old, new = numbered(40), numbered(41)
    a = render.render_split(compare.diff_texts("k.cu", old, new))
    b = render.render_split(compare.diff_texts("k.cu", old, new))
    assert a == b
