"""The backward's traces (Act V), without a GPU: the event names agree with its recorder
(kernels/attention_backward/common/trace_recorder_backward.cuh), which leaves the forward's
recorder and records as they are; device buffers as that recorder writes them decode into a valid
record (boundary stamps, spans, instants; the window around a CTA boundary) that round-trips
through its own folder; a backward record is stale against its stage and its recorder; the traced
build's flags; and the producer's command line (python -m bench.trace --lineage backward)."""

from __future__ import annotations

import json
import re
import shutil

import backward_trace_fixture as fx
import pytest
from conftest import REPO
from hopattn import build, lineage
from hopattn.records import traces

from bench import trace, trace_backward

RECORDER = build.BACKWARD_TRACE_RECORDER
FORWARD_TRACES = REPO / "bench" / "results" / "traces" / "nvidia-h200"


def test_event_names_follow_the_backward_recorder_s_enum():
    text = RECORDER.read_text()
    body = re.sub(r"//.*", "", text.split("enum TraceBackwardEvent")[1].split("};")[0])
    names = re.findall(r"\bk([a-z_]+)\b", body)
    assert tuple(n for n in names if n != "event_end") == traces.BACKWARD_EVENTS
    assert f"constexpr uint32_t FIRST = {traces.BACKWARD_FIRST};" in text
    assert traces.BACKWARD_FIRST > len(traces.EVENTS)  # above the forward's TraceEvent: an event byte says whose
    assert len(traces.BACKWARD_EVENTS) <= 32  # one bit each in a warp's 32-bit mask


def test_the_recorder_s_spans_and_instants_are_the_ones_the_decoder_expects():
    text = RECORDER.read_text()
    spans = re.findall(r"bit\(k([a-z_]+)\)", text.split("SPANS =")[1].split(";")[0])
    marks = re.findall(r"bit\(k([a-z_]+)\)", text.split("MARKS =")[1].split(";")[0])
    assert spans == ["wait_kv", "store_dkdv"] and marks == ["load_q", "load_do", "load_kv"]
    # every trace point a backward kernel has names an event of the recorder
    for path in lineage.BACKWARD_DIR.glob("*/kernel.cu"):
        used = set(re.findall(r"TRACE_(?:BEGIN|END|MARK)\(([a-z_]+)", path.read_text()))
        assert used <= set(traces.BACKWARD_EVENTS), (path, used - set(traces.BACKWARD_EVENTS))


def test_the_forward_s_recorder_and_records_are_untouched():
    """The backward's recorder is a file of its own, so every forward trace record stays current."""
    assert "trace_bwd" not in lineage.TRACE_RECORDER.read_text()
    for path in sorted(FORWARD_TRACES.glob("*.json")):
        data = json.loads(path.read_text())
        assert data["recorder_hash"] == lineage.trace_recorder_hash(), path.name
        assert "lineage" not in data
    stage = lineage.discover()[-1]
    assert traces.recorder_hash(stage) == lineage.trace_recorder_hash()
    assert build.nvcc_flags(stage, traced=True)[-1] == str(lineage.TRACE_RECORDER)


