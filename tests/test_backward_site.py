"""Act V on the site: a page per backward stage (/backward/NN-slug/) with its anchors and figures,
the forward's pages unchanged by it, the not-measured state and the measured one, determinism,
a second backward stage against the first, and the figures' data against the spec."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import pytest
from conftest import make_site
from hopattn import lineage
from hopattn.records import compiler_facts, results

from site_gen import nav, site
from site_gen.benchmark_section import backward as numbers
from site_gen.diagrams import schedule
from site_gen.diagrams.backward import backward_diagrams, dq_diagram, operands_diagram, roles_diagram
from site_gen.diagrams.backward import facts as bwd
from site_gen.diagrams.backward.operands import plan
from site_gen.diagrams.backward.roles import protocol
from site_gen.diagrams.svg import text_problems

FIRST = "01_baseline"


def _stage01() -> lineage.Stage:
    return lineage.load_stage(lineage.BACKWARD_DIR / FIRST)


def add_backward(root, stages=(FIRST,), facts=True):
    """The backward lineage's stages copied into a fixture tree, with their committed compiler facts."""
    dest = root / "kernels" / lineage.BACKWARD_DIR.name
    shutil.copytree(lineage.BACKWARD_DIR / "common", dest / "common")
    for name in stages:
        shutil.copytree(lineage.BACKWARD_DIR / name, dest / name)
    if facts:
        folder = compiler_facts.folder_for(dest)
        folder.mkdir(parents=True)
        for s in lineage.discover(dest):
            shutil.copy(compiler_facts.path_for(lineage.load_stage(lineage.BACKWARD_DIR / s.dir.name)), folder)
    return root


@pytest.fixture
def bwd_root(tmp_path):
    return add_backward(make_site(tmp_path / "repo"))


def render(root, **kw):
    return site.generate(root, **kw)[0]


# --- the page ----------------------------------------------------------------------------------


def test_a_backward_page_with_its_anchors_and_figures(bwd_root):
    out = render(bwd_root)
    stage = _stage01()
    page = out.pages["backward/01-baseline.md"]
    assert page.startswith(f"# Backward 01 · {stage.title}\n")
    for anchor in ("diagrams", "diff", "compiler", "benchmark", "operands", "dq", "roles", "timeline"):
        assert f"{{#{anchor}}}" in page, anchor
    assert stage.change.split(":")[0] in page  # the one change
    assert "## Who owns what" in page  # the notes
    # the figures: operands at the top (the lead), dQ, roles, the schedule
    for fid in ("b01-operands", "b01-dq", "b01-roles", "b01-timeline"):
        assert f"fig-{fid}" in out.fragments, fid
        assert f"assets/generated/diagrams/{fid}.svg" in out.assets
    assert page.index("fig-b01-operands") < page.index("## Diagrams")
    assert "Drawn at the top of this page" in page and "No trace of a backward stage is recorded yet" in page
    operands = out.fragments["fig-b01-operands"]
    for text in ("A: Pᵀ", "ldmatrix.trans", "B: Kᵀ", "C: dV", "C: dQ, fp32 sum", "red.global.add.f32", "P + dS"):
        assert text in operands, text
    dq = out.fragments["fig-b01-dq"]
    assert "Deterministic mode: a second pass, no atomics" in dq and "8,192 floats added per CTA" in dq
    # the source of the first backward stage, its compiler facts and the dQ atomics in its SASS
    diff = out.fragments["diff-backward-01-baseline"]
    assert "nothing to compare against" in diff and "../attention/common/mma_sm80.cuh" in diff
    assert "Kernel `dkdv_kernel(AttnBwdParams)`" in page and "dQ's atomics in the SASS:** 64 reduction" in page
    assert "[Overview](../index.md#backward)" in page
    # the nav: Act V after the stages
    entries = nav.nav(bwd_root / "docs", sorted(out.pages))
    assert {nav.ACT_V: ["backward/01-baseline.md"]} in entries
    assert entries.index({nav.ACT_V: ["backward/01-baseline.md"]}) == entries.index(
        next(e for e in entries if isinstance(e, dict) and "Stages" in e)) + 1


