"""A stage's identity is its token stream: a comment or whitespace edit keeps every record current,
any token edit makes them stale; the restamp moves records from the old byte hash exactly when
their sources are today's."""

from __future__ import annotations

import json
import shutil

import pytest
from hopattn import build, lineage, source_identity
from hopattn.records import compiler_facts, files, restamp, results, traces

SOURCE = """\
#include "common/h.cuh"
#define SCALE 1.4426950408889634f  // log2(e)
#define TWICE(x) ((x) * 2)
constexpr int BLOCK_N = 64;  /* key rows */
const char* name = "block // not a comment /* nor this */";
__global__ void kernel(float* out) {
    out[threadIdx.x] = TWICE(SCALE) + 'a';
}
"""


def h(text: str, lines: bool = False) -> str:
    return source_identity.digest([("kernel.cu", text)], lines)


def test_the_example_tokenizes_as_the_compiler_would():
    toks = [t for _, t in source_identity.tokens(SOURCE)]
    assert toks[:4] == ["#", "include", '"common/h.cuh"', source_identity.EOL]
    assert "log2" not in toks and "key" not in toks  # comments out
    assert '"block // not a comment /* nor this */"' in toks and "'a'" in toks  # literals whole
    assert toks[toks.index("TWICE") + 1] == source_identity.FUNCTION_MACRO
    assert "1.4426950408889634f" in toks


@pytest.mark.parametrize("edit", [
    lambda s: s.replace("// log2(e)", "// log2 of e, the base change"),
    lambda s: s.replace("/* key rows */", "/* key/value rows\n   per iteration */"),
    lambda s: "// Stage 99: a new header comment.\n// Two lines of it.\n" + s,
    lambda s: s + "\n/* a trailing remark */\n",
    lambda s: s.replace("\n    out", "\n        out"),  # re-indented
    lambda s: s.replace("(float* out) {", "(float *out)\n{"),  # re-wrapped
    lambda s: s.replace("\n", "  \n"),  # trailing spaces
    lambda s: s.replace("\n", "\r\n"),  # line endings
    lambda s: s.replace("#define TWICE(x) ((x) * 2)", "#define TWICE(x) \\\n    ((x) * 2)"),  # a continued macro
    lambda s: s.replace("constexpr", "  /* c */ constexpr"),
], ids=["line-comment", "block-comment-more-lines", "header-comment", "trailing-comment", "indent",
        "wrap", "trailing-spaces", "crlf", "continuation", "inline-comment"])
def test_comment_and_whitespace_edits_keep_the_hash(edit):
    edited = edit(SOURCE)
    assert edited != SOURCE
    assert h(edited) == h(SOURCE)


@pytest.mark.parametrize("old, new", [
    ("BLOCK_N = 64", "BLOCK_N = 65"),  # a digit of a number
    ("1.4426950408889634f", "1.4426950408889633f"),  # a digit of a float
    ('"block // not', '"blocks // not'),  # a string literal
    ("'a'", "'b'"),  # a character literal
    ("out[threadIdx.x]", "out[threadIdx.y]"),  # an identifier
    ("(x) * 2", "(x) + 2"),  # a punctuator, inside a macro
    ("#define TWICE(x)", "#define TWICE (x)"),  # object-like, not function-like
    ('#include "common/h.cuh"', '#include "common/g.cuh"'),  # a preprocessor line
    ("f  // log2(e)\n#define", "f  // log2(e)\n#undef SCALE\n#define"),  # a directive more
    ("#define SCALE 1.4426950408889634f  // log2(e)\n", "#define SCALE\n1.4426950408889634f  // log2(e)\n"),
    ("TWICE(SCALE) + 'a'", "TWICE(SCALE) ++ 'a'"),  # '+ +' is not '++'
], ids=["int-digit", "float-digit", "string", "char", "identifier", "operator", "function-macro",
        "include", "directive", "directive-end", "maximal-munch"])
def test_a_token_edit_changes_the_hash(old, new):
    assert old in SOURCE
    assert h(SOURCE.replace(old, new, 1)) != h(SOURCE)