def test_backward_buffers_decode_into_a_valid_record(tmp_path):
    rec = fx.record()
    assert rec["lineage"] == traces.BACKWARD and rec["stage"] == "03"
    assert rec["roles"] == ["compute0"] * 4 + ["compute1"] * 4  # a role per warpgroup
    assert rec["per_step_ns"] == pytest.approx(fx.STEP / fx.MHZ * 1000)  # 4 us a query block
    # per CTA: K and V issued, Q and dO of every step (12 each); per warp the wait for K and V, 13 events a
    # step, the store of dK and dV
    assert rec["recorded"] == 2 * (1 + 2 * 12 + 8 * (2 + 13 * 12))
    assert {e[0] for e in rec["events"]} == {0, 1}, "the window holds both CTAs: slot 0's end, slot 1's start"
    events, ctas = traces.decode(*fx.buffers()[:3], fx.MHZ)
    assert [c["block"] for c in ctas] == [0, 17]
    warp0 = [e for e in events if e[0] == 0 and e[1] == 0]
    by = {(e[2], e[4]): e for e in warp0}
    # a boundary stamp starts where the warp's event before it ended; the first of a step after the
    # step before's last (or the TMA issue between them)
    assert by[("wait_qk", 3)][5] == by[("qk", 3)][6]
    assert by[("qk", 3)][5] == by[("wait_qdo", 3)][6]
    assert by[("wait_qdo", 3)][5] == by[("load_do", 4)][6]  # thread 0 issued the next step's dO just before
    assert by[("wait_qdo", 4)][6] - by[("wait_qdo", 3)][6] == pytest.approx(4000.0)  # unwrapped across 2^32
    kv = by[("wait_kv", -1)]
    assert kv[6] - kv[5] == pytest.approx(870 / fx.MHZ * 1000, abs=0.1)  # a span keeps its own start
    assert by[("load_q", 3)][5] == by[("load_q", 3)][6]  # an instant
    assert all(e[6] >= e[5] for e in events)
    path = traces.write(tmp_path / "nvidia-h200" / "backward", fx.RUN, {k: v for k, v in rec.items() if k != "run"})
    assert path.relative_to(tmp_path).as_posix() == "nvidia-h200/backward/03.json"
    assert traces.load(path)["events"] == rec["events"]
    assert traces.load_all(tmp_path / "nvidia-h200") == {}  # the forward's readers see nothing new
    assert traces.load_all(tmp_path / "nvidia-h200", backward=True)[("03", False, 128)]["lineage"] == traces.BACKWARD
    assert traces.folder("NVIDIA H200", backward=True) == traces.RESULTS_DIR / "nvidia-h200" / "backward"


def test_a_record_in_the_wrong_folder_or_with_a_forward_event_fails(tmp_path):
    rec = fx.record()
    (tmp_path / "03.json").write_text(json.dumps(rec))
    with pytest.raises(traces.TraceError, match="backward stage's trace in the forward"):
        traces.load_all(tmp_path)
    bad = json.loads(json.dumps(rec))
    bad["events"][0][2] = "pv"  # a forward event in a backward record
    with pytest.raises(traces.TraceError, match=r"events\[0\]"):
        traces.validate(bad, "x.json")
    bad = dict(rec, lineage="rmsnorm")
    with pytest.raises(traces.TraceError, match="lineage"):
        traces.validate(bad, "x.json")


def test_a_backward_record_is_stale_against_its_stage_and_its_recorder(tmp_path):
    stage = fx.stage03()
    rec = fx.record(stage)
    assert rec["source_hash"] == stage.source_hash() and not traces.is_stale(rec, stage)
    assert rec["recorder_hash"] == traces.recorder_hash(stage) != lineage.trace_recorder_hash()
    assert traces.is_stale(dict(rec, source_hash="0" * 16), stage)
    # a copy of the lineage whose backward recorder changed (a token, not a comment): stale
    kernels = tmp_path / "kernels"
    shutil.copytree(lineage.ATTENTION_DIR / "common", kernels / "attention" / "common")
    shutil.copytree(lineage.BACKWARD_DIR / "common", kernels / "attention_backward" / "common")
    shutil.copytree(stage.dir, kernels / "attention_backward" / stage.dir.name)
    copy = lineage.load_stage(kernels / "attention_backward" / stage.dir.name)
    assert traces.recorder_hash(copy) == traces.recorder_hash(stage) and not traces.is_stale(rec, copy)
    recorder = kernels / "attention_backward" / "common" / RECORDER.name
    recorder.write_text(recorder.read_text() + "\n// a comment changes nothing\n")
    assert not traces.is_stale(rec, copy)
    assert build.trace_recorder_bytes_hash(copy) != build.trace_recorder_bytes_hash(stage)  # but rebuilds
    recorder.write_text(recorder.read_text().replace("constexpr uint32_t FIRST = 32;", "constexpr uint32_t FIRST = 33;"))
    assert traces.is_stale(rec, copy)
    forward = kernels / "attention" / "common" / lineage.TRACE_RECORDER.name  # the forward's, which it builds on
    assert forward in build.trace_recorder_files(copy)


