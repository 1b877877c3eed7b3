"""The trace records (hopattn.records.traces): the event names agree with the kernel header, device
buffers decode into a validated record (clock unwrapping, step time, the window around a tile
boundary), and a record older than its stage's sources is stale."""

import re

import pytest
from hopattn import lineage
from hopattn.records import traces

HEADER = lineage.TRACE_RECORDER


def test_event_names_follow_the_header_enum():
    body = HEADER.read_text().split("enum TraceEvent")[1].split("};")[0]
    names = re.findall(r"\bk([a-z_]+)\b", body)
    assert tuple(n for n in names if n != "event_count") == traces.EVENTS


def _buffers(steps=12, tiles=2, warps=3, capacity=256, base=(1 << 32) - 5000, mhz=2000.0):
    """Fake device buffers: warp 0 loads, warps 1-2 compute; each K/V step 1000 cycles; the clock's
    low word wraps during the launch."""
    records = [[[[0, 0, 0, 0] for _ in range(capacity)] for _ in range(warps)]]
    t = base + 100
    counts = [0] * warps
    ev = {name: i + 1 for i, name in enumerate(traces.EVENTS)}

    def put(warp, name, tile, kv, t0, t1):
        row = records[0][warp][counts[warp]]
        row[:] = [(ev[name] | (tile << 8)) & 0xFFFFFFFF, kv & 0xFFFFFFFF, t0 & 0xFFFFFFFF, t1 & 0xFFFFFFFF]
        counts[warp] += 1

    put(0, "load_q", 1, -1, t, t)  # the producer loads the second tile's Q at once: not the boundary
    put(0, "wait_empty", -1, 7, t, t)  # before any tile: tile -1 (signed), a K/V step of its own
    for tile in range(tiles):
        for kv in range(steps):
            put(0, "load_k", tile, kv, t, t)
            for w in (1, 2):
                put(w, "qk", tile, kv, t + 10, t + 200)
                put(w, "softmax", tile, kv, t + 200, t + 800)
            t += 1000
        for w in (1, 2):
            put(w, "epilogue", tile, -1, t, t + 300)
        t += 400
    return records, [[base, 123456789]], [[0, 0]], mhz


class FakeStage:
    id, name, threads = "19", "19-descriptor-offsets", 96
    roles = (lineage.Role("producer", (0,), 24, ()), lineage.Role("consumer", (1, 2), 240, ()))

    @staticmethod
    def source_hash():
        return "0123456789abcdef"


def test_device_buffers_decode_into_a_valid_record(tmp_path):
    records, bases, infos, mhz = _buffers()
    rec = traces.from_device(FakeStage, {"batch": 4, "heads": 16, "len_q": 8192, "len_k": 8192, "head_dim": 128},
                             False, records, bases, infos, mhz, plain_ms=1.6, traced_ms=1.64)
    assert rec["per_step_ns"] == 500.0  # 1000 cycles at 2 GHz
    assert rec["roles"] == ["producer", "consumer", "consumer"]
    assert rec["overhead"]["pct"] == 2.5
    assert rec["recorded"] == 2 * 12 * 5 + 4 + 2
    assert traces.decode(records, bases, infos, mhz)[0][1][2:5] == ["wait_empty", -1, 7]
    boundary = 12 * 1000 + 400  # cycles: the second tile's first step, after the first tile and its epilogue
    assert rec["window"]["start_ns"] == pytest.approx((boundary + 110 - 5 * 1000) / 2, abs=1)
    tiles = {e[3] for e in rec["events"]}
    assert tiles == {0, 1}, "the window holds the tile boundary"
    length = rec["window"]["end_ns"] - rec["window"]["start_ns"]
    assert all(e[6] >= e[5] and e[6] >= 0 and e[5] <= length for e in rec["events"])  # each overlaps the window
    starts = sorted(e[5] for e in rec["events"] if e[2] == "qk" and e[1] == 1)
    assert all(b - a in (500.0, 700.0) for a, b in zip(starts, starts[1:]))  # unwrapped across the 2^32 wrap
    run = {"date": "2026-12-01T10:00:00Z", "git_commit": "a" * 40, "git_dirty": False, "command": "x",
           "environment": {"gpu_name": "NVIDIA H200"}}
    path = traces.write(tmp_path, run, rec)
    assert path.name == "19.json"
    loaded = traces.load(path)
    assert loaded["events"] == rec["events"]
    assert traces.load_all(tmp_path)[("19", False, 128)]["stage"] == "19"


