"""Part II's compiler facts (kernels/compiler_facts/<lineage>/ for rmsnorm, rmsnorm_backward, softmax,
softmax_backward and cross_entropy): committed for every stage, current against its sources, canonical, every template
instance recorded with the main one first (the bf16 instance of the spec's kernel that holds the
longest rows), no spills; and the producer's ordering and its command line, without a compiler."""

import json

import pytest
from hopattn import cross_entropy_lineage, lineage, rowwise, rowwise_backward, softmax_lineage
from hopattn.compiler import facts as producer
from hopattn.compiler import sass
from hopattn.records import compiler_facts as record

STAGES = rowwise.discover()
COMMAND = "python -m hopattn.compiler --lineage rmsnorm"
# every Part II lineage, each discovered by the module that owns its spec
PART_II = {"rmsnorm": STAGES, "rmsnorm_backward": rowwise_backward.discover(),
           "softmax": softmax_lineage.discover(), "softmax_backward": softmax_lineage.discover_backward(),
           "cross_entropy": cross_entropy_lineage.discover()}
ALL_STAGES = [s for stages in PART_II.values() for s in stages]
ALL_IDS = [f"{s.lineage}-{s.name}" for s in ALL_STAGES]


def test_facts_live_in_a_folder_of_their_own():
    stage = STAGES[0]
    assert record.path_for(stage) == lineage.ATTENTION_DIR.parent / "compiler_facts" / "rmsnorm" / \
        f"{stage.name}.json"
    assert producer.status_key(stage) == f"rmsnorm {stage.name}"


@pytest.mark.parametrize("name", list(PART_II))
def test_every_part_ii_lineage_has_its_own_folder(name):
    stages = PART_II[name]
    assert stages and all(s.lineage == name for s in stages)
    assert all(record.path_for(s).parent == lineage.ATTENTION_DIR.parent / "compiler_facts" / name for s in stages)
    assert {p.stem for p in record.path_for(stages[0]).parent.glob("*.json")} == {s.name for s in stages}


@pytest.mark.parametrize("stage", ALL_STAGES, ids=ALL_IDS)
def test_committed_facts_are_current_and_canonical(stage):
    path = record.path_for(stage)
    command = f"python -m hopattn.compiler --lineage {stage.lineage}"
    assert path.is_file(), f"no compiler facts for {stage.lineage} {stage.name}: run `{command}`"
    text = path.read_text()
    data = json.loads(text)
    assert text == record.dumps(data), path
    record.validate(data, path)
    assert record.problem(stage, data) is None, \
        f"{stage.lineage} {stage.name}: {record.problem(stage, data)}; run `{command}`"


@pytest.mark.parametrize("stage", ALL_STAGES, ids=ALL_IDS)
def test_every_instance_is_recorded_main_first_without_spills(stage):
    facts = record.load(stage)
    functions = [facts, *facts["other_functions"]]
    # the main one: the spec's kernel, bf16, the largest configuration
    assert facts["signature"].startswith(f"void {stage.kernel}<__nv_bfloat16"), facts["signature"]
    keys = [producer._instance_key(stage, f["function"]) for f in functions]
    assert keys == sorted(keys)
    # every dtype of the spec has its instances, and no function is recorded twice
    assert {producer.instance_dtype(f["function"]) for f in functions} == set(stage.spec.supports.dtypes)
    assert len({f["function"] for f in functions}) == len(functions)
    assert all(f["spill_stores"] == f["spill_loads"] == 0 for f in functions), stage.name
    if stage.lineage == "rmsnorm_backward" and stage.number >= 5:
        # 05 on stages the next row in shared memory, a size per configuration: no one value to record
        assert facts["dynamic_smem"] is None and facts["dynamic_smem_expr"] == ""
    else:
        assert facts["dynamic_smem"] == 0 and facts["dynamic_smem_expr"] == "0"  # every configuration: none
    # 1024-thread CTAs hold at most 64 registers a thread (64K registers an SM)
    assert all(f["registers"] <= 64 for f in functions if "Li1024E" in f["function"])


def test_instances_are_ordered_by_kernel_dtype_and_size():
    stage = STAGES[3]  # 04: rmsnorm_rows beside stage 03's two kernels
    names = ["_Z20rmsnorm_warp_per_rowIfLi4EEv13RmsNormParams", "_Z12rmsnorm_rowsIfLi1024ELi8ELi1EEv13RmsNormParams",
             "_Z12rmsnorm_rowsI13__nv_bfloat16Li32ELi1ELi8EEv13RmsNormParams",
             "_Z12rmsnorm_rowsI13__nv_bfloat16Li1024ELi8ELi1EEv13RmsNormParams",
             "_Z12rmsnorm_rowsI6__halfLi1024ELi8ELi1EEv13RmsNormParams",
             "_Z19rmsnorm_cta_per_rowI13__nv_bfloat16Li8EEv13RmsNormParams"]
    primary = producer._pick_primary(stage, names, {})
    assert primary == "_Z12rmsnorm_rowsI13__nv_bfloat16Li1024ELi8ELi1EEv13RmsNormParams"
    assert producer._others(stage, names, primary) == [
        "_Z12rmsnorm_rowsI13__nv_bfloat16Li32ELi1ELi8EEv13RmsNormParams",
        "_Z12rmsnorm_rowsI6__halfLi1024ELi8ELi1EEv13RmsNormParams",
        "_Z12rmsnorm_rowsIfLi1024ELi8ELi1EEv13RmsNormParams",
        "_Z19rmsnorm_cta_per_rowI13__nv_bfloat16Li8EEv13RmsNormParams",
        "_Z20rmsnorm_warp_per_rowIfLi4EEv13RmsNormParams"]
    assert [producer.instance_dtype(n) for n in names] == ["fp32", "fp32", "bf16", "bf16", "fp16", "bf16"]
    assert producer.instance_dtype("_Z16attention_kernel10AttnParams") is None


def test_the_memory_loop_is_the_innermost_loop_that_loads():
    def ins(addr, text):
        return sass.parse_instruction(text, addr)

    body = [ins(0x00, "MOV R1, c[0x0][0x28]"), ins(0x10, "LDG.E.128 R4, desc[UR4][R2.64]"),
            ins(0x20, "FFMA R0, R4, R4, R0"), ins(0x30, "@P0 BRA 0x10"),  # the sum's walk
            ins(0x40, "IADD3 R2, R2, 0x1, RZ"), ins(0x50, "@P1 BRA 0x40"),  # a loop without loads
            ins(0x60, "STG.E.128 desc[UR4][R8.64], R4"), ins(0x70, "EXIT")]
    loop = sass.memory_loop(body)
    assert (loop.start, loop.end) == (0x10, 0x30)
    assert sass.memory_loop(body[:1] + body[6:]) is None


def test_the_command_line_knows_the_lineage():
    from hopattn.compiler.__main__ import choose

    chosen = choose([], "rmsnorm")
    assert [s.name for s in chosen] == [s.name for s in STAGES]
    assert all(isinstance(s, rowwise.RowStage) for s in chosen)
    assert [s.number for s in choose(["4-5"], "rmsnorm")] == [4, 5]
    for name, stages in PART_II.items():
        chosen = choose([], name)
        assert [(s.lineage, s.name) for s in chosen] == [(s.lineage, s.name) for s in stages]
        assert all(isinstance(s, rowwise.RowStage) and type(s.spec) is type(stages[0].spec) for s in chosen)
        assert producer.status_key(chosen[0]) == f"{name} {chosen[0].name}"
    assert [s.lineage for s in choose(["2"], "all") if isinstance(s, rowwise.RowStage)] == list(PART_II)
