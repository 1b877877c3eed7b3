"""Backward stages 04-06 on the site: their figures and pages, drawn from the lineage
(kernels/attention_backward/). What their figures say — dQ through a shared tile and one bulk
reduce-add per warpgroup and step into an accumulator in block order; the deterministic mode as
stage 02's pass (04) or as turns in key-block order, the last key block first (05, 06); 06's
producer and consumers — is derived from their stage.toml, and checked here against the specs and
the kernels. Stages 01-03's figures do not change with 04-06 beside them (tests/test_backward_site.py
pins their hashes)."""

from __future__ import annotations

import re
import shutil

import pytest
from conftest import make_site
from hopattn import lineage
from hopattn.records import compiler_facts

from site_gen import site
from site_gen.diagrams.backward import backward_diagrams, dq_diagram, operands_diagram, roles_diagram
from site_gen.diagrams.backward import facts as bwd
from site_gen.diagrams.backward import roles as bwd_roles
from site_gen.diagrams.backward.operands import plan
from site_gen.diagrams.svg import text_problems
from site_gen.pages import backward as page

STAGES = ("04_dq-bulk-reduce", "05_ordered-dq", "06_warp-specialized")


def copy_lineage(kernels, names=None):
    """The backward lineage (its common/ and the stages ``names``, default all) under ``kernels``, beside
    the forward's common/ (its headers include abi.h), with the stages' committed compiler facts.
    Returns its folder."""
    if not (kernels / "attention" / "common").is_dir():
        shutil.copytree(lineage.ATTENTION_DIR / "common", kernels / "attention" / "common")
    dest = kernels / lineage.BACKWARD_DIR.name
    shutil.copytree(lineage.BACKWARD_DIR / "common", dest / "common")
    stages = [s for s in lineage.discover(lineage.BACKWARD_DIR) if names is None or s.dir.name in names]
    for s in stages:
        shutil.copytree(s.dir, dest / s.dir.name)
    folder = compiler_facts.folder_for(dest)
    folder.mkdir(parents=True)
    for s in stages:
        shutil.copy(compiler_facts.path_for(s), folder)
    return dest


@pytest.fixture(scope="module")
def stages() -> list[lineage.Stage]:
    found = lineage.discover(lineage.BACKWARD_DIR)
    assert [s.dir.name for s in found[3:6]] == list(STAGES)
    return found


def _named(stages, slug):
    return next(s for s in stages if s.dir.name.endswith(slug))


@pytest.fixture(scope="module")
def four(stages):
    return _named(stages, "dq-bulk-reduce")


@pytest.fixture(scope="module")
def five(stages):
    return _named(stages, "ordered-dq")


@pytest.fixture(scope="module")
def six(stages):
    return _named(stages, "warp-specialized")