def test_the_forward_pages_are_byte_identical_with_the_backward_beside_them(tmp_path):
    alone = render(make_site(tmp_path / "a"))
    both = render(add_backward(make_site(tmp_path / "b")))
    forward = {p: t for p, t in alone.pages.items() if p != "index.md"}
    assert forward and all(both.pages[p] == t for p, t in forward.items())
    assert all(both.assets[p] == t for p, t in alone.assets.items())
    assert all(both.fragments[n] == h for n, h in alone.fragments.items())
    assert "## Act V: the backward pass {#backward}" in both.pages["index.md"]
    assert "Act V" not in alone.pages["index.md"] and "backward/" not in " ".join(alone.pages)


def test_not_measured_yet_is_said_plainly(bwd_root):
    out = render(bwd_root)
    page = out.pages["backward/01-baseline.md"]
    bench = page[page.index("## Benchmark {#benchmark}"):]
    assert "**Not measured yet.**" in bench and numbers.COMMAND in bench
    assert "Not measured yet" in out.fragments["headline-backward-01-baseline"]
    index = out.pages["index.md"]
    act_v = index[index.index("{#backward}"):]
    assert "**Not measured yet.**" in act_v and "not measured yet |" in act_v
    assert "assets/generated/progression-backward.svg" not in out.assets


def _backward_entry(kind, name, label, shape, causal, tflops, run, src_hash=None, deterministic=False,
                    vs_default=None):
    b, h, n = {"4k": (8, 16, 4096), "8k": (4, 16, 8192), "16k": (2, 16, 16384)}[shape]
    ms = round(2.5 * 4 * b * h * n * n * 128 / (2 if causal else 1) / tflops / 1e9, 4)
    ratios = {"fa4": round(tflops / 540, 3), "cudnn": round(tflops / 500, 3), "fa2": round(tflops / 290, 3)}
    return {"kind": kind, "name": name, "label": label, "run_id": run, "shape": shape, "batch": b, "heads": h,
            "len_q": n, "len_k": n, "head_dim": 128, "causal": causal, "status": "ok", "reason": None,
            "source_hash": src_hash, "median_ms": ms, "min_ms": ms, "max_ms": ms, "spread_pct": 0.5, "samples": 5,
            "tflops": tflops, "rel_err": 0.004, "ratios": ratios if kind == "stage" else {},
            "deterministic": deterministic, "rel_errs": {"dq": 0.004, "dk": 0.003, "dv": 0.002},
            "vs_default": vs_default}


def _measure(root) -> None:
    """Backward entries for stage 01 (both modes) and three peers, in the fixture's results file."""
    if results.SCHEMA_VERSION < 2:
        pytest.skip("hopattn.records.results has no backward section yet (schema 2)")
    path = root / "bench" / "results" / "nvidia-h200.json"
    data = json.loads(path.read_text())
    run = sorted(data["runs"])[-1]
    src = lineage.discover(root / "kernels" / "attention_backward")[0].source_hash()
    entries = []
    for shape in ("4k", "8k", "16k"):
        for causal in (False, True):
            entries.append(_backward_entry("stage", "01", "backward 01", shape, causal, 150.0, run, src))
            entries.append(_backward_entry("stage", "01", "backward 01", shape, causal, 100.0, run, src, True, 0.667))
            for peer, label, tf in (("fa4", "FlashAttention-4", 540.0), ("cudnn", "cuDNN", 500.0),
                                    ("fa2", "FlashAttention-2", 290.0)):
                entries.append(_backward_entry("peer", peer, label, shape, causal, tf, run))
    results.dump_results(dict(data, schema_version=results.SCHEMA_VERSION, backward=entries), path)


def test_measured_backward_numbers_on_the_page_the_overview_and_the_climb(bwd_root):
    _measure(bwd_root)
    out = render(bwd_root)
    page = out.pages["backward/01-baseline.md"]
    bench = page[page.index("## Benchmark {#benchmark}"):]
    assert "Not measured yet" not in bench
    assert "| 8k | **150.0** |" in bench and "| 8k · deterministic | **100.0** |" in bench
    assert "vs FA4 | vs cuDNN | vs FA2 |" in bench and "0.28×" in bench and "0.67×" in bench  # vs_default
    assert "4.0e-03 / 3.0e-03 / 2.0e-03" in bench
    cards = out.fragments["headline-backward-01-baseline"]
    assert "150 <span>TFLOP/s</span>" in cards and "0.278× FlashAttention-4, same run" in cards
    assert "deterministic: 0.67× the default" in cards
    climb = out.assets["assets/generated/progression-backward.svg"]
    assert "The backward climb" in climb and "FA2" in climb and "FA4" in climb
    index = out.pages["index.md"]
    assert "climb-backward" in out.fragments and "**150**" in index and "*FlashAttention-4* | *540*" in index
    # a token edit makes the numbers stale; the forward's pages do not notice
    kernel = bwd_root / "kernels" / "attention_backward" / FIRST / "kernel.cu"
    kernel.write_text(kernel.read_text() + "constexpr int EDITED_AFTER_THE_RUN = 1;\n")
    again = render(bwd_root)
    assert 'class="hd-stale"' in again.pages["backward/01-baseline.md"]
    assert '!!! warning "Stale compiler facts"' in again.pages["backward/01-baseline.md"]
    assert again.pages["stages/01-baseline.md"] == out.pages["stages/01-baseline.md"]


