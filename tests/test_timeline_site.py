"""The timelines on the site: every stage page's comes from its committed trace, a stale trace is
flagged, a stage without one says so, the overview sets the model against the GPU, and the real
site builds strict with the real records."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import AWAITING_TRACE, REPO, make_site
from hopattn import lineage
from hopattn.records import traces

from site_gen import inputs, site
from site_gen.cache import DiskCache

TRACES = REPO / "bench" / "results" / "traces" / "nvidia-h200"


@pytest.fixture(scope="module")
def real():
    inp = inputs.load(REPO)
    return inp, site.render(inp, DiskCache(None))


def _fixture_with_traces(tmp_path, stale: str | None = None, missing: str | None = None):
    root = make_site(tmp_path / "repo")
    dest = root / "bench" / "results" / "traces" / "nvidia-h200"
    dest.mkdir(parents=True)
    for stage in lineage.discover(root / "kernels" / "attention"):
        if stage.id == missing:
            continue
        data = json.loads((TRACES / f"{stage.id}.json").read_text())
        if stage.id == stale:
            data["source_hash"] = "0" * 16
        (dest / f"{stage.id}.json").write_text(json.dumps(data))
    inp = inputs.load(root)
    return inp, site.render(inp, DiskCache(None))


@pytest.mark.slow  # the real site's render (about 20 s) or its strict build
def test_inputs_hold_every_committed_trace(real):
    inp, _ = real
    assert inp.trace_gpu == "nvidia-h200"
    assert len(inp.traces["nvidia-h200"]) == len(list(TRACES.glob("*.json")))
    for s in inp.stages:
        if s.id in AWAITING_TRACE:
            assert inp.trace(s, False) is None, f"stage {s.id} has its trace now: take it out of AWAITING_TRACE"
            continue
        assert inp.trace(s, False)["stage"] == s.id


@pytest.mark.slow  # the real site's render (about 20 s) or its strict build
def test_every_stage_page_has_its_measured_timeline(real):
    inp, built = real
    for s in inp.stages:
        page = built.pages[f"stages/{s.name}.md"]
        if s.id in AWAITING_TRACE:  # its page says so, under the model's heading
            assert "### Schedule: predicted {#timeline}" in page, s.id
            continue
        assert "### Timeline: measured and predicted {#timeline}" in page
        html = built.fragments[f"timeline-{s.name}"]
        assert f'id="s{s.id}-trace"' in html and f'id="s{s.id}-model"' in html
        assert f'id="s{s.id}-trace-warps"' in html and "<details" in html
        rec = inp.trace(s, False)
        assert f"{abs(rec['overhead']['pct']):.1f} %" in html  # the traced build's overhead, stated
        assert "Per K/V step" in html and ("disagree" in html or "agree within" in html)  # the verdict, either way
        assert f"the {rec['clock_mhz']:.0f} MHz the SM ran at" in html  # the recorded launch's clock, stated
        assert "Stale trace" not in html  # the committed traces match the sources
        if s.causal:
            assert "Measured, causal" in html and f'id="s{s.id}-trace-causal"' in html
        else:
            assert "Measured, causal" not in html
        # the model's own window is not drawn a second time on the page
        assert f"fig-s{s.id}-timeline" not in built.fragments and f'id="s{s.id}-timeline"' not in html


@pytest.mark.slow  # the real site's render (about 20 s) or its strict build
def test_the_timelines_are_assets_to_open_full_size(real):
    _, built = real
    assert "assets/generated/diagrams/s12-trace.svg" in built.assets
    assert "assets/generated/diagrams/model-vs-measured.svg" in built.assets


def test_a_stale_trace_is_flagged(tmp_path):
    inp, built = _fixture_with_traces(tmp_path, stale="02")
    stale = built.fragments["timeline-02-smem-tiles"]
    assert "Stale trace" in stale and "0000000000000000" in stale and "python -m bench.trace" in stale
    assert "Stale trace" not in built.fragments["timeline-01-baseline"]
    assert ">02*<" in built.fragments["model-vs-measured"] and ">01<" in built.fragments["model-vs-measured"]
    assert "(stale)" in built.pages["index.md"]  # the overview's table marks it too


def test_a_stage_without_a_trace_says_so_and_keeps_the_model(tmp_path):
    _, built = _fixture_with_traces(tmp_path, missing="03")
    html = built.fragments["timeline-03-ldmatrix"]
    assert "No trace of this stage is recorded yet" in html and 'id="s03-timeline"' in html
    assert 'id="s02-trace"' in built.fragments["timeline-02-smem-tiles"]


def test_a_site_without_any_trace_still_renders(tmp_path):
    root = make_site(tmp_path / "repo")
    built = site.render(inputs.load(root), DiskCache(None))
    assert "No trace of this stage is recorded yet" in built.fragments["timeline-01-baseline"]


def test_a_bad_trace_names_its_file(tmp_path):
    root = make_site(tmp_path / "repo")
    dest = root / "bench" / "results" / "traces" / "nvidia-h200"
    dest.mkdir(parents=True)
    data = json.loads((TRACES / "01.json").read_text())
    data["events"][3][2] = "nap"
    (dest / "01.json").write_text(json.dumps(data))
    with pytest.raises(traces.TraceError, match=r"01\.json.*events\[3\]"):
        inputs.load(root)


@pytest.mark.slow  # the real site's render (about 20 s) or its strict build
def test_the_overview_sets_the_model_against_the_gpu(real):
    inp, built = real
    index = built.pages["index.md"]
    assert "## The model against the GPU {#model}" in index
    chart = built.fragments["model-vs-measured"]
    assert 'id="model-vs-measured"' in chart and "989" in chart
    for s in inp.stages:
        assert f"| [{s.id}](stages/{s.name}.md#timeline) |" in index
    assert index.index("{#progression}") < index.index("{#model}") < index.index("{#environment}")


@pytest.mark.slow  # the real site's render (about 20 s) or its strict build
def test_the_real_site_builds_strict_with_the_timelines(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    out = tmp_path / "site"
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    page = (out / "stages" / "12-pingpong" / "index.html").read_text()
    assert 'id="timeline"' in page and 'id="s12-trace"' in page and "hd-slot" not in page
    assert 'id="model-vs-measured"' in (out / "index.html").read_text()
    shutil.rmtree(out)
