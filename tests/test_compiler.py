"""Compiler facts without a compiler: parsing real ptxas and cuobjdump output (small fixtures built
from tests/fixtures/compiler/*.cu), the instruction groups, the main-loop finder, the record format,
the stage-to-stage diff and the rendered page section, and rules over the committed facts."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from hopattn import cpp, lineage
from hopattn.compiler import facts as producer
from hopattn.compiler import line_info, ptxas, sass
from hopattn.records import compiler_facts as record

from site_gen.compiler_section import changes, overview, section

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "compiler"
TOOLS = {"cuobjdump": "V13.5.37", "nvcc": "V13.0.88", "nvdisasm": "V13.5.37"}


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def instrs_of(name: str, arch: str = "sm_90a") -> list[sass.Instr]:
    functions = sass.parse_sass(fixture(f"{name}.sass.txt"), arch)
    assert len(functions) == 1
    return next(iter(functions.values()))


@pytest.fixture(scope="module")
def stage01() -> lineage.Stage:
    return lineage.load_stage(lineage.ATTENTION_DIR / "01_baseline")


# --- ptxas ---------------------------------------------------------------------------------------


def test_ptxas_report_of_stage01_per_arch():
    res = ptxas.parse_ptxas(fixture("stage01.ptxas.txt"))
    fn = "_Z16attention_kernel10AttnParams"
    assert set(res) == {("sm_90a", fn), ("sm_80", fn)}
    hopper = res[("sm_90a", fn)]
    assert (hopper.registers, hopper.spill_stores, hopper.spill_loads, hopper.stack_frame) == (175, 0, 0, 0)
    assert res[("sm_80", fn)].registers == 174  # each arch has its own report


def test_ptxas_static_smem_barriers_and_advisories():
    res = ptxas.parse_ptxas(fixture("wgmma_tma.ptxas.txt"))
    r = res[("sm_90a", "_Z9wgmma_tma9TensorMapS_if")]
    assert (r.barriers, r.static_smem, r.spill_stores) == (2, 1024, 0)
    assert r.registers == 232  # setmaxnreg.inc budget of the consumer
    summary = ptxas.advisory_summary(r.advisories)
    assert len(summary) == 1 and summary[0].startswith("(C7519) warpgroup.arrive is injected")
    assert summary[0].endswith("(×3)") and "line" not in summary[0]
    mma = ptxas.parse_ptxas(fixture("mma_loop.ptxas.txt"))
    assert mma[("sm_90a", "_Z8mma_loopPKjPfif")].static_smem == 512


def test_ptxas_warnings_belong_to_the_next_function():
    log = ("ptxas warning : Registers are spilled to local memory in function 'k', 8 bytes spill stores\n"
           "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
           "ptxas info    : Used 12 registers, used 1 barriers, 16 bytes smem, 384 bytes cmem[0]\n")
    r = ptxas.parse_ptxas(log)[("sm_90a", "k")]
    assert (r.registers, r.barriers, r.static_smem) == (12, 1, 16)
    assert r.advisories == ["warning: Registers are spilled to local memory, 8 bytes spill stores."]


def test_ptxas_spills():
    r = ptxas.parse_ptxas(fixture("spill.ptxas.txt"))[("sm_90a", "_Z5spillPKfPfi")]
    assert (r.registers, r.stack_frame, r.spill_stores, r.spill_loads) == (32, 176, 328, 328)


# --- SASS ----------------------------------------------------------------------------------------


def test_sass_keeps_only_the_requested_arch():
    dump = fixture("mma_loop.sass.txt")
    hopper, ampere = instrs_of("mma_loop", "sm_90a"), instrs_of("mma_loop", "sm_80")
    assert [i.addr for i in hopper] == sorted({i.addr for i in hopper})  # one function, not two merged
    assert [i.text() for i in hopper] != [i.text() for i in ampere]
    assert dump.count("Function : _Z8mma_loopPKjPfif") == 2
    assert sass.parse_sass(dump, "sm_100a") == {}


def test_instruction_parsing_keeps_predicate_and_modifiers():
    ins = sass.parse_instruction("@!P0 BRA 0x5c80", 0x290)
    assert (ins.pred, ins.opcode, ins.operands) == ("@!P0", "BRA", "0x5c80")
    assert sass.branch_target(ins) == 0x5c80
    hmma = sass.parse_instruction("HMMA.16816.F32.BF16 R8, R4, R20, R8", 0x340)
    assert (hmma.key, hmma.pred) == ("HMMA", "")
    assert sass.opcode_key("MUFU.EX2") == "MUFU.EX2"
    assert sass.opcode_key("UTMALDG.2D") == "UTMALDG"


@pytest.mark.parametrize("key,group", [
    ("HMMA", "tensor"), ("HGMMA", "tensor"), ("LDSM", "memory"), ("UTMALDG", "memory"),
    ("UTMASTG", "memory"), ("LDGSTS", "memory"), ("STSM", "memory"), ("MUFU.EX2", "softmax"),
    ("FFMA", "softmax"), ("FMNMX", "softmax"), ("SYNCS", "sync"), ("WARPGROUP", "sync"),
    ("BAR", "sync"), ("DEPBAR", "sync"), ("USETMAXREG", "sync"), ("LDL", "local"), ("STL", "local"),
    ("IMAD", "other"), ("BRA", "other")])
def test_groups(key, group):
    assert record.group_of(key) == group


def test_wgmma_histogram_and_groups():
    instrs = instrs_of("wgmma_tma")
    hist = sass.histogram(instrs)
    for key in ("HGMMA", "UTMALDG", "UTMASTG", "SYNCS", "WARPGROUP", "USETMAXREG", "MUFU.EX2"):
        assert hist.get(key, 0) > 0, key
    assert "HMMA" not in hist and "NOP" not in hist
    groups = sass.group_counts(hist)
    assert list(groups) == list(record.GROUP_ORDER)
    assert sum(groups.values()) == sum(hist.values())
    assert groups["tensor"] == hist["HGMMA"]
    assert sass.tensor_shapes(instrs) == {"HGMMA.64x8x16.F32.BF16": hist["HGMMA"]}


def test_register_budgets_from_setmaxnreg():
    assert sass.register_budgets(instrs_of("wgmma_tma")) == {"alloc": [232], "dealloc": [40]}
    assert sass.register_budgets(instrs_of("mma_loop")) == {}


def test_spill_kernel_uses_local_memory():
    groups = sass.group_counts(sass.histogram(instrs_of("spill")))
    assert groups["local"] > 0 and groups["tensor"] == 0
    assert sass.main_loop(instrs_of("spill")) is None  # no tensor-core loop


def test_main_loop_is_the_innermost_tensor_loop():
    instrs = instrs_of("wgmma_tma")
    loop = sass.main_loop(instrs)
    assert loop is not None
    back_edge = next(i for i in instrs if i.addr == loop.end)
    assert sass.branch_target(back_edge) == loop.start
    # The compiler unrolled the loop 4x: the unrolled body beats the remainder loop...
    tensor_loops = [lp for lp in sass.loops(instrs) if lp.tensor]
    assert loop.tensor == max(lp.tensor for lp in tensor_loops) == 16
    # ...and jumps back from the out-of-line barrier-retry blocks are no loops.
    assert all(not (i.opcode == "EXIT" and not i.pred) for lp in tensor_loops for i in lp.body)
    body_keys = {i.key for i in loop.body}
    assert {"HGMMA", "UTMALDG", "SYNCS", "MUFU.EX2"} <= body_keys


def test_main_loop_of_mma_kernel():
    loop = sass.main_loop(instrs_of("mma_loop"))
    assert {"HMMA", "LDSM", "LDGSTS", "MUFU.EX2"} <= {i.key for i in loop.body}


def _ins(addr: int, opcode: str, operands: str = "R0, R1, R2", pred: str = "") -> sass.Instr:
    return sass.Instr(addr, pred, opcode, operands)


def test_main_loop_is_the_kv_loop_not_an_inner_gemm_loop():
    # kv: 0x00..0x90 holds a k-step loop 0x10..0x30 (HMMA only), then the softmax and PV.
    code = [_ins(0x00, "IMAD"), _ins(0x10, "LDG.E"), _ins(0x20, "HMMA.16816.F32.BF16"),
            _ins(0x30, "BRA", "0x10", "@P0"), _ins(0x40, "FMNMX"), _ins(0x50, "MUFU.EX2", "R3, R4"),
            _ins(0x60, "HMMA.16816.F32.BF16"), _ins(0x70, "HMMA.16816.F32.BF16"), _ins(0x80, "IADD3"),
            _ins(0x90, "BRA", "0x0", "@P1"), _ins(0xa0, "EXIT", "")]
    loop = sass.main_loop(code)
    assert (loop.start, loop.end, loop.tensor) == (0x00, 0x90, 3)
    # A persistent tile loop around it (0x00..0xb0 here) does not win either.
    outer = code[:-1] + [_ins(0xa0, "HMMA.16816.F32.BF16"), _ins(0xb0, "BRA", "0x0", "@P2"), _ins(0xc0, "EXIT", "")]
    assert (sass.main_loop(outer).start, sass.main_loop(outer).end) == (0x00, 0x90)


def _synthetic_loop(n: int, tensor_at: int, mufu_at: int) -> list[sass.Instr]:
    body = []
    for k in range(n):
        op = "HMMA.16816.F32.BF16" if k == tensor_at else "MUFU.EX2" if k == mufu_at else "IMAD"
        body.append(sass.Instr(k * 16, "", op, "R0, R1, R2"))
    body[-1] = sass.Instr((n - 1) * 16, "@P0", "BRA", "0x0")
    return body


def test_listing_is_bounded_and_keeps_landmarks():
    body = _synthetic_loop(2000, 700, 1500)
    lines = sass.listing(body)
    assert len(lines) <= sass.LISTING_MAX
    text = "\n".join(lines)
    assert body[0].text() in text and body[700].text() in text and body[1500].text() in text
    assert lines[-1] == body[-1].text()
    assert "instructions not shown" in text
    hidden = sum(int(line.split("...")[1].split()[0]) for line in lines if "not shown" in line)
    assert hidden + sum(1 for line in lines if "not shown" not in line) == 2000
    short = _synthetic_loop(50, 10, 20)
    assert sass.listing(short) == [i.text() for i in short]


# --- source lines ----------------------------------------------------------------------------------


def test_line_info_maps_loop_to_source():
    text = fixture("wgmma_tma.nvdisasm.txt")
    instrs = {"_Z9wgmma_tma9TensorMapS_if": instrs_of("wgmma_tma")}
    lines = line_info.line_maps([text], instrs)["_Z9wgmma_tma9TensorMapS_if"]
    assert {w[-1][0] for w in lines.values()} == {"wgmma_tma.cu"}  # absolute paths shortened
    loop = sass.main_loop(instrs["_Z9wgmma_tma9TensorMapS_if"])
    source = fixture("wgmma_tma.cu").splitlines()
    first, last = line_info.span([i.addr for i in loop.body], lines, "wgmma_tma.cu")
    assert "for (int i = 0; i < n; ++i)" in "\n".join(source[first - 2:last])
    hgmma = next(i for i in loop.body if i.key == "HGMMA")
    at = lines[hgmma.addr][-1][1]  # a multi-line asm statement is attributed to its last line
    assert "wgmma.mma_async" in "\n".join(source[at - 5:at])


def test_line_info_of_another_cubin_is_rejected():
    text = fixture("wgmma_tma.nvdisasm.txt")
    other = {"_Z9wgmma_tma9TensorMapS_if": instrs_of("mma_loop")}  # same name, different code
    assert line_info.line_maps([text], other) == {}


def test_short_paths_and_labels():
    assert line_info.short_path("/r/kernels/attention/07_tma/kernel.cu") == "kernel.cu"
    assert line_info.short_path("/r/kernels/attention/07_tma/../common/tma.cuh") == "common/tma.cuh"
    assert line_info.short_path("/usr/local/cuda/include/cuda_bf16.hpp") == "cuda_bf16.hpp"
    assert line_info.label((("common/mma_sm80.cuh", 18), ("kernel.cu", 76))) == "common/mma_sm80.cuh:18 < kernel.cu:76"
    assert line_info.label((("kernel.cu", 76),)) == "kernel.cu:76"
    through_header = (("sm_30_intrinsics.hpp", 449), ("common/mma_sm80.cuh", 26), ("kernel.cu", 111))
    assert line_info.label(through_header) == "common/mma_sm80.cuh:26 < kernel.cu:111"


def test_stacked_line_comments_keep_the_inlined_chain():
    text = ('\t.section\t.text.k,"ax",@progbits\n'
            '\t//## File "/r/kernels/attention/03_x/../common/ldmatrix.cuh", line 18 inlined at "/r/kernels/attention/03_x/kernel.cu", line 95\n'
            '\t//## File "/r/kernels/attention/03_x/kernel.cu", line 95\n'
            "        /*0010*/                   LDSM.16.M88.4 R52, [R152] ;\n"
            '\t//## File "/r/kernels/attention/03_x/kernel.cu", line 96\n'
            "        /*0020*/                   NOP ;\n")
    lines = line_info.parse_line_info(text)["k"]
    assert lines == {0x10: (("common/ldmatrix.cuh", 18), ("kernel.cu", 95)), 0x20: (("kernel.cu", 96),)}


# --- diff ----------------------------------------------------------------------------------------


def _facts(**over) -> dict:
    base = {"registers": 168, "spill_stores": 0, "spill_loads": 0, "static_smem": 0, "dynamic_smem": 0,
            "opcodes": {"HMMA": 512, "LDSM": 64, "IMAD": 10}}
    return base | over


def test_diff_headline():
    prev = _facts()
    cur = _facts(registers=240, dynamic_smem=96 * 1024, opcodes={"HGMMA": 64, "UTMALDG": 4, "LDSM": 64, "IMAD": 3})
    line = changes.headline(prev, cur)
    assert line.startswith("registers 168 → 240 · spills 0 → 0 B · shared memory 0 B → 96 KiB · ")
    assert line.endswith("HMMA −512, HGMMA +64, UTMALDG +4")  # tensor first, then memory; IMAD left out
    assert changes.opcode_deltas(prev, cur)[-1] == ("IMAD", -7)
    same = changes.headline(prev, prev)
    assert "registers 168 → 168" in same and "same tensor" in same


def test_signed_uses_a_real_minus():
    assert (changes.signed(-512), changes.signed(64), changes.signed(0)) == ("−512", "+64", "0")


# --- kernel source -------------------------------------------------------------------------------


def test_dynamic_smem_from_describe_kernel():
    src = """
    constexpr int BLOCK_N = 128;
    constexpr int HEAD_DIM = 128;
    constexpr int STAGES = 2;
    constexpr int SMEM_BYTES = STAGES * 2 * BLOCK_N * HEAD_DIM * sizeof(bf16) + 1024;
    int describe(KernelInfo* info) {
        return describe_kernel(attention_kernel<false>, NUM_THREADS, SMEM_BYTES, BLOCK_M, BLOCK_N, info, err, errlen);
    }"""
    assert producer.dynamic_smem(src) == (132096, "SMEM_BYTES")
    assert cpp.evaluate("(1 << 10) / 3", {}) == 341
    assert cpp.evaluate("foo(3)", {}) is None
    # a constexpr broken over lines, with comments (backward stages 05 and 06's SMEM_BYTES)
    assert cpp.evaluate("2 * A +\n    B /* the tiles */ + 4  // + the key block\n", {"A": 3, "B": 8}) == 18
    assert cpp.constants("constexpr int A = 3;\nconstexpr int S = 2 * A +\n    8 + 4;  // + 4\n") == {"A": 3, "S": 18}
    assert producer.dynamic_smem("describe_kernel(k, 128, UNKNOWN, 64, 64, i, e, n)") == (None, "UNKNOWN")


# --- facts files and the page --------------------------------------------------------------------


def _wgmma_facts(stage01) -> dict:
    stage = dataclasses.replace(stage01, kernel="wgmma_tma")
    return producer.make_facts(stage, fixture("wgmma_tma.ptxas.txt"), fixture("wgmma_tma.sass.txt"), TOOLS,
                                     [fixture("wgmma_tma.nvdisasm.txt")])


def test_make_facts_is_deterministic(stage01):
    a = record.dumps(_wgmma_facts(stage01))
    assert a == record.dumps(_wgmma_facts(stage01))
    facts = json.loads(a)
    assert facts["source_hash"] == stage01.source_hash()
    assert facts["signature"].startswith("wgmma_tma")
    assert facts["opcodes"]["HGMMA"] == 20 and facts["loop"]["groups"]["tensor"] == 16
    assert facts["setmaxnreg"] == {"alloc": [232], "dealloc": [40]}
    assert facts["advisories"] == ["(C7519) warpgroup.arrive is injected by compiler to allow use of registers in GMMA. (×3)"]
    assert list(json.loads(a)) == sorted(facts)
    assert all("// wgmma_tma.cu:" in line for line in facts["loop"]["listing"] if "not shown" not in line)


def test_section_states(stage01):
    def facts_of(facts):
        return lambda stage: (facts.get(stage.name), record.problem(stage, facts.get(stage.name)))

    assert "No compiler facts yet" in section.compiler_section(stage01, None, facts_of({}))
    facts = _wgmma_facts(stage01)
    page = section.compiler_section(stage01, None, facts_of({stage01.name: facts}))
    assert "Stale" not in page and "HGMMA" in page and "<details" in page and "UTMALDG" in page
    assert page.count("<pre><code>") == 1
    prev = dataclasses.replace(stage01, number=0, slug="zero")
    known = {stage01.name: facts, prev.name: facts | {"opcodes": {"HMMA": 8}, "registers": 100}}
    diffed = section.compiler_section(stage01, prev, facts_of(known))
    assert "**Against stage 00:** registers 100 → 232" in diffed and "HMMA −8" in diffed
    known[stage01.name] = facts | {"source_hash": "0" * 16}
    assert "Stale compiler facts" in section.compiler_section(stage01, None, facts_of(known))
    table = overview.overview_table([prev, stage01], facts_of(known))
    assert table.count("\n| [") == 2 and "†" in table


def test_overview_without_facts(stage01):
    table = overview.overview_table([stage01], lambda stage: (None, "missing"))
    assert "(stages/01-baseline.md#compiler) | — |" in table and "no compiler facts yet" in table


def test_facts_record_round_trip_and_errors_name_the_field(tmp_path, stage01):
    facts = _wgmma_facts(stage01)
    assert record.validate(facts) is facts
    for mutate, field in [
        (lambda f: f.update(registers=-1), "registers"),
        (lambda f: f["loop"].update(start="start"), "loop.start"),
        (lambda f: f["opcodes"].update(HMMA="many"), "opcodes"),
        (lambda f: f.update(groups={"tensor": 1, "magic": 2}), "groups"),
        (lambda f: f.pop("source_hash"), "source_hash"),
    ]:
        bad = json.loads(record.dumps(facts))
        mutate(bad)
        with pytest.raises(record.FactsError, match=rf"x.json: field '{re.escape(field)}'"):
            record.validate(bad, "x.json")


# --- the committed facts of the lineage ----------------------------------------------------------


def _committed() -> list[tuple[lineage.Stage, dict]]:
    out = []
    for folder in sorted(p for p in lineage.ATTENTION_DIR.iterdir() if p.is_dir() and p.name != "common"):
        try:
            stage = lineage.load_stage(folder)
        except lineage.SpecError:  # a stage still being written is the lineage tests' business
            continue
        facts = record.load(stage)
        if facts is not None and record.problem(stage, facts) is None:
            out.append((stage, facts))
    return out


def test_committed_facts_files_are_canonical_and_valid():
    folder = record.folder_for(lineage.ATTENTION_DIR)
    names = {p.stem for p in folder.glob("*.json")}
    stages = {p.name.replace("_", "-", 1) for p in lineage.ATTENTION_DIR.iterdir() if p.is_dir() and p.name != "common"}
    assert names <= stages, f"facts without a stage: {sorted(names - stages)}"
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        assert path.read_text() == record.dumps(data), path
        record.validate(data, path)


def test_wgmma_stages_use_hgmma():
    for stage, facts in _committed():
        if stage.number >= 8:
            assert facts["opcodes"].get("HGMMA", 0) > 0, f"stage {stage.name} has no HGMMA in its SASS"


def test_setmaxnreg_matches_the_roles():
    for stage, facts in _committed():
        planned = sorted({r.registers for r in stage.roles if r.registers})
        compiled = sorted({r for regs in facts.get("setmaxnreg", {}).values() for r in regs})
        assert compiled == planned, (
            f"stage {stage.name}: stage.toml role budgets {planned}, setmaxnreg in the SASS {compiled}")


def test_shared_memory_matches_the_spec():
    for stage, facts in _committed():
        reserved = changes.smem_bytes(facts)
        assert stage.smem_bytes <= reserved <= stage.smem_bytes + 2048, (
            f"stage {stage.name}: stage.toml buffers {stage.smem_bytes} B, the kernel reserves {reserved} B "
            "(static + dynamic)")


def test_no_stage_spills_without_saying_why():
    for stage, facts in _committed():
        spilled = facts["spill_stores"] + facts["spill_loads"]
        if spilled:
            assert "spill" in stage.notes_path.read_text().lower(), (
                f"stage {stage.name} spills {spilled} bytes and its notes.md does not explain it")


# --- the backward lineage (Act V) ----------------------------------------------------------------


def _backward_committed() -> list[tuple[lineage.Stage, dict]]:
    out = []
    for folder in sorted(p for p in lineage.BACKWARD_DIR.iterdir() if p.is_dir() and p.name != "common"):
        try:
            stage = lineage.load_stage(folder)
        except lineage.SpecError:  # a stage still being written
            continue
        facts = record.load(stage)
        if facts is not None and record.problem(stage, facts) is None:
            out.append((stage, facts))
    return out


def test_backward_facts_have_a_folder_of_their_own():
    stage = lineage.load_stage(lineage.BACKWARD_DIR / "01_baseline")
    assert record.path_for(stage) == lineage.ATTENTION_DIR.parent / "compiler_facts" / "attention_backward" / \
        "01-baseline.json"
    assert producer.status_key(stage) == "backward 01-baseline"
    assert producer.status_key(lineage.load_stage(lineage.ATTENTION_DIR / "01_baseline")) == "01-baseline"


def test_committed_backward_facts_are_current_canonical_and_match_the_spec():
    committed = _backward_committed()
    assert [s.name for s, _ in committed][:1] == ["01-baseline"], "run `python -m hopattn.compiler --lineage backward`"
    folder = record.folder_for(lineage.BACKWARD_DIR)
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        assert path.read_text() == record.dumps(data), path
        record.validate(data, path)
    for stage, facts in committed:
        assert facts["signature"].startswith(stage.kernel + "(")
        reserved = changes.smem_bytes(facts)
        assert stage.smem_bytes <= reserved <= stage.smem_bytes + 2048, stage.name
        assert facts["opcodes"].get("HMMA", 0) + facts["opcodes"].get("HGMMA", 0) > 0


def test_the_command_line_chooses_stages_lineage_by_lineage(tmp_path, monkeypatch):
    import shutil

    from hopattn.compiler import __main__ as cli
    from hopattn.compiler.__main__ import choose

    backward = tmp_path / "attention_backward"  # the backward's first stage (later ones may be in the writing)
    for name in ("common", "01_baseline"):
        shutil.copytree(lineage.BACKWARD_DIR / name, backward / name)
    monkeypatch.setitem(cli.LINEAGES, "backward", backward)
    both = choose(["1"])
    assert [(s.lineage, s.number) for s in both][:1] == [("attention", 1)]
    assert ("attention_backward", 1) in [(s.lineage, s.number) for s in both]
    assert {s.lineage for s in choose(["1"], "backward")} == {"attention_backward"}
    assert [s.number for s in choose(["3-4"], "forward")] == [3, 4]
    assert all(not s.backward for s in choose(["22"]))  # the backward has no stage 22: the forward's alone
    with pytest.raises(ValueError, match="no stage 99"):
        choose(["99"])