def test_deterministic_with_the_backward(bwd_root, tmp_path):
    warm = render(bwd_root)
    again = render(bwd_root)
    cold = render(add_backward(make_site(tmp_path / "other")), use_cache=False)
    assert warm == again == cold


def test_a_second_backward_stage_against_the_first(bwd_root):
    folder = bwd_root / "kernels" / "attention_backward"
    second = folder / "02_second"
    shutil.copytree(folder / FIRST, second)
    spec = second / "stage.toml"
    spec.write_text(spec.read_text().replace('title = "Baseline:', 'title = "Second:', 1))
    kernel = second / "kernel.cu"
    kernel.write_text(kernel.read_text() + "constexpr int SECOND = 2;\n")
    out = render(bwd_root)
    page = out.pages["backward/02-second.md"]
    assert "## Diff against Backward 01 · Baseline" in page and "[← Backward 01 ·" in page
    assert "Backward 02 · Second" in out.pages["backward/01-baseline.md"]  # its next link
    assert "Unchanged since [backward stage 01](01-baseline.md#operands)" in page
    assert "fig-b02-dq" in page[:page.index("## Diagrams")]  # stage 02's lead (pages/backward.py LEAD)
    assert "Unchanged since [backward stage 01](01-baseline.md#roles)" in page
    assert "+1 / −0 lines</strong> in kernel.cu" in out.fragments["diff-backward-02-second"]
    assert "backward/02-second.md" in out.pages and "stages/02-smem-tiles.md" in out.pages


def test_a_bad_backward_spec_names_its_file(bwd_root):
    spec = bwd_root / "kernels" / "attention_backward" / FIRST / "stage.toml"
    spec.write_text(spec.read_text().replace('after = ["prev.dq"]', 'after = ["dq"]', 1))
    with pytest.raises(site.SectionError, match=r"attention_backward/01_baseline/stage.toml: the diagrams of "
                                                r"backward stage 01-baseline failed: ScheduleError"):
        render(bwd_root)


# --- the figures against the spec ---------------------------------------------------------------


def test_operands_come_from_the_spec():
    stage = _stage01()
    where = {(g.kind, ch.role): (ch.place.tensor, ch.place.level, ch.place.how) for g, chips in plan(stage)
             for ch in chips}
    assert [g.kind for g, _ in plan(stage)] == ["qk", "dp", "dv", "dk", "dq"]
    assert where[("qk", "A")] == ("Q", "smem", "ldmatrix") and where[("qk", "B")] == ("Kᵀ", "smem", "ldmatrix")
    assert where[("dv", "A")] == ("Pᵀ", "smem", "ldmatrix.trans") and where[("dv", "B")][2] == "ldmatrix.trans"
    assert where[("dq", "B")] == ("K", "smem", "ldmatrix.trans")
    assert [where[(k, "C")][1] for k in ("qk", "dp", "dv", "dk")] == ["regs"] * 4
    assert where[("dq", "C")] == ("dQ", "global", "red.global.add.f32")
    # without their buffers, P and dS stay in the registers the softmax made them in
    bare = dataclasses.replace(stage, smem=tuple(b for b in stage.smem if b.name not in ("P", "dS")))
    moved = {(g.kind, ch.role): ch for g, chips in plan(bare) for ch in chips}
    assert moved[("dv", "A")].place.level == "regs" and moved[("dv", "C")].sub == 2  # under A, in the same column
    assert "P + dS" not in operands_diagram(bare, [bare]).svg


