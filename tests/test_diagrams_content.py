"""The diagrams tell the truth: their numbers are the spec's numbers and the schedule obeys its rules."""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import xml.etree.ElementTree as ET

import pytest
from hopattn import lineage

from site_gen.diagrams import engines, facts, protocol, schedule
from site_gen.diagrams.concepts import CONCEPTS, basics, hopper, scheduling
from site_gen.diagrams.concepts.scheduling import causal_blocks, lpt, tile_shape, wgmma_smem_bytes_per_clk
from site_gen.diagrams.memory import memory_diagram, per_thread, plan
from site_gen.diagrams.memory import signature as memory_signature
from site_gen.diagrams.roles import roles_diagram
from site_gen.diagrams.svg import fmt_bytes
from site_gen.diagrams.timeline import iterations_for, timeline_diagram

SVG_NS = "{http://www.w3.org/2000/svg}"
STAGES = lineage.discover()
BY_NUMBER = {s.number: s for s in STAGES}
IDS = [s.name for s in STAGES]


def texts(svg: str) -> list[str]:
    return [t.text or "" for t in ET.fromstring(svg).iter(SVG_NS + "text")]


@pytest.mark.parametrize("stage", STAGES, ids=IDS)
def test_one_warp_box_per_warp(stage):
    d = roles_diagram(stage, STAGES)
    root = ET.fromstring(d.svg)
    boxes = [e for e in root.iter(SVG_NS + "rect") if e.get("class") == "hd-warp"]
    assert len(boxes) == stage.warps
    labels = [t for t in texts(d.svg) if re.fullmatch(r"warp \d+", t)]
    assert sorted(labels) == sorted(f"warp {w}" for w in range(stage.warps))
    for r in stage.roles:
        body = " ".join(texts(d.svg))
        assert f"{32 * len(r.warps)} threads" in body
        assert (f"setmaxnreg {r.registers}" if r.registers else "compiler-chosen") in body


@pytest.mark.parametrize("stage", STAGES, ids=IDS)
def test_timeline_obeys_the_model_rules(stage):
    iters, tiles = iterations_for(stage)
    assert iters * tiles >= 3
    slots = schedule.simulate(stage, iters, tiles)
    by_key = {s.key: s for s in slots}
    # one op at a time per unit
    for unit in schedule.UNITS:
        mine = sorted((s for s in slots if s.op.unit == unit), key=lambda s: s.start)
        for a, b in itertools.pairwise(mine):
            assert a.end <= b.start + 1e-12, (stage.id, unit, a.key, b.key)
    # every dependency respected
    for s in slots:
        for dep in s.op.after:
            back = 2 if dep.startswith("prev2.") else 1 if dep.startswith("prev.") else 0
            name = dep.split(".", 1)[1] if back else dep
            d = by_key.get((name, s.it - back))
            if d is not None:
                assert d.end <= s.start + 1e-12, (stage.id, s.key, dep)
    # a synchronous op holds its role: the role's next op starts after it ends
    order = {o.name: i for i, o in enumerate(schedule.model_ops(stage))}
    phase = {k: 1 for k in lineage.SCHEDULE_KINDS} | {"load_q": 0, "store_o": 2}
    for stream in {schedule.stream(s.op) for s in slots}:
        mine = sorted((s for s in slots if schedule.stream(s.op) == stream),
                      key=lambda s: (s.tile, s.it, phase[s.op.kind], order[s.op.name]))
        for a, b in itertools.pairwise(mine):
            if not engines.is_async(a.op.engine):
                assert a.end <= b.start + 1e-12, (stage.id, a.key, b.key)
    every = {(o.op, i) for o in stage.schedule if o.kind not in schedule.ONCE for i in range(iters * tiles)}
    assert every <= set(by_key)


@pytest.mark.parametrize("stage", STAGES, ids=IDS)
def test_timeline_draws_every_slot_and_states_the_prediction(stage):
    d = timeline_diagram(stage, STAGES)
    iters, tiles = iterations_for(stage)
    n = len(schedule.simulate(stage, iters, tiles))
    root = ET.fromstring(d.svg)
    bars = next(g for g in root.iter(SVG_NS + "g") if g.get("id") == f"{d.id}-bars")
    assert len(bars.findall(SVG_NS + "rect")) == n
    p = schedule.predict(stage)
    body = " ".join(texts(d.svg))
    assert "per KV iteration" in body and schedule.UNIT_LABEL[p.bound] in body
    assert p.period >= max(p.busy.values()) - 1e-15