def test_lines_hash_follows_lines_and_tokens():
    moved = "// one more line\n" + SOURCE
    reworded = SOURCE.replace("// log2(e)", "// the base change, log2(e)")
    assert h(moved) == h(SOURCE) and h(moved, lines=True) != h(SOURCE, lines=True)
    assert h(reworded, lines=True) == h(SOURCE, lines=True)
    assert h(SOURCE.replace("= 64", "= 65"), lines=True) != h(SOURCE, lines=True)


def test_the_tokenizer_never_fails_and_still_counts_what_it_cannot_read():
    for broken in ("int x; /* open", 'const char* s = "open;\nint y;', "char c = ';\n", "#include <open\n"):
        toks = source_identity.tokens(broken)
        assert toks and h(broken) != h(broken + "x")


def test_raw_strings_and_digit_separators_are_one_token():
    toks = [t for _, t in source_identity.tokens('auto s = R"d(a " )" b)d"; int n = 1\'000\'000;')]
    assert 'R"d(a " )" b)d"' in toks and "1'000'000" in toks


# --- a real stage ----------------------------------------------------------------------------


@pytest.fixture
def copied(tmp_path):
    """The lineage copied, so that a test may edit a stage and its headers."""
    shutil.copytree(lineage.ATTENTION_DIR, tmp_path / "attention")
    return tmp_path / "attention"


def _edit(path, old, new):
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def test_a_comment_fix_in_a_stage_or_header_keeps_the_stage_current(copied, monkeypatch):
    monkeypatch.setattr(build, "nvcc_version", lambda: "nvcc (any)")  # library_path without nvcc
    stage = lineage.load_stage(copied / "20_gqa-lse")
    before = (stage.source_hash(), stage.source_lines_hash(), stage.source_bytes_hash())
    assert stage.source_hash() == lineage.get_stage(20).source_hash()  # a copy keeps its hash
    _edit(stage.kernel_path, "// ", "//   ")
    header = next(p for p in stage.source_files() if p.suffix == ".cuh")
    header.write_text("// A header comment, fixed.\n" + header.read_text())
    assert stage.source_hash() == before[0]
    assert stage.source_lines_hash() != before[1]  # the header's lines moved
    assert stage.source_bytes_hash() != before[2]  # so the build recompiles (its -lineinfo)
    assert build.library_path(stage) != build.library_path(lineage.get_stage(20))


def test_a_digit_in_a_stage_makes_it_stale(copied):
    stage = lineage.load_stage(copied / "01_baseline")
    before = stage.source_hash()
    _edit(stage.kernel_path, "constexpr int ROWS_PER_WARP = 32;", "constexpr int ROWS_PER_WARP = 16;")
    assert stage.source_hash() != before


def test_the_recorder_hash_ignores_comments(tmp_path, monkeypatch):
    recorder = tmp_path / "trace_recorder.cuh"
    shutil.copy(lineage.TRACE_RECORDER, recorder)
    monkeypatch.setattr(lineage, "TRACE_RECORDER", recorder)
    monkeypatch.delenv("HOPATTN_TRACE_RECORDER", raising=False)
    before, before_bytes = lineage.trace_recorder_hash(), lineage.trace_recorder_bytes_hash()
    recorder.write_text("// The recorder's header, rewritten.\n" + recorder.read_text().replace("// ", "//  "))
    assert lineage.trace_recorder_hash() == before and lineage.trace_recorder_bytes_hash() != before_bytes
    _edit(recorder, "#include <cstdint>", "#include <cstdint>\n#define HOPATTN_TRACE_EXTRA 1")
    assert lineage.trace_recorder_hash() != before


def test_compiler_facts_are_stale_when_lines_move(copied):
    stage = lineage.load_stage(copied / "01_baseline")
    facts = compiler_facts.load(lineage.get_stage(1))
    assert compiler_facts.problem(stage, facts) is None
    _edit(stage.kernel_path, "// Stage 01 — baseline.", "// Stage 01 — the baseline.")  # within its line
    assert compiler_facts.problem(stage, facts) is None
    _edit(stage.kernel_path, "// Stage 01 — the baseline.", "// Stage 01 — the baseline.\n// (a line more)")
    assert "lines moved" in compiler_facts.problem(stage, facts)
    assert "stale" in compiler_facts.problem(stage, {k: v for k, v in facts.items() if k != "source_lines_hash"})