def test_a_record_names_the_field_that_is_wrong(tmp_path):
    records, bases, infos, mhz = _buffers()
    rec = traces.from_device(FakeStage, {"batch": 1, "heads": 1, "len_q": 1, "len_k": 1, "head_dim": 128}, True,
                             records, bases, infos, mhz, plain_ms=1.0, traced_ms=1.0)
    rec["events"][3][2] = "nap"
    with pytest.raises(traces.TraceError, match=r"field 'events\[3\]'"):
        traces.validate(dict(rec, run={}), "x.json")


def test_staleness_follows_the_source_hash_and_the_recorder():
    stage = lineage.discover()[-1]
    current = {"source_hash": stage.source_hash(), "recorder_hash": lineage.trace_recorder_hash()}
    assert not traces.is_stale(current, stage)
    assert traces.is_stale(dict(current, source_hash="0" * 16), stage)
    assert traces.is_stale(dict(current, recorder_hash="0" * 16), stage)
    assert traces.is_stale({"source_hash": stage.source_hash()}, stage)  # made before the recorder's hash


def test_the_recorder_is_in_no_stage_s_sources():
    """Changing how events are recorded must not make every stage's numbers stale."""
    for stage in lineage.discover():
        assert lineage.TRACE_RECORDER.resolve() not in stage.source_files(), stage.name


def _stamp_rows(steps, t0, step_cycles=1000, two_turns=False):
    """A consumer warp's step records of boundary stamps, as common/trace_recorder.cuh stores them: per
    step its events' ends, in the order of traces.STAMP_SLOTS, every stamp cleared after its record;
    the tile's first step has no PV, rescale or V wait. two_turns: a second turn (PV's) after the
    softmax, stored with the next step's record in the earlier-turn slot."""
    rows = []
    ends = {"wait_pv": 5, "rescale": 40, "wait_k": 60, "wait_v": 70, "wait_turn": 100, "qk": 130, "pv": 160,
            "wait_qk": 300, "softmax": 900}
    for kv in range(steps):
        t = t0 + kv * step_cycles
        stamps = dict.fromkeys(range(len(traces.STAMP_SLOTS)), 0)
        for name, offset in ends.items():
            if kv > 0 or name in ("wait_k", "wait_turn", "qk", "wait_qk", "softmax"):
                stamps[traces.STAMP_SLOTS.index(name)] = (t + offset) & 0xFFFFFFFF
        if two_turns and kv > 0:
            stamps[len(traces.STAMP_SLOTS) - 1] = (t - 50) & 0xFFFFFFFF  # the PV turn after the last softmax
        words = [traces.STAMP_MARK | (0 << 8) | (kv << 20), *stamps.values()]
        rows += [words[0:4], words[4:8], words[8:12]]
    return rows


def test_boundary_stamps_decode_into_events_that_start_where_the_last_one_ended():
    base, mhz, steps = (1 << 32) - 2500, 1000.0, 4  # the clock's low word wraps during the launch
    rows = _stamp_rows(steps, base + 100) + [[0, 0, 0, 0]] * 4
    events, _ = traces.decode([[rows]], [[base, 0]], [[0, 0]], mhz)
    names = [e[2] for e in events]
    assert names.count("softmax") == steps and names.count("pv") == steps - 1  # a cleared stamp: no event
    assert names[:5] == ["wait_k", "wait_turn", "qk", "wait_qk", "softmax"]  # the first step, in time order
    by = {(e[2], e[4]): e for e in events}
    assert by[("qk", 1)][5] == by[("wait_turn", 1)][6]  # a stamp's start is the warp's previous end
    assert by[("wait_pv", 1)][5] == by[("softmax", 0)][6]  # across the step boundary too
    assert by[("softmax", 2)][6] - by[("softmax", 1)][6] == 1000.0  # ns at 1 GHz, unwrapped across 2^32
    assert all(e[6] >= e[5] for e in events)
    assert {(e[3], e[4]) for e in events} == {(0, kv) for kv in range(steps)}  # the labels of word 0