def test_durations_follow_the_rates():
    s = BY_NUMBER[16]  # two consumer warpgroups, K and V loaded by separate ops
    ops = {o.name: o for o in schedule.model_ops(s)}
    # each consumer's half of the rows x block_n keys x head_dim x 2 at 989/132 TFLOP/s
    rows = s.block_m // 2
    assert schedule.duration(s, ops["qk0"]) == pytest.approx(2 * rows * s.block_n * s.head_dim / (989e12 / 132))
    assert schedule.duration(s, ops["load_k"]) == pytest.approx(s.block_n * s.head_dim * 2 / (2 * 4.24e12 / 132))
    base = BY_NUMBER[1]
    qk = {o.name: o for o in schedule.model_ops(base)}["qk"]
    assert schedule.duration(base, qk) == pytest.approx(
        2 * base.block_m * base.block_n * base.head_dim / (989e12 / 132 * 2 / 3))


def test_cyclic_schedule_is_reported():
    s = BY_NUMBER[2]
    ops = list(s.schedule)
    ops[0] = dataclasses.replace(ops[0], after=("pv",))  # load_k waits for its own iteration's pv
    bad = dataclasses.replace(s, schedule=tuple(ops))
    with pytest.raises(schedule.ScheduleError):
        schedule.simulate(bad)


@pytest.mark.parametrize("stage", STAGES, ids=IDS)
def test_memory_bytes_are_spec_arithmetic(stage):
    m, n, d = stage.block_m, stage.block_n, stage.head_dim
    rows = plan(stage)
    assert rows["Q"].boxes["hbm"].lines[:2] == (f"Q {m}×{d}", fmt_bytes(m * d * 2))
    assert rows["K"].boxes["hbm"].lines[:2] == (f"K {n}×{d}", fmt_bytes(n * d * 2))
    assert "l2" in rows["Q"].boxes and "l2" in rows["K"].boxes and "l2" in rows["V"].boxes  # Q passes L2 too
    pt = per_thread(stage)
    assert rows["S"].boxes["regs"].lines[:2] == (f"S {pt['S']} × fp32", f"{pt['S'] * 4} B / thread")
    assert rows["P"].boxes["regs"].lines[:2] == (f"P {pt['S']} × bf16", f"{pt['S'] * 2} B / thread")
    assert rows["O"].boxes["regs"].lines[:2] == (f"O {pt['O']} fp32", f"{pt['O'] * 4} B / thread")
    k_in = next(a for a in rows["K"].arrows if a.src == "l2")
    if facts.smem_of(stage, "K"):
        assert k_in.lines[1].startswith(f"{fmt_bytes(n * d * 2 // facts.cluster(stage))} / iter")
    else:
        warps = len(facts.role(stage, stage.schedule[0].role).warps)
        assert k_in.lines[1] == f"{warps} × {fmt_bytes(n * d * 2)}"
    body = texts(memory_diagram(stage, [stage]).svg)
    if stage.smem:
        assert f"Shared memory of one CTA: {fmt_bytes(stage.smem_bytes)} of 227 KiB" in body


@pytest.mark.parametrize("stage", STAGES, ids=IDS)
def test_registers_per_thread_are_the_kernels(stage):
    """The register column is per thread: the kernel's own counts of S and O accumulators."""
    c = stage.constants()
    pt = per_thread(stage)
    if "S_REGS" in c:  # wgmma stages: a consumer thread's fp32 of S and of O
        assert (pt["S"], pt["O"]) == (c["S_REGS"], c["O_REGS"])
        if "P_REGS" in c:
            assert pt["S"] // 2 == c["P_REGS"]  # P packed two bf16 to a register
    else:  # mma.sync: a warp's rows over its 32 lanes
        assert pt["S"] == c["ROWS_PER_WARP"] * c["BLOCK_N"] // 32
        assert pt["O"] == c["O_TILES"] * c["M_TILES"] * 4


