"""Stage 24's traces at the head dims besides 128 (issue #29): `python -m bench.trace --head-dim`, the
records' names and head dim, the schedule model at the head dim's tile, and the stage page's tabs of
such records, drawn from a synthetic pair (24.json and 24-causal.json as head dim 256's) while no
GPU run has written the real ones."""

from __future__ import annotations

import copy
import json
import re

import pytest
from hopattn import lineage
from hopattn.records import traces

from bench import trace
from site_gen import inputs
from site_gen.cache import DiskCache
from site_gen.diagrams import schedule, timeline_section
from site_gen.site import Site

STAGES = {s.id: s for s in lineage.discover()}
S24 = STAGES["24"]
FOLDER = traces.folder("NVIDIA H200")
RECORDS = traces.load_all(FOLDER)


def _at_256(record: dict) -> dict:
    """A head-dim-128 record made to read as head dim 256's (the shape `--head-dim 256` traces)."""
    out = copy.deepcopy(record)
    out["shape"] = trace.record_shape(trace.trace_shape(S24.at_head_dim(256)))
    return out


SYNTHETIC = {("24", c, 256): _at_256(RECORDS[("24", c, 128)]) for c in (False, True)}


class _Inputs:
    """What the timeline part reads of the site's inputs (site_gen.inputs.Inputs' trace and other_head_dims)."""

    trace_gpu = "nvidia-h200"

    def __init__(self, records):
        self.records = records

    def trace(self, stage, causal, head_dim=None):
        return self.records.get((stage.id, causal, head_dim or stage.head_dim))

    def other_head_dims(self, stage):
        return sorted({d for sid, _, d in self.records if sid == stage.id and d != stage.head_dim})


def test_head_dim_selects_the_tile_of_the_head_dim():
    args = trace.parse_args(["--stages", "24", "--head-dim", "256"])
    assert [(s.id, s.head_dim, c) for s, c in args.plan] == [("24", 256, False), ("24", 256, True)]
    stage = args.plan[0][0]
    assert (stage.block_m, stage.block_n, stage.threads) == (128, 80, 384)  # HeadDimTile<256>
    assert trace.records_per_warp(stage, 4096) == 3 * (12 * 103 + 16)  # 8192 keys in steps of 80
    # head dim 64: three consumers, 512 threads, a role for the third (its warps 12-15)
    d64 = trace.parse_args(["--stages", "24", "--head-dim", "64"]).plan[0][0]
    assert d64.threads == 512 and traces.roles(d64)[12:] == ["consumer2"] * 4
    # no --head-dim, or the one [tile] draws: the stage as before
    assert all(s == S24 for s, _ in trace.parse_args(["--stages", "24"]).plan)
    assert all(s == S24 for s, _ in trace.parse_args(["--stages", "24", "--head-dim", "128"]).plan)


@pytest.mark.parametrize("wrong", [["--stages", "23", "--head-dim", "256"], ["--stages", "24", "--head-dim", "80"],
                                   ["--stages", "24", "--head-dim", "x"]])
def test_a_head_dim_the_stage_does_not_serve_is_refused(wrong, capsys):
    with pytest.raises(SystemExit):
        trace.parse_args(wrong)
    assert "--head-dim" in capsys.readouterr().err


def test_the_traced_shape_is_the_head_dim_s_8k_point():
    assert trace.record_shape(trace.trace_shape(S24)) == trace.SHAPE.dims  # head dim 128: today's records
    assert trace.record_shape(trace.trace_shape(S24.at_head_dim(256))) == \
        {"batch": 4, "heads": 8, "len_q": 8192, "len_k": 8192, "head_dim": 256}
    assert trace.record_shape(trace.trace_shape(S24.at_head_dim(192)))["head_dim_v"] == 128


def test_records_at_other_head_dims_are_named_by_it(tmp_path):
    assert traces.record_name("24", False) == traces.record_name("24", False, 128) == "24.json"
    assert traces.record_name("24", True, 128) == "24-causal.json"
    assert traces.record_name("24", False, 256) == "24-d256.json"
    assert traces.record_name("24", True, 256) == "24-d256-causal.json"
    run = RECORDS[("24", True, 128)]["run"]
    for key, rec in SYNTHETIC.items():
        path = traces.write(tmp_path, run, {k: v for k, v in rec.items() if k != "run"})
        assert path.name == traces.record_name(*key)
        assert traces.head_dim_of(traces.load(path)) == 256  # the record holds its head dim
    traces.write(tmp_path, run, {k: v for k, v in RECORDS[("24", False, 128)].items() if k != "run"})
    assert sorted(traces.load_all(tmp_path)) == [("24", False, 128), ("24", False, 256), ("24", True, 256)]