def test_the_backward_s_traced_build():
    stage = fx.stage03()
    flags = build.nvcc_flags(stage, traced=True)
    assert flags[-3:] == [build.TRACE_FLAG, "-include", str(stage.dir.parent / "common" / RECORDER.name)]
    assert build.nvcc_flags(stage) == build.COMMON_FLAGS + build.GENCODE["sm_90a"]
    assert "trace_recorder_backward.cuh" in RECORDER.read_text().split("#pragma once")[0]  # it says what it is
    assert '#include "../../attention/common/trace_recorder.cuh"' in RECORDER.read_text()
    native = (REPO / "kernels" / "hopattn" / "native.cpp").read_text()
    backward = native[native.index("class BackwardLibrary"):]
    assert "hopattn_trace_setup" in backward and '.def("trace_setup", &BackwardLibrary::trace_setup' in native


def test_the_build_names_the_backward_s_traced_library_apart(monkeypatch, tmp_path):
    monkeypatch.setattr(build, "nvcc_version", lambda: "nvcc test")
    monkeypatch.setenv("HOPATTN_BUILD_DIR", str(tmp_path))
    stage = fx.stage03()
    traced, plain = build.library_path(stage, traced=True), build.library_path(stage)
    assert traced.name.startswith("attention_backward-stage03-wgmma-traced-") and traced != plain
    forward = next(s for s in lineage.discover() if s.number == 3)
    assert build.library_path(forward, traced=True).name.startswith("stage03-ldmatrix-traced-")


def test_the_producer_s_command_line():
    args = trace.parse_args(["--lineage", "backward"])  # 'all': the stages with trace points, 03 to 11
    assert [(s.id, c) for s, c in args.plan] == [(f"{n:02d}", c) for n in (3, 4, 5, 6, 7, 8, 9, 10, 11) for c in (False, True)]
    assert [(s.id, c) for s, c in trace.parse_args(["--lineage", "backward", "--stages", "3"]).plan] == \
        [("03", False), ("03", True)]
    assert [(s.id, c) for s, c in trace.parse_args(["--lineage", "backward", "--stages", "5-6"]).plan] == \
        [("05", False), ("05", True), ("06", False), ("06", True)]
    for wrong in (["--lineage", "backward", "--stages", "1"], ["--lineage", "backward", "--stages", "12"],
                  ["--lineage", "rmsnorm"]):
        with pytest.raises(SystemExit):
            trace.parse_args(wrong)
    forward = trace.parse_args(["--stages", "21-22"])
    assert forward.lineage == "attention" and [(s.id, c) for s, c in forward.plan] == \
        [("21", False), ("21", True), ("22", False), ("22", True)]
    traced = trace_backward.traced_stages(lineage.discover(lineage.BACKWARD_DIR))
    assert [s.id for s in traced] == ["03", "04", "05", "06", "07", "08", "09", "10", "11"]


def test_the_producer_s_masks():
    stage = fx.stage03()
    assert trace_backward.kind_masks(stage) == [(1 << len(traces.BACKWARD_EVENTS)) - 1] * 8
    light = trace_backward.kind_mask(light=True)
    assert light == 1 << (traces.BACKWARD_EVENTS.index("qk"))  # bit e - 32: one row a step
    assert trace_backward.SHAPE.dims == {"batch": 4, "heads": 16, "len_q": 8192, "len_k": 8192, "head_dim": 128}
    # the light launch's rows time the steps as the full one's do
    records, bases, infos, _ = fx.buffers()
    only_qk = [[[row if row[0] & 0xFF == fx.event_id("qk") else [0, 0, 0, 0] for row in rows] for rows in slot]
               for slot in records]
    packed = [[[row for row in rows if row[0]] + [[0, 0, 0, 0]] for rows in slot] for slot in only_qk]
    assert traces.step_ns(traces.decode(packed, bases, infos, fx.MHZ)[0]) == pytest.approx(4000.0)


def test_a_warp_specialized_stage_s_roles():
    six = next(s for s in lineage.discover(lineage.BACKWARD_DIR) if s.dir.name == "06_warp-specialized")
    assert six.backward and six.threads == 384  # a producer warpgroup and two consumers
    assert [(r.name, r.warps, r.registers) for r in six.roles] == [("producer", (0, 1, 2, 3), 24),
                                                                    ("consumer", tuple(range(4, 12)), 240)]
    assert traces.roles(six) == ["producer"] * 4 + ["consumer0"] * 4 + ["consumer1"] * 4
