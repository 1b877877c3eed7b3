"""Part II's figures for the RMSNorm backward, the softmax and the softmax backward (issue #30): their
stage.toml [[config]] against kernel.cu's launcher, the compiled instances and the committed benchmark
records' variants; a wrong [[config]] failing loudly, naming the stage's file and the field; and the
figures drawn from them in each lineage's words (the dot and dw, the (max, sum) merge, three streams
of bytes an element for the backwards), legible and deterministic. Pure Python: no GPU, no build."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from hopattn import lineage, rowwise, rowwise_backward, softmax_lineage
from test_site_browser import browser  # noqa: F401  (the browser tests' fixture)

from site_gen.diagrams.rowwise import holders, model, rowwise_diagrams
from site_gen.diagrams.svg import text_problems, wrap

LINEAGES = {"rmsnorm_backward": rowwise_backward, "softmax": softmax_lineage, "softmax_backward": softmax_lineage}
STAGES = {"rmsnorm_backward": rowwise_backward.discover(), "softmax": softmax_lineage.discover(),
          "softmax_backward": softmax_lineage.discover_backward()}
ALL = [(folder, s) for folder, stages in STAGES.items() for s in stages]
IDS = [f"{folder}-{s.name}" for folder, s in ALL]
REPO = lineage.RMSNORM_DIR.parent.parent


def _svgs(folder, stage) -> dict[str, str]:
    return {d.kind: d.svg for d in rowwise_diagrams(stage, STAGES[folder])}


# --- [[config]] against kernel.cu, its compiled instances and the records ----------------------------


@pytest.mark.parametrize(("folder", "stage"), ALL, ids=IDS)
def test_configs_match_the_launcher(folder, stage):
    assert LINEAGES[folder].config_mismatches(stage) == []
    held = [c for c in stage.spec.config if c.vectors]
    assert (rowwise.launcher_configs(stage.kernel_path.read_text()) is None) == (not held)
    assert stage.spec.config[-1].vectors == 0  # the last takes any row


@pytest.mark.parametrize(("folder", "stage"), ALL, ids=IDS)
def test_every_config_is_a_compiled_bf16_instance(folder, stage):
    """Each [[config]] against the committed compiler facts: a held one by its template arguments <T,
    threads per row, vectors, rows per CTA[, cluster]>, a streamed one by its kernel's 16-byte instance
    for its threads per row (<T, 8, threads> where the kernel takes them)."""
    from hopattn.compiler.facts import _INT_ARG_RE, _matches_kernel, instance_dtype
    from hopattn.records import compiler_facts

    facts = compiler_facts.load(stage)
    instances = [(f["function"], tuple(int(n) for n in _INT_ARG_RE.findall(f["function"])))
                 for f in [facts, *facts["other_functions"]] if instance_dtype(f["function"]) == "bf16"]
    for i, c in enumerate(stage.spec.config):
        mine = [ints for fn, ints in instances if _matches_kernel(fn, c.kernel)]
        assert mine, (stage.name, i, c.kernel)
        if c.vectors:
            want = (c.threads_per_row, c.vectors, c.rows_per_cta)
            assert want in mine or want + (c.cluster,) in mine, (stage.name, i, mine)
        elif c.threads_per_row > 1:
            assert (8, c.threads_per_row) in mine, (stage.name, i, mine)
        else:
            assert () in mine, (stage.name, i, mine)


@pytest.mark.parametrize(("folder", "stage"), ALL, ids=IDS)
def test_the_configs_are_what_the_benchmark_ran(folder, stage):
    """The configuration the figures deal each length to is the one the committed H200 run reports having
    launched (its entries' variant): threads per row and vectors where the row is held, the cluster where
    the variant names it, a CTA (or warp) per row where streamed."""
    data = json.loads((REPO / "bench" / "results" / folder / "nvidia-h200.json").read_text())
    variants = {e["size"]: e["variant"] for e in data["entries"] if e["arm"] == f"stage {stage.id}" and "variant" in e}
    if not variants and stage == STAGES[folder][-1]:  # the newest stage before its GPU run (test_part_ii_notes)
        pytest.skip(f"{folder} {stage.name}: not measured yet")
    if not variants:  # the latest run timed other stages: the variants the run its notes quote printed
        from site_gen.pages.part_ii import last_measured_log

        log = last_measured_log(stage)
        assert log, f"{folder} {stage.name}: neither the record nor its notes' log measure it"
        line = re.compile(rf"\] (?:forward |backward )?(\d+k) stage {stage.id}\s.*\serr \S+\s+(\S.*)$")
        for text in (REPO / log).read_text().splitlines():
            if (m := line.search(text)) and (folder != "softmax" or "] forward " in text) \
                    and (folder != "softmax_backward" or "] backward " in text):
                variants[m.group(1)] = m.group(2).strip()
    assert set(variants) >= set(model.LENGTHS)
    for lay in model.layouts(stage):
        v, c = variants[lay.label], lay.config
        if c.vectors:
            assert f"{c.threads_per_row} threads/row, {c.vectors} vectors" in v, (lay.label, v, c)
            if ", cluster " in v:
                assert f"cluster {c.cluster}" in v or c.cluster == 1 and "cluster 1" in v, (lay.label, v, c)
        elif c.threads_per_row == 1:
            assert "row per thread" in v, (lay.label, v)
        else:
            assert ("CTA per row" if c.threads_per_row > 32 else "warp per row") in v, (lay.label, v)


def test_a_row_goes_to_the_first_config_that_holds_it():
    rb, sm, sb = STAGES["rmsnorm_backward"], STAGES["softmax"], STAGES["softmax_backward"]
    assert [rb[2].spec.config_for(n).threads_per_row for n in (4096, 16384, 16385)] == [256, 1024, 512]
    assert rb[2].spec.config_for(16385).vectors == 0  # past one CTA: stage 02's dot kernel, read twice
    assert [rb[3].spec.config_for(n).cluster for n in (16384, 65536, 262144)] == [1, 4, 16]
    assert rb[3].spec.config_for(262145).vectors == 0
    assert rb[5].spec.config[-2].exchange == "st.async" and rb[4].spec.config[-2].exchange is None
    assert [sm[2].spec.config_for(n).threads_per_row for n in (256, 2048, 4096, 65536)] == [32, 32, 64, 1024]
    assert sm[3].spec.config_for(262144).cluster == 4 and sm[2].spec.config_for(65537).reads == 2
    assert [c.reads for c in sm[0].spec.config] == [3, 3] and sm[0].spec.config[0].payload == "max, then sum"
    assert sm[1].spec.config[0].payload == "(max, sum)"
    assert sb[1].spec.config_for(262144).cluster == 16 and sb[0].spec.config_for(4096).reads == 2
    assert rb[0].spec.config[0].reads == 3  # the dot's walk, dx's, and dw's kernel down the columns


# --- a wrong [[config]] fails loudly, naming the stage and the field --------------------------------


def _copy(tmp_path, folder: str, index: int):
    stage = STAGES[folder][index]
    dest = tmp_path / folder / stage.dir.name
    shutil.copytree(stage.dir, dest)
    return dest, (dest / "stage.toml").read_text()


def test_a_config_the_launcher_does_not_run_is_reported(tmp_path):
    dest, text = _copy(tmp_path, "rmsnorm_backward", 3)
    (dest / "stage.toml").write_text(text.replace("threads_per_row = 64\nvectors = 2", "threads_per_row = 96\nvectors = 2", 1))
    found = rowwise_backward.config_mismatches(rowwise_backward.load_stage(dest))
    assert found and "04_cluster-rows/stage.toml" in found[0] and "kernel.cu's with_config launches" in found[0]


def test_the_exchange_is_checked_against_kernel_cu(tmp_path):
    dest, text = _copy(tmp_path, "rmsnorm_backward", 5)
    (dest / "stage.toml").write_text(text.replace('exchange = "st.async"\n', ""))
    found = rowwise_backward.config_mismatches(rowwise_backward.load_stage(dest))
    assert any("06_cluster-exchange-without-fences/stage.toml: config[7].exchange = 'st.shared::cluster', but "
               "kernel.cu exchanges through st.async" in f for f in found), found
    dest, text = _copy(tmp_path, "rmsnorm_backward", 4)
    (dest / "stage.toml").write_text(text.replace("cluster = 2\n", 'cluster = 2\nexchange = "st.async"\n', 1))
    found = rowwise_backward.config_mismatches(rowwise_backward.load_stage(dest))
    assert any("config[7].exchange = 'st.async', but kernel.cu has no st.async" in f for f in found), found


def test_the_softmax_reduce_is_checked_against_kernel_cu(tmp_path):
    dest, text = _copy(tmp_path, "softmax", 0)
    (dest / "stage.toml").write_text(text.replace('reduce = "max, then sum"\n', ""))
    found = softmax_lineage.config_mismatches(softmax_lineage.load_stage(dest))
    assert any("01_three-passes/stage.toml: config[0].reduce = '(max, sum)', but kernel.cu has no MaxSum pair" in f
               for f in found), found


@pytest.mark.parametrize(("folder", "index", "old", "new", "message"), [
    ("rmsnorm_backward", 0, "passes = 3\n", "passes = 2\n",
     r"01_two-plain-kernels/stage.toml: field 'row.reads' must be 2 \(the fewest of its \[\[config\]\]\)"),
    ("rmsnorm_backward", 2, "vectors = 1\n", "vectors = 1\nwarps = 2\n", r"\[\[config\]\]\[0\].warps: unknown key"),
    ("rmsnorm_backward", 2, "vectors = 1\n", "vectors = 1\npasses = 2\n",
     r"03_row-in-registers/stage.toml: field 'config\[0\].passes' must be left out where the row is held"),
    ("rmsnorm_backward", 3, "cluster = 16\n", "cluster = 32\n", r"field 'config\[10\].cluster' must be 1, or at most"),
    ("rmsnorm_backward", 2, "vectors = 1\n", "vectors = 1\nexchange = \"st.async\"\n",
     r"field 'config\[0\].exchange' must be left out where no cluster shares the row"),
    ("softmax", 1, "max_cols = 1024\n", 'max_cols = 1024\nreduce = "max, then sum"\n',
     r"02_online-max-and-sum/stage.toml: field 'config\[0\].reduce' must be '\(max, sum\)' where the row is read"),
    ("softmax", 2, "rows_per_cta = 8\n", "rows_per_cta = 64\n", r"field 'config\[0\].rows_per_cta' must be at most"),
    ("softmax", 3, "vectors = 8\ncluster = 8\n", "vectors = 8\ncluster = 4\n",
     r"field 'launch.cluster' must be the largest cluster of its \[\[config\]\] \(4\)"),
    ("softmax_backward", 0, "max_cols = 1024\n", 'max_cols = 1024\nreduce = "(max, sum)"\n',
     r"01_two-passes/stage.toml: field 'config\[0\].reduce' must be left out in a backward stage"),
    ("softmax_backward", 1, "vectors = 1\n", "vectors = 4\n",
     r"02_row-in-registers/stage.toml: field 'row.vectors_per_thread' must be the most vectors a \[\[config\]\] holds"),
])
def test_a_config_that_disagrees_with_the_spec_names_the_stage_and_the_field(tmp_path, folder, index, old, new,
                                                                               message):
    dest, text = _copy(tmp_path, folder, index)
    assert old in text
    (dest / "stage.toml").write_text(text.replace(old, new, 1))
    with pytest.raises(lineage.SpecError, match=message):
        LINEAGES[folder].load_stage(dest)


def test_a_stage_without_configs_fails(tmp_path):
    dest, text = _copy(tmp_path, "softmax_backward", 0)
    (dest / "stage.toml").write_text(text[:text.index("\n# The launch configurations")] + "\n")
    with pytest.raises(lineage.SpecError, match=r"01_two-passes/stage.toml: field 'config' must be an array of tables"):
        softmax_lineage.load_stage(dest)


# --- the figures, in each lineage's words ------------------------------------------------------------


@pytest.mark.parametrize(("folder", "stage"), ALL, ids=IDS)
def test_every_stage_has_its_three_figures_legible(folder, stage):
    ds = rowwise_diagrams(stage, STAGES[folder])
    prefix = model.OPS[folder].prefix
    assert [d.kind for d in ds] == ["holders", "reduction", "traffic"]
    assert [d.id for d in ds] == [f"{prefix}{stage.id}-{k}" for k in ("holders", "reduction", "traffic")]
    for d in ds:
        assert text_problems(d.svg, d.width, d.height) == [], d.id
        assert d.svg.startswith("<svg") and f'id="{d.id}"' in d.svg and model.OPS[folder].label in d.title
        assert "bf16" in d.svg, d.id  # the dtype it draws
        assert "RMSNorm" not in d.svg or folder == "rmsnorm_backward"  # the lineage's own words
    holders_svg, reduction_svg, traffic_svg = (d.svg for d in ds)
    assert all(f">{label}<" in holders_svg for label in model.LENGTHS)  # the row lengths it draws
    assert f"of a {model.deepest(stage).label} row (bf16)" in reduction_svg
    assert "rows of 4k to 256k" in traffic_svg
    for lay in model.layouts(stage):  # the sentence under each band is not cut
        assert len(wrap(holders.where_of(lay, model.OPS[folder], stage), holders.W - 12 - holders.BOX_X, 12)) <= 2


def test_the_ids_are_unique_across_part_ii():
    ids = [d.id for folder, s in ALL for d in rowwise_diagrams(s, STAGES[folder])]
    ids += [d.id for s in rowwise.discover() for d in rowwise_diagrams(s, rowwise.discover())]
    assert len(ids) == len(set(ids))


def test_the_softmax_merges_a_max_sum_pair():
    stages = STAGES["softmax"]
    for s in stages[1:]:
        svg = _svgs("softmax", s)["reduction"]
        assert "the (max, sum) pair of a" in svg and "(m, s) ⊕ (m′, s′) = (M, s · e^(m − M) + s′ · e^(m′ − M))" in svg
        assert "32 lane pairs merged" in svg and "pairs, " in svg and "merges the" in svg
        assert "sum of squares" not in svg and "Σ x²" not in svg
    first = _svgs("softmax", stages[0])["reduction"]
    assert "the max, then the sum, of a 256k row" in first and "⊕" not in first and "Two trees" in first
    assert "shfl.xor: 5 steps, twice" in first
    assert "read three times: 4–8 B moved for 4 counted" in _svgs("softmax", stages[0])["traffic"]
    assert "2 streams of 2 B an element: x read, y written" in _svgs("softmax", stages[3])["traffic"]
    assert "cluster (4 CTA pairs)" in _svgs("softmax", stages[3])["reduction"]


def test_the_backwards_reduce_a_dot_and_stream_three_arrays():
    for folder, what in (("rmsnorm_backward", "x and dy read, dx written"), ("softmax_backward", "y and dy read, dx written")):
        for s in STAGES[folder]:
            svgs = _svgs(folder, s)
            assert f"3 streams of 2 B an element: {what} (6 B, what GB/s counts)" in svgs["traffic"], s.name
            assert "the dot of a" in svgs["reduction"] and "1 dot a thread" in svgs["reduction"]
            assert "2 × " in svgs["holders"]  # a row of each array
    rb = STAGES["rmsnorm_backward"]
    assert "read three times: 6–14 B moved for 6 counted, ≤ 0.43–1.00× the copy" in _svgs("rmsnorm_backward", rb[0])["traffic"]
    assert "read twice: 6–10 B moved for 6 counted" in _svgs("rmsnorm_backward", rb[2])["traffic"]  # 64k, 256k
    assert "read once: HBM moves the 6 B GB/s counts" in _svgs("rmsnorm_backward", rb[3])["traffic"]
    red = _svgs("rmsnorm_backward", rb[3])["reduction"]
    assert "Σ x · w · dy of" in red and "dw[c] = Σ_r dy[r, c] · x̂[r, c]" in red
    assert "st.shared::cluster" in red and "barrier.cluster" in red and "CTA 15" in red
    six = _svgs("rmsnorm_backward", rb[5])
    assert "st.async" in six["reduction"] and "mbarrier" in six["reduction"] and "barrier.cluster<" not in six["reduction"]
    assert "copied into shared memory a row ahead" in six["holders"] and "in shared memory" in six["holders"]
    assert "a persistent grid" in six["holders"] and "a persistent grid" not in _svgs("rmsnorm_backward", rb[1])["holders"]
    assert "tile kernel" in _svgs("rmsnorm_backward", rb[1])["holders"]  # its second read is a kernel of its own
    sb = STAGES["softmax_backward"]
    assert "Σ y · dy of" in _svgs("softmax_backward", sb[1])["reduction"]
    assert "held in registers" in _svgs("softmax_backward", sb[1])["holders"]


def test_an_unchanged_picture_is_the_same_and_a_changed_one_is_not():
    rb = STAGES["rmsnorm_backward"]
    drawn = [rowwise_diagrams(s, rb) for s in rb]
    same = [[d.kind for d, p in zip(drawn[i], drawn[i - 1]) if d.same_picture(p)] for i in range(1, len(rb))]
    assert same == [[], [], [], ["traffic"], ["holders", "traffic"]]  # 05: smem, 06: st.async


def test_deterministic():
    for folder, s in ALL:
        assert rowwise_diagrams(s, STAGES[folder]) == rowwise_diagrams(s, STAGES[folder])


# --- in headless Chromium (tests/test_site_browser.py's checks) --------------------------------------

BROWSER_PAGES = ["rmsnorm_backward/06-cluster-exchange-without-fences/", "softmax/01-three-passes/",
                 "softmax/04-cluster-rows/", "softmax_backward/02-row-in-registers/"]


@pytest.mark.browser
def test_the_figures_in_a_browser(browser, tmp_path):  # noqa: F811  (the fixture imported above)
    """A page of each lineage at 1400 and 390 px: every figure drawn and legible, its text against what is
    under it in both themes, each opened full screen; at 390 px each reads inline (11 px or more,
    scrolling sideways with its hint)."""
    from conftest import make_site
    from test_part_ii_site import add_part_ii
    from test_rmsnorm_browser import INLINE, PART_II_KINDS
    from test_rmsnorm_site import add_rmsnorm
    from test_site_browser import (
        MIN_TEXT_PX,
        PICK_FIGURES,
        _build,
        _check_figures,
        _check_full_screen,
        _contrast,
        _get,
        _serve,
        _width,
    )

    root = add_part_ii(add_rmsnorm(make_site(tmp_path / "repo")))
    _build(root, root / "site")
    server = _serve(root / "site")
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        for width in (1400, 390):
            _width(browser, width)
            for path in BROWSER_PAGES:
                _get(browser, base + path)
                kinds = {f["kind"] for f in _check_figures(browser, path)}
                assert kinds >= set(PART_II_KINDS) or path.startswith("rmsnorm_backward/06"), f"{path}: {kinds}"
                assert kinds & set(PART_II_KINDS), f"{path} at {width} px: {kinds}"
                if width == 390:
                    for f in browser.execute_script(INLINE, list(PART_II_KINDS)):
                        assert f["min"] >= MIN_TEXT_PX - 0.01, f"{path} {f['id']}: {f['min']:.1f} px inline at 390 px"
                        assert f["scrolls"] and f["hint"], f"{path} {f['id']}: {f}"
                else:
                    assert not _contrast(browser, path)
                for fig_id, kind, folded in browser.execute_script(PICK_FIGURES):
                    _check_full_screen(browser, f"{path} {fig_id} ({kind}) at {width} px", fig_id, folded)
    finally:
        _width(browser, 1400)
        server.shutdown()