def test_p_goes_through_shared_memory_only_on_stage_08():
    p8, p9 = plan(BY_NUMBER[8])["P"], plan(BY_NUMBER[9])["P"]
    assert [(a.src, a.dst) for a in p8.arrows] == [("regs", "smem"), ("smem", "tensor")] and "smem" in p8.boxes
    assert p8.arrows[1].below and "SS" in p8.arrows[1].lines[0]  # drawn under the register box, not through it
    assert [(a.src, a.dst) for a in p9.arrows] == [("regs", "tensor")] and "RS" in p9.arrows[0].lines[0]


def test_pictures_that_must_differ_do_and_unchanged_ones_say_so():
    def sig(n):
        return memory_signature(BY_NUMBER[n])
    # the causal / any-length / BSHD stage shows its 4-D boxes and masks; the others change too
    for a, b in ((4, 5), (10, 11), (15, 16), (16, 17), (17, 18), (19, 20)):
        assert sig(a) != sig(b), (a, b)
    assert any("4-D" in x.lines[0] for x in plan(BY_NUMBER[17])["K"].arrows if x.lines)
    assert "masked tiles" in plan(BY_NUMBER[17])["S"].boxes["regs"].lines
    # a stage whose memory movement did not change (softmax arithmetic, pingpong, descriptors) says so
    for a, b in ((5, 6), (11, 12), (18, 19)):
        assert sig(a) == sig(b), (a, b)
    roles = {n: roles_diagram(BY_NUMBER[n], STAGES) for n in (11, 12, 18, 19)}
    assert not roles[12].same_picture(roles[11]) and roles[19].same_picture(roles[18])


@pytest.mark.parametrize("stage", STAGES, ids=IDS)
def test_protocol_rings_are_the_kernels(stage):
    """Ring depths, registers and turn-taking drawn in the warp-roles figure against kernel.cu."""
    c = stage.constants()
    p = protocol.build(stage)
    rings = {r.key: r for r in p.rings}
    kv = [r for r in p.rings if r.per == "KV tile"]
    for r in kv:
        assert r.depth == c.get("KV_STAGES", 1), (r.key, r.depth)
    if "Q_STAGES" in c:
        assert rings["Q"].depth == c["Q_STAGES"]
    if "SCHED_STAGES" in c:
        assert rings["ID"].depth == c["SCHED_STAGES"]
    else:
        assert "ID" not in rings
    for ln in p.lanes:
        if ln.loads_only:
            assert ln.registers == c["PRODUCER_REGS"]
        elif "CONSUMER_REGS" in c:
            assert ln.registers == c["CONSUMER_REGS"]
    assert p.turns == ("PINGPONG_BAR" in c)
    # every refill waits for the release of the tile its slot held one ring depth earlier
    for sg in p.signals:
        if sg.kind == "empty":
            ring = rings[sg.ring]
            assert sg.dst.tile - sg.src.tile == ring.depth, (sg.src.label, sg.dst.label)
            assert sg.src.end <= sg.dst.start
        if sg.kind in ("full", "turn"):
            assert sg.src.end <= sg.dst.start


def test_stage_11_ring_is_three_deep_in_the_picture():
    p = protocol.build(BY_NUMBER[11])
    empties = [sg for sg in p.signals if sg.kind == "empty"]
    assert empties and {sg.dst.tile - sg.src.tile for sg in empties} == {3}
    body = texts(roles_diagram(BY_NUMBER[11], STAGES).svg)
    assert "3 × 32 KiB" in body and "slot 2" in body


def test_wgmma_descriptor_values_are_the_kernels():
    for n in (8, 9, 16, 19):
        s = BY_NUMBER[n]
        c = s.constants()
        v = hopper.descriptor_values(s)
        assert v["K"]["sbo"] == v["V"]["sbo"] == c["SWIZZLE_ATOM"]
        assert v["V"]["lbo"] == c["BLOCK_N"] * c["BOX_COLS"] * 2
        src = s.kernel_path.read_text()
        # V's LBO and SBO as drawn: passed to make_smem_desc_sw128, or (stage 19) to desc_lo, whose SBO is fixed
        assert ("BLOCK_N * BOX_COLS * 2, SWIZZLE_ATOM" in src
                or ("BLOCK_N * BOX_COLS * 2)" in src and "make_smem_desc_sw128(smem_addr, lbo_bytes, SWIZZLE_ATOM)" in src))