def test_a_record_in_a_file_of_another_head_dim_fails_naming_it(tmp_path):
    (tmp_path / "24.json").write_text(json.dumps(SYNTHETIC[("24", False, 256)]))
    with pytest.raises(traces.TraceError, match=r"24\.json: its record is of 24-d256\.json"):
        traces.load_all(tmp_path)


def test_the_site_inputs_hold_the_other_head_dims(tmp_path):
    gpu = tmp_path / "nvidia-h200"
    gpu.mkdir()
    for (sid, causal, d), rec in {**SYNTHETIC, ("24", False, 128): RECORDS[("24", False, 128)]}.items():
        (gpu / traces.record_name(sid, causal, d)).write_text(json.dumps(rec))
    inp = inputs.Inputs(root=tmp_path, stages=[], hashes={}, results=[], facts={}, traces=inputs._traces(tmp_path))
    assert inp.trace(S24, False)["shape"]["head_dim"] == 128
    assert inp.trace(S24, True) is None and inp.trace(S24, True, 256)["causal"]
    assert inp.other_head_dims(S24) == [256] and inp.other_head_dims(STAGES["23"]) == []


def test_the_model_takes_the_head_dim_s_tile_where_the_schedule_holds():
    assert timeline_section.model_stage(S24, 128) is S24
    d256 = timeline_section.model_stage(S24, 256)
    assert (d256.block_m, d256.block_n, d256.head_dim) == (128, 80, 256)
    assert timeline_section.model_stage(S24, 64) is None  # three consumers: not the spec's schedule
    assert timeline_section.model_stage(S24, 192) is None  # V of 128
    at_128 = timeline_section.step_comparison(S24, RECORDS[("24", True, 128)])
    at_256 = timeline_section.step_comparison(S24, SYNTHETIC[("24", True, 256)])
    assert at_256.predicted_ns == pytest.approx(schedule.predict(d256).period * 1e9)
    assert at_256.predicted_ns == pytest.approx(at_128.predicted_ns * 80 * 256 / (128 * 128), rel=0.02)


def _timeline(records) -> str:
    site = Site()
    timeline_section.stage_section(S24, STAGES["23"], _Inputs(records), site, DiskCache(None))
    return site.fragments[f"timeline-{S24.name}"]


def _captions(html: str) -> list[str]:
    return re.findall(r"<figcaption>(.*?)</figcaption>", html, re.S)


@pytest.fixture(scope="module")
def today():
    return _timeline({k: r for k, r in RECORDS.items() if k[0] in ("23", "24") and k[2] == 128})


@pytest.fixture(scope="module")
def with_256():
    return _timeline({**{k: r for k, r in RECORDS.items() if k[0] in ("23", "24") and k[2] == 128}, **SYNTHETIC})


def test_without_a_d256_record_the_page_shows_head_dim_128_alone_and_says_so(today):
    assert "256" not in re.sub(r"<svg.*?</svg>", "", today, flags=re.S)  # no tab, figure or note of 256
    assert re.findall(r'<figure[^>]* id="fig-(s24-[a-z0-9-]+)"', today) == \
        ["s24-trace", "s24-model", "s24-trace-warps", "s24-trace-causal", "s24-model-causal", "s24-trace-causal-warps"]
    captions = _captions(today)
    assert len(captions) == 6 and all(c.startswith("<p>Head dim 128") for c in captions)
    assert "Head dim 128: the model of its tile, 128 query rows × 128 keys." in today


def test_a_d256_record_gets_tabs_of_its_own_each_figure_stating_its_head_dim(today, with_256):
    for label in ("Measured, non-causal", "Measured, causal", "Measured, head dim 256, non-causal",
                  "Measured, head dim 256, causal"):
        assert f">{label}</label>" in with_256
    ids = re.findall(r'<figure[^>]* id="fig-(s24-[a-z0-9-]+)"', with_256)
    assert ids[:6] == re.findall(r'<figure[^>]* id="fig-(s24-[a-z0-9-]+)"', today)  # head dim 128's first, as before
    assert ids[6:] == ["s24-trace-d256", "s24-model-d256", "s24-trace-d256-warps", "s24-trace-d256-causal",
                       "s24-model-d256-causal", "s24-trace-d256-causal-warps"]
    captions = _captions(with_256)
    assert all(c.startswith("<p>Head dim 128") for c in captions[:6])
    assert all(c.startswith("<p>Head dim 256") for c in captions[6:])
    assert "<code>bench/results/traces/nvidia-h200/24-d256-causal.json</code>" in captions[9]
    assert "Head dim 256: the model of its tile, 128 query rows × 80 keys." in captions[7]
    assert "measured timeline (head dim 256, causal)" in with_256  # the figure's title too
    assert "what else differs is not modelled: 1 Q buffer where the schedule has 2" in with_256