# --- the restamp -----------------------------------------------------------------------------


def _stage_entry(name: str, source_hash: str) -> dict:
    return {"kind": "stage", "name": name, "source_hash": source_hash}


def test_restamp_keeps_a_record_current_exactly_when_its_byte_hash_matched(copied):
    stages = lineage.discover(copied)
    s1, s2 = stages[0], stages[1]
    stamps = restamp.Stamps.of(stages)
    data = {"results": [_stage_entry("01", s1.source_bytes_hash()), _stage_entry("02", "0123456789abcdef"),
                        {"kind": "peer", "name": "fa3", "source_hash": None}]}
    assert restamp.restamp(data, stamps) == 1
    one, two, peer = data["results"]
    assert one["source_hash"] == s1.source_hash() and not results.is_stale(one, s1.source_hash())
    assert two["source_hash"] == "0123456789abcdef" and results.is_stale(two, s2.source_hash())
    assert peer["source_hash"] is None
    assert restamp.restamp(data, stamps) == 0  # twice changes nothing

    # A source that changed after the measurement: its old byte hash is no longer today's.
    _edit(s2.kernel_path, "constexpr int BLOCK_N", "constexpr int BLOCK_N_OLD = 1;\nconstexpr int BLOCK_N")
    measured = _stage_entry("02", s2.source_bytes_hash())  # the byte hash of today's, edited sources
    stamps = restamp.Stamps.of(lineage.discover(copied))
    restamp.restamp(measured, stamps)
    assert not results.is_stale(measured, s2.source_hash())
    old = _stage_entry("02", lineage.get_stage(2).source_bytes_hash())  # of the sources before the edit
    restamp.restamp(old, stamps)
    assert results.is_stale(old, s2.source_hash())


def test_restamp_of_trace_and_facts_records(copied):
    stage = lineage.discover(copied)[0]
    stamps = restamp.Stamps.of(lineage.discover(copied))
    trace = {"stage": "01", "source_hash": stage.source_bytes_hash(), "recorder_hash": lineage.trace_recorder_bytes_hash()}
    assert restamp.restamp(trace, stamps) == 2
    assert not traces.is_stale(trace, stage)
    stale = {"stage": "01", "source_hash": stage.source_bytes_hash(), "recorder_hash": "0" * 16}
    restamp.restamp(stale, stamps)
    assert traces.is_stale(stale, stage)  # another recorder's record stays stale
    facts = json.loads(compiler_facts.path_for(lineage.get_stage(1)).read_text())
    facts.pop("source_lines_hash")
    facts["source_hash"] = stage.source_bytes_hash()
    restamp.restamp(facts, stamps, facts=True)
    assert compiler_facts.problem(stage, facts) is None


def test_restamp_files_under_a_root(tmp_path):
    shutil.copytree(lineage.ATTENTION_DIR, tmp_path / "kernels" / "attention")
    stage = lineage.discover(tmp_path / "kernels" / "attention")[0]
    path = tmp_path / "bench" / "results" / "gpu.json"
    path.parent.mkdir(parents=True)
    files.write_atomic(path, files.dumps({"results": [_stage_entry("01", stage.source_bytes_hash())]}))
    assert restamp.main(["--root", str(tmp_path), "--check"]) == 1
    assert json.loads(path.read_text())["results"][0]["source_hash"] == stage.source_bytes_hash()
    assert restamp.main(["--root", str(tmp_path)]) == 0
    assert path.read_text() == files.dumps({"results": [_stage_entry("01", stage.source_hash())]})
    assert restamp.main(["--root", str(tmp_path), "--check"]) == 0


def test_no_committed_record_carries_a_byte_hash_of_todays_sources():
    """Every record made from today's sources is stamped with their token hash (a producer that
    wrote a byte hash, or a record not restamped, fails here: run python -m hopattn.records.restamp)."""
    counts = restamp.restamp_all(write=False)
    assert not {str(p): n for p, n in counts.items() if n}