def test_online_softmax_example_is_the_softmax():
    steps = basics.online_steps()
    every = [x for tile in basics.EXAMPLE_SCORES for x in tile]
    m = max(every)
    assert steps[-1]["m"] == m
    assert steps[-1]["l"] == pytest.approx(sum(math.exp(x - m) for x in every))
    assert [st["grew"] for st in steps][1:] == [False, True, False]


def test_mechanisms_come_from_the_spec():
    fx = BY_NUMBER
    assert facts.load_family(fx[1], "K") == "ld.global" and facts.fragment_family(fx[1]) == "ld.global"
    assert facts.fragment_family(fx[2]) == "ld.shared" and facts.fragment_family(fx[3]) == "ldmatrix"
    assert facts.load_family(fx[5], "K") == "cp.async"
    assert facts.load_family(fx[7], "K") == "tma" and facts.load_family(fx[7], "Q") == "tma"
    assert facts.p_in_smem(fx[8]) and not facts.p_in_smem(fx[9])
    assert facts.o_path(fx[15]) == ["st.shared", "tma-store"] and facts.o_path(fx[14]) == ["st.global"]
    assert facts.persistent(fx[14]) and not facts.persistent(fx[13])
    # without a [movement] hint, a wgmma stage reads its operands through descriptors
    bare = dataclasses.replace(fx[8], movement=lineage.Movement())
    assert facts.fragment_family(bare) == "wgmma-desc"
    # a 2-CTA cluster multicasting K/V (no stage has one; the diagrams draw it all the same)
    clustered = dataclasses.replace(fx[16], cluster=2)
    assert facts.cluster(clustered) == 2 and facts.cluster(fx[16]) == 1
    labels = [a.lines[0] for a in plan(clustered)["K"].arrows if a.lines]
    assert any(lbl.startswith("TMA ×2 multicast") for lbl in labels)


def test_causal_block_map_counts():
    blocks = causal_blocks(128, 128, 1024)
    states = list(blocks.values())
    assert states.count("mask") == 8 and states.count("full") == 28 and states.count("skip") == 28
    for (i, j), s in causal_blocks(128, 160, 1024).items():
        rows, cols = range(128 * i, 128 * i + 128), range(160 * j, min(160 * j + 160, 1024))
        visible = [c <= r for r in rows for c in cols]
        assert s == ("full" if all(visible) else "skip" if not any(visible) else "mask")


def test_tile_shape_bytes_per_clock():
    # SS m64nNk16: (2 KB of Q + 32 N bytes of K) per N/2 clocks at 4096 FLOP/clk; RS reads V alone.
    assert [wgmma_smem_bytes_per_clk(n) for n in (64, 128, 256)] == [128, 96, 80]
    assert wgmma_smem_bytes_per_clk(128, a_in_smem=False) == 64
    assert (16, scheduling.tile_shape) in CONCEPTS
    assert not any("cluster" in build.__name__ for _, build in CONCEPTS)


def test_tile_shape_diagram_states_the_numbers():
    real = lineage.discover()
    s16 = next(s for s in real if s.number == 16)
    d = tile_shape(s16, real)
    assert d.id == "c-tile-shape" and d.stage == 16
    body = texts(d.svg)
    for label in ("128 B/clk", "96 B/clk", "80 B/clk", "64 B/clk"):
        assert label in body
    assert "this stage" in body and "stage 15" in body
    assert "4 × fixed costs, 1/64 per key" in body and "2 × fixed costs, 1/128 per key" in body


def test_longest_first_beats_launch_order():
    costs = [(i, i + 1) for i in range(8)]
    def span(plan):
        return max(e for _, _, e, _ in plan)
    assert span(lpt(sorted(costs, key=lambda x: -x[1]), 3)) < span(lpt(costs, 3))


def test_an_op_may_declare_its_rows():
    s = BY_NUMBER[10]
    s2 = dataclasses.replace(s, schedule=tuple(dataclasses.replace(o, rows=32) if o.op == "qk0" else o
                                               for o in s.schedule))
    ops = {o.name: o for o in schedule.model_ops(s2)}
    assert schedule.duration(s2, ops["qk0"]) == pytest.approx(schedule.duration(s2, ops["qk1"]) / 2)