def test_a_step_with_two_turns_keeps_both():
    base, steps = 1000, 3
    rows = _stamp_rows(steps, base, two_turns=True) + [[0, 0, 0, 0]] * 4
    events, _ = traces.decode([[rows]], [[base, 0]], [[0, 0]], 1000.0)
    turns = [e for e in events if e[2] == "wait_turn"]
    assert len(turns) == steps + (steps - 1)
    assert all(a[6] < b[6] for a, b in zip(turns, turns[1:]))  # in time order, none lost


def test_the_stamp_kinds_follow_the_recorder():
    cuh = lineage.TRACE_RECORDER.read_text()
    body = cuh.split("TRACE_STAMP_KINDS =")[1].split(";")[0]
    kinds = re.findall(r"trace_bit\(k([a-z_]+)\)", body)
    assert sorted(kinds, key=traces.EVENTS.index) == list(traces.STAMP_KINDS)  # slots in TraceEvent order
    assert f"TRACE_NSTAMPS = {len(traces.STAMP_SLOTS)};" in cuh
    assert f"TRACE_EARLIER_TURN = {len(traces.STAMP_SLOTS) - 1};" in cuh


def test_another_recorder_is_chosen_by_the_environment_and_changes_the_hash(monkeypatch, tmp_path):
    default = lineage.trace_recorder_hash()
    assert lineage.trace_recorder() == lineage.TRACE_RECORDER
    other = tmp_path / "recorder_x.cuh"
    other.write_text('#include "trace_recorder.cuh"\n')
    monkeypatch.setenv("HOPATTN_TRACE_RECORDER", str(other))
    assert lineage.trace_recorder() == other.resolve()
    assert lineage.trace_recorder_hash() != default
    from hopattn import build
    stage = lineage.discover()[-1]
    assert str(other.resolve()) in build.nvcc_flags(stage, traced=True)


def test_a_window_without_a_second_tile_reaches_the_next_cta_s_first_steps():
    """Non-persistent stages: slot 0 ends, the next CTA on the SM starts some microseconds later.
    The window runs from five steps before slot 0's last step ends to six after the next CTA's first
    step, however long the switch took (it once fell just short of stage 11's next CTA)."""
    steps = [[0, 1, "qk", 0, kv, 1000.0 * kv, 1000.0 * kv + 200] for kv in range(10)]  # last ends at 9200
    nxt = [[1, 1, "qk", 0, kv, 14000.0 + 1000 * kv, 14200.0 + 1000 * kv] for kv in range(8)]
    start, end = traces.window(steps + nxt, 1000.0)
    assert start == pytest.approx(9200 - 5000) and end == pytest.approx(14000 + 6000)
    start, end = traces.window(steps, 1000.0)  # no CTA after it
    assert end == pytest.approx(9200 + 6000)
    persistent = steps + [[0, 1, "qk", 1, kv, 12000.0 + 1000 * kv, 12200.0 + 1000 * kv] for kv in range(4)]
    assert traces.window(persistent, 1000.0) == pytest.approx((12000 - 5000, 12000 + 6000))


def test_the_sm_clock_comes_from_each_cta_s_run_before_the_driver():
    """A persistent CTA starts with the kernel: its start pair alone gives no rate, and the driver's
    reading after the launch was up to a fifth off. Each CTA's last epilogue gives a second pair."""
    from bench import trace

    class NoTorch:  # the driver's reading is the last resort and must not be asked for here
        class cuda:
            @staticmethod
            def clock_rate():
                raise AssertionError("asked the driver")

    bases = [[1_000_000, 5_000_000]]
    ends = [[1_000_000 + 1_755 * 3_000, 5_000_000 + 3_000_000]]  # 3 ms at 1755 MHz
    assert trace._sm_mhz(NoTorch, bases, ends) == (pytest.approx(1755.0), "each CTA's start and last epilogue")
    starts = [[0, 0], [1_800 * 50, 50_000]]  # two CTAs 50 us apart, no epilogue written
    assert trace._sm_mhz(NoTorch, starts, [[0, 0], [0, 0]])[0] == pytest.approx(1800.0)