def test_the_dq_path_comes_from_the_spec():
    stage = _stage01()
    path = bwd.dq_path(stage)
    assert path.atomic and path.mechanism == "red.global.add.f32" and path.per_thread == 64
    assert path.per_cta == stage.block_m * stage.head_dim and path.deterministic == "second pass"
    assert path.vector == 1 and path.instructions == 64 and path.adds_label == "64 per thread"
    assert not bwd.dq_path(dataclasses.replace(stage, deterministic=False)).deterministic
    # a vector reduction: its name as the spec writes it, four floats an instruction
    vec = dataclasses.replace(stage, roles=tuple(
        dataclasses.replace(r, tasks=tuple(t.replace("red.global.add.f32", "red.global.add.v4.f32") for t in r.tasks))
        for r in stage.roles), change="dQ four floats at a time.")
    assert bwd.dq_path(vec).mechanism == "red.global.add.v4.f32" and bwd.dq_path(vec).instructions == 16
    assert "64 floats per thread in 16 instructions" in dq_diagram(vec, [vec]).svg
    plain = dataclasses.replace(stage, deterministic=False, roles=tuple(
        dataclasses.replace(r, tasks=tuple(t.replace("red.global.add.f32", "a plain add") for t in r.tasks))
        for r in stage.roles), change="dQ in registers.")
    assert not bwd.dq_path(plain).atomic
    assert "No deterministic mode at this stage" in dq_diagram(plain, [plain]).svg


def test_roles_meet_at_the_barriers_the_kernel_has():
    stage = _stage01()
    p = protocol(stage)
    labels = [s.label for s in p.syncs]
    # per query block: after the loads, after P and dS are stored, before the next loads
    assert labels == ["bar.sync: Q, dO in shared memory", "bar.sync: P, dS in shared memory",
                      "bar.sync: the tiles are free again", "bar.sync: Q, dO in shared memory",
                      "bar.sync: P, dS in shared memory"]
    kernel = stage.kernel_path.read_text()
    loop = kernel[kernel.index("__global__ void __launch_bounds__(NUM_THREADS) dkdv_kernel"):]
    loop = loop[:loop.index("__global__", 10)] if "__global__" in loop[10:] else loop
    assert loop.count("__syncthreads()") == 3  # the kernel's three barriers per query block
    kinds = [e.kind for e in p.events if e.block == 0]
    assert kinds == ["load_q", "load_do", "qk", "dp", "softmax", "dv", "dk", "dq"]
    assert [e.kind for e in p.events if e.block < 0] == ["load_kv", "store_dkdv"]


def test_the_schedule_model_runs_the_backward_kinds():
    stage = _stage01()
    ops = schedule.model_ops(stage)
    assert ops[-1].kind == "store_dkdv" and ops[-1].implicit and ops[-1].after == ("dv", "dk")
    flops = 2 * stage.block_m * stage.block_n * stage.head_dim
    for op in ops:
        if op.kind in schedule.BACKWARD_GEMMS:
            assert schedule.duration(stage, op) == pytest.approx(flops / (schedule.rates.TENSOR_FLOPS_SM * 2 / 3))
    pred = schedule.predict(stage)
    loop = [op for op in ops if op.kind not in schedule.once_kinds(stage)]
    # one role, every op synchronous: nothing overlaps, the period is the sum of the loop's ops
    assert pred.period == pytest.approx(sum(schedule.duration(stage, op) for op in loop))
    assert pred.bound == "tensor"


def test_the_figures_are_accessible_stable_and_legible():
    stage = _stage01()
    drawn = backward_diagrams(stage, [stage])
    assert [d.id for d in drawn] == ["b01-operands", "b01-dq", "b01-roles", "b01-timeline"]
    assert [d.svg for d in backward_diagrams(stage, [stage])] == [d.svg for d in drawn]
    for d in drawn:
        assert d.svg.startswith("<svg") and f'id="{d.id}"' in d.svg and d.caption.strip()
        assert re.search(r"<title[^>]*>[^<]+</title><desc[^>]*>.{40,}</desc>", d.svg, re.S)
        sizes = [float(x) for x in re.findall(r'font-size="([\d.]+)"', d.svg)]
        assert min(sizes) >= (12 if d.kind in ("roles", "dq") else 11), d.id
        for _attr, value in re.findall(r'\b(fill|stroke)="([^"]+)"', d.svg):
            assert value == "none" or re.fullmatch(r"var\(--hd-[a-z0-9]+, #[0-9a-f]{6}\)", value), (d.id, value)
        if d.kind != "timeline":
            assert text_problems(d.svg, d.width, d.height) == [], d.id
    assert roles_diagram(stage, [stage]).signature == roles_diagram(stage, [stage]).signature