def _text(svg: str) -> str:
    """The SVG's words, one string (tags out, entities as they are written)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", svg))


# --- the dQ path, from the spec and as the kernel has it ------------------------------------------


def test_the_dq_path_of_stages_04_to_06_comes_from_their_specs(four, five, six):
    for stage in (four, five, six):
        path = bwd.dq_path(stage)
        b = path.bulk
        assert path.atomic and path.staged and path.mechanism == "bulk reduce-add"
        assert b.ptx == "cp.reduce.async.bulk .add.f32" and b.tile == "dQ accum" and b.block_order
        assert (b.tile_rows, b.tile_cols, b.tile_bytes) == (64, 64, 16 * 1024) == (64, 64, stage.constants()["DQ_TILE_BYTES"])
        assert b.ops == 2 and path.instructions == 2 and b.part == "half"  # per CTA and step
        assert b.writers == 128 and path.per_thread == 32 and (b.store, b.stores) == ("st.shared.v4", 8)
        assert path.adds_label == "one per warpgroup and step (16 KiB), 2 per CTA"
        kernel = stage.kernel_path.read_text()
        assert "dq_block_index" in kernel and "st.shared.v4.f32" in kernel and "bulk_reduce_add_f32(" in kernel
        assert "red_add_v4" not in kernel  # no reductions from registers are left
    # 04: one thread of each warpgroup issues; the deterministic mode is still stage 02's pass
    assert bwd.dq_path(four).bulk.issuer == "one thread of the warpgroup" and not bwd.dq_path(four).bulk.own_warps
    assert bwd.dq_path(four).deterministic == "second pass" and bwd.dq_path(four).ordered is None
    assert four.diagram.dq_pass_keys == 64 and "dq_kernel" in four.kernel_path.read_text()
    # 05, 06: the same kernel's reduce-adds in key-block order, with a ticket for the key block
    for stage in (five, six):
        path = bwd.dq_path(stage)
        assert stage.diagram.dq_deterministic == path.deterministic == "ordered"
        assert path.ordered == bwd.Ordered(2, "ld.acquire.gpu", "cp.async.bulk.wait_group 0", "red.release.gpu.add", True,
                                           down=True)
        kernel = stage.kernel_path.read_text()
        # the spec's count (red.release.gpu.add -1: from the last key block down) is the kernel's
        assert "red_release_gpu_add(turn, -1);" in kernel and "first_turn = last_key_block(" in kernel
        assert "int(gridDim.x) - 1 - atomicAdd(key_block_tickets(p)" in kernel
        assert "dq_kernel" not in kernel and "wait_for_turn(turn, " in kernel and "key_block_tickets(p)" in kernel
    # 06: a dQ warp of the producer per consumer warpgroup, two tiles each
    b = bwd.dq_path(six).bulk
    assert (b.issuer_role, b.issuer_warps, b.tiles_per_op) == ("producer", (1, 2), six.constants()["DQ_BUFFERS"])
    assert b.issuer == "a dQ warp of the producer"
    assert "if (warp >= 1 && warp <= CONSUMERS && threadIdx.x % 32 == 0) dq_role(" in six.kernel_path.read_text()


def test_the_deterministic_mode_key(four, stages):
    keys = {name: (expected, doc) for name, expected, doc in lineage.spec_keys()["[diagram]"]}
    assert "second pass, ordered" in keys["dq_deterministic"][0] and "turn counter" in keys["dq_deterministic"][1]
    for stage in stages[:3]:  # left out: a second pass, as stages 01-03 have
        assert stage.diagram.dq_deterministic is None and bwd.dq_path(stage).deterministic == "second pass"


def test_a_dq_deterministic_without_a_deterministic_mode_is_an_error(five, tmp_path):
    spec = tmp_path / "stage.toml"
    shutil.copy(five.spec_path, spec)
    spec.write_text(spec.read_text().replace("deterministic = true ", "deterministic = false ", 1))
    with pytest.raises(lineage.SpecError, match=r"diagram\.dq_deterministic.*supports\.deterministic is false"):
        lineage.load_spec(spec)
    spec.write_text(spec.read_text().replace('dq_deterministic = "ordered"', 'dq_deterministic = "atomics"', 1))
    with pytest.raises(lineage.SpecError, match=r"field 'diagram\.dq_deterministic' must be one of second pass, ordered"):
        lineage.load_spec(spec)


# --- the figure of dQ -----------------------------------------------------------------------------


def test_the_dq_figures_draw_the_tile_and_the_bulk_reduce_add(four, five, six, stages):
    for stage in (four, five, six):
        d = dq_diagram(stage, stages)
        text = _text(d.svg)
        for want in ("through shared memory, one bulk reduce-add (cp.reduce.async.bulk .add.f32)", "st.shared.v4",
                     "8 per thread", "64×64 fp32, 32 / thread", "dQ accumulator, fp32", "block 0: cols 0–63",
                     "block 1: cols 64–127", "16 KiB, as the tile", "floats back to rows",
                     "each the same 2 bulk reduce-adds into the same blocks",
                     "Per CTA and step: 2 bulk reduce-adds of 16 KiB (8,192 floats, 64 rows × 128), one per warpgroup",
                     "the accumulator is kept in the tiles' order — a 16 KiB block per query block and warpgroup"):
            assert want in text, (stage.id, want)
        for wrong in ("TMA reduce-add", "32 per thread", "dS K: 64×128 fp32 partial", "in registers: dQ"):
            assert wrong not in text, (stage.id, wrong)
        assert "2 per CTA per query block" in d.caption and "kept in block order" in d.caption
    # 04: registers → its tile → one thread's bulk reduce-add; the deterministic mode, stage 02's pass
    text = _text(dq_diagram(four, stages).svg)
    assert "warpgroup 0: dQ[:, 0–63]" in text and "1 thread, 16 KiB" in text and "shared tile" in text
    assert "Deterministic mode: a second pass, no atomics" in text and "walks the keys in order, 64 a step" in text
    assert "turn" not in text and "a second pass walks the key blocks in order" in dq_diagram(four, stages).caption
    # 05, 06: turns in key-block order from the last key block down, no second pass
    for stage in (five, six):
        d = dq_diagram(stage, stages)
        text = _text(d.svg)
        assert "a second pass, no atomics" not in text and "S, dP, dS again" not in text
        for want in ("Deterministic mode: the same kernel, each query block's additions in key-block order, the last "
                     "first", "a turn counter per query block and dQ half (2 per query block), set to L, the last key "
                     "block that sees the query block; no second pass",
                     "key block L, the last", "waits for turn L, adds", "waits for it, turn → L − 1",
                     "key block 0 · keys 0–127", "waits for turn 1, adds", "waits for it, turn → 0",
                     "waits for turn 0, adds", "waits until the counter reads n (ld.acquire.gpu)",
                     "(cp.async.bulk.wait_group 0)", "adds −1 (red.release.gpu.add)",
                     "the turns run from L down to key block 0", "takes its key block from a ticket as it starts (the "
                     "last key block first)", "key block n goes only to a CTA that started after the one with n + 1"):
            assert want in text, (stage.id, want)
        for wrong in ("adds 1 (", "turn → 2", "after the one with n − 1", "… key block n"):
            assert wrong not in text, (stage.id, wrong)
        assert ("key-block order, the last key block first (a turn counter per query block and dQ half): no second "
                "pass") in d.caption
    assert "The waiting thread is one of its warpgroup's 128" in _text(dq_diagram(five, stages).svg)
    # 06: the producer's dQ warps, two tiles each, handed over on mbarriers
    text = _text(dq_diagram(six, stages).svg)
    for want in ("warpgroup 1: dQ[:, 0–63]", "warpgroup 2: dQ[:, 64–127]", "2 shared tiles, in turn",
                 "dQ warp 1, 16 KiB", "dQ warp 2, 16 KiB", "issued by dQ warps 1 and 2 of the producer warpgroup",
                 "goes to its dQ warp on a full mbarrier", "The waits are the dQ warps'",
                 "waits only when it gets 2 steps ahead of its dQ warp"):
        assert want in text, want
    assert "1 thread, 16 KiB" not in text and "issued by a dQ warp of the producer" in dq_diagram(six, stages).caption


# --- the operands ---------------------------------------------------------------------------------


def test_the_operands_figures_route_dq_through_its_tile(four, six, stages):
    for stage in (four, six):
        dq = next(chips for g, chips in plan(stage) if g.kind == "dq")
        where = {ch.role: (ch.place.tensor, ch.place.level, ch.place.how, ch.place.shape, ch.sub) for ch in dq}
        assert where["C"] == ("dQ", "regs", "per warpgroup", "32 fp32 / thread", 0.5)  # the wgmma accumulator
        assert where["tile"][1:3] == ("smem", "st.shared.v4, 8 / thread") and where["tile"][4] == 2
        assert where["sum"] == ("dQ", "global", "bulk reduce-add", "fp32 sum, block order", 2)
        d = operands_diagram(stage, stages)
        text = _text(d.svg)
        assert "dQ sum, block order" in text and "bulk reduce-add, fp32" in text and "C: dQ, fp32 sum" not in text
        assert "one thread" in text or "a dQ warp of the producer" in text
        assert "2 per CTA per query block, 8,192 floats" in text and "which the conversion kernel undoes" in text
        assert "32 per thread" not in text and "TMA reduce-add" not in text
        assert "one bulk reduce-add (cp.reduce.async.bulk .add.f32) per warpgroup and step" in d.caption
    assert "dQ tile, 16 KiB" in _text(operands_diagram(four, stages).svg)
    # 06: two tiles per consumer, and lse₂ and D loaded into the stage with Q and dO (cp.async.bulk)
    text = _text(operands_diagram(six, stages).svg)
    assert "dQ tiles, 2 × 16 KiB" in text and "a dQ warp of the producer (one per consumer warpgroup)" in text
    assert ("LSE, D", "smem", "cp.async.bulk", "every query block") in bwd.loads(six)
    assert "lse₂, D" in text and "cp.async.bulk" in text and "lse, D per row" not in text
    assert "lse, D per row" in _text(operands_diagram(four, stages).svg)  # 04 reads them from global memory
    assert "lse₂, D" in operands_diagram(six, stages).caption


# --- the roles ------------------------------------------------------------------------------------


def test_stages_04_and_05_roles_issue_the_reduce_add_from_the_warpgroups(four, five, stages):
    third = stages[2]
    for stage in (four, five):
        p = bwd_roles.protocol(stage)
        ev = {(e.kind, e.block): e for e in p.events}
        for b in (0, 1):  # one thread's bulk reduce-add, on the copies track, once dQ is in its tile
            add = ev[("reduce_dq", b)]
            assert (add.lane, add.track, add.start) == ("compute", "copy", ev[("dq", b)].end)
        assert [s.label for s in p.syncs] == [s.label for s in bwd_roles.protocol(third).syncs]  # stage 03's two
        assert all(s.threads is None for s in p.syncs)
        notes = " ".join(p.notes)
        assert ("dQ: each warpgroup stores its 64×64 share into its shared tile (st.shared.v4, 8 per thread) between two "
                "barriers of its 128 threads; one thread adds the tile with one bulk reduce-add (16 KiB)") in notes
        assert "each warp adds its rows" not in notes and "TMA reduce-add" not in notes
        text = _text(roles_diagram(stage, stages).svg)
        assert "+dQ" in text and "+dQ: the tile's bulk reduce-add" in text
        kernel = stage.kernel_path.read_text()
        assert kernel.count("named_barrier_sync<128>(DQ_BAR + wg)") == 2  # the two warpgroup barriers
    assert "Deterministic mode" not in " ".join(bwd_roles.protocol(four).notes)
    assert ("Deterministic mode: that thread first waits for the query block's turn, and after the add for its "
            "completion, while its warpgroup waits for it at the step's closing barrier") in " ".join(
        bwd_roles.protocol(five).notes)
    assert roles_diagram(four, stages).caption == ("Since backward stage 03: roles all warps (8 warps); dQ through a "
                                                   "shared tile per warpgroup, which one of its threads adds with one "
                                                   "bulk reduce-add (+dQ).")
    assert "in the deterministic mode the issuing thread waits for each query block's turn" in roles_diagram(
        five, stages).caption


def test_stage_06_roles_a_producer_of_load_and_dq_warps_and_two_consumers(six, stages):
    p = bwd_roles.protocol(six)
    assert [(ln.role, ln.label, ln.warps) for ln in p.lanes] == [("producer", "producer", (0, 1, 2, 3)),
                                                                 ("consumer", "consumers", tuple(range(4, 12)))]
    assert bwd_roles.units(six) == ("warpgroup", 2) and bwd_roles.computing_role(six) == "consumer"
    assert bwd_roles.duties(six) == {0: "load", 1: "dQ · wg 1", 2: "dQ · wg 2", 3: "idle"}
    ev = {(e.kind, e.block): e for e in p.events}
    for b in (0, 1):
        add = ev[("reduce_dq", b)]
        assert (add.lane, add.track, add.start) == ("producer", "reduce", ev[("dq", b)].end)
        assert (ev[("dq", b)], add) in p.handoffs  # the tile's full mbarrier
        assert (ev[("load_q", b)], ev[("qk", b)]) in p.handoffs  # the stage's full mbarrier
    # the consumers meet at two named barriers of their 256 threads, before dQ reads dSᵀ; nobody else waits
    free = "bar.sync: dSᵀ may be overwritten: every warpgroup's dQ of the block before has read it"
    assert [(s.label, s.threads) for s in p.syncs] == [(free, 256), ("bar.sync: dSᵀ in shared memory", 256)] * 2
    assert [s.time for s in p.syncs] == [ev[("dq", 0)].start] * 2 + [ev[("dq", 1)].start] * 2
    kernel = six.kernel_path.read_text()
    consumer = kernel[kernel.index("__device__ void consumer_role"):kernel.index("// --- the kernel:")]
    assert consumer.count("named_barrier_sync<CONSUMER_THREADS>(") == 2 and "__syncthreads" not in consumer
    assert six.constants()["CONSUMER_THREADS"] == 256
    notes = " ".join(p.notes)
    for want in ("dQ: each warpgroup the step's 64 query rows × 64 of the 128 head-dim columns, over all 128 keys",
                 "Loads: the producer's load warp (warp 0, one thread) starts each TMA (K and V once; Q and dO into "
                 "the 2 stages, lse₂ and D with them) on the stage's full mbarrier",
                 "the load warp refills the stage when all 8 have",
                 "its dQ warp (warps 1 and 2 of the producer, one per warpgroup) adds the tile with one bulk reduce-add "
                 "(16 KiB) and hands it back on its empty mbarrier",
                 "Deterministic mode: the dQ warp waits for the query block's turn"):
        assert want in notes, want
    assert "each warp adds its rows" not in notes and "not at a CTA barrier" not in notes
    d = roles_diagram(six, stages)
    text = _text(d.svg)
    for want in ("warpgroup 1 · 64 keys: 0–63", "warpgroup 2 · 64 keys: 64–127", "load", "dQ: wg 1, 2", "idle",
                 "producer · 128 threads · setmaxnreg 24", "consumers · 256 threads · setmaxnreg 240", "+dQ 0",
                 "named barrier (bar.sync of the 256 consumer threads): the consumer warps wait here, the producer never",
                 "on a full mbarrier; the buffer comes back on an empty one"):
        assert want in text, want
    assert "consumer 0" not in text and "CTA barrier (__syncthreads)" not in text
    assert "the named barriers where the 256 consumer threads wait (2 a query block)" in d.svg
    assert d.caption.startswith("Since backward stage 05: roles producer (4 warps: a load warp, 2 dQ warps), consumers "
                                "(8 warps: 2 warpgroups of 64 keys); the loads the producer's, handed over on full "
                                "mbarriers and back on empty ones; 2 named barriers of the 256 consumer threads")


# --- the schedule, and every figure legible -------------------------------------------------------


def test_the_timelines_say_what_they_leave_out(four, five, six, stages):
    caps = {s.id: next(d for d in backward_diagrams(s, stages) if d.kind == "timeline").caption
            for s in (stages[2], four, five, six)}
    assert "Not modelled: latencies, the CTA barriers' waits and the dQ atomics' traffic." in caps["03"]
    assert ("Not modelled: latencies, the CTA barriers' waits and the dQ bulk reduce-adds' traffic (the TMA unit's, "
            "beside the loads).") in caps[four.id]
    assert "the CTA barriers' waits; the dQ bulk reduce-adds' traffic" in caps[five.id]
    assert "the deterministic mode's turns" in caps[five.id]
    assert ("Not modelled: latencies; the named barriers' and mbarriers' waits; the dQ bulk reduce-adds' traffic")\
        in caps[six.id]
    assert all("atomics" not in caps[s.id] for s in (four, five, six))


def test_stages_04_to_06_figures_are_legible_and_stable(four, five, six, stages):
    for stage in (four, five, six):
        drawn = backward_diagrams(stage, stages)
        assert [d.svg for d in backward_diagrams(stage, stages)] == [d.svg for d in drawn]
        for d in drawn:
            sizes = [float(x) for x in re.findall(r'font-size="([\d.]+)"', d.svg)]
            assert min(sizes) >= (12 if d.kind in ("roles", "dq") else 11), d.id
            assert re.search(r"<title[^>]*>[^<]+</title><desc[^>]*>.{40,}</desc>", d.svg, re.S)
            if d.kind != "timeline":
                assert text_problems(d.svg, d.width, d.height) == [], d.id


def test_stages_01_to_03_figures_are_the_same_with_04_to_06_beside_them(stages, tmp_path):
    alone = lineage.discover(copy_lineage(tmp_path / "kernels", [s.dir.name for s in stages[:3]]))
    assert [s.dir.name for s in alone] == [s.dir.name for s in stages[:3]]
    for mine, theirs in zip(alone, stages[:3]):
        assert [(d.svg, d.caption) for d in backward_diagrams(mine, alone)] == \
            [(d.svg, d.caption) for d in backward_diagrams(theirs, stages)]


# --- the pages ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """A fixture site with the whole backward lineage and its compiler facts."""
    root = make_site(tmp_path_factory.mktemp("site") / "repo")
    copy_lineage(root / "kernels")
    return site.generate(root)[0]


def test_stages_04_to_06_pages(pages, four, five, six):
    for stage, lead in ((four, "dq"), (five, "dq"), (six, "roles")):
        text = pages.pages[f"backward/{stage.name}.md"]
        assert f"fig-b{stage.id}-{lead}" in text[:text.index("## Diagrams")]  # the figure of its change on top
        assert "dQ by bulk reduce-adds from shared memory (2 per CTA and step)" in text
        assert ("deterministic mode (dQ's additions in key-block order)" in text) == (stage is not four)
        assert f"fig-b{stage.id}-dq" in pages.fragments and f"fig-b{stage.id}-roles" in pages.fragments
    assert "Backward 04 · dQ through shared memory" in pages.pages["backward/03-wgmma.md"]  # its next link


def test_the_bulk_reduce_adds_in_the_sass_note(four, five):
    facts = {"opcodes": {"UBLKRED": 1, "REDG": 1, "ATOMG": 1, "HGMMA": 32}, "loop": {"opcodes": {"UBLKRED": 1,
                                                                                                 "REDG": 1}}}
    note = page.atomics_note(five, facts)
    assert ("**dQ's bulk reduce-adds in the SASS:** 1 UBLKRED in the kernel (1 in its main loop); stage.toml says one "
            "per warpgroup and query block, 2 per CTA (16 KiB each, cp.reduce.async.bulk .add.f32)") in note
    assert "2 other reduction instructions (RED, ATOM): the deterministic mode's turn counts and ticket" in note
    assert "2 other" not in page.atomics_note(four, dict(facts, opcodes={"UBLKRED": 1}))
