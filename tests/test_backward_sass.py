"""Backward stages 04, 05 and 06 as the lineage has them (kernels/attention_backward/, with the
headers they introduced, common/bulk_reduce.cuh and common/bulk_copy.cuh): read as stages (their
stage.toml checked as the lineage's are) and compiled with the project's flags (nvcc, no GPU), what
their notes say the compiler made of them must stay true — no spills, no wgmma waits injected by
ptxas, one bulk reduce-add and no vector reductions in the main kernel, shared memory as the spec's
buffers add up; stage 05 without the second pass's kernel and with the deterministic mode's spin and
count (the turn counters count down from the last key block: a REDG adding -1); stage 06's producer
and consumers with their register budgets (setmaxnreg 24 and 240). Stage 07 (stage 06 with the next
step's Sᵀ issued behind dQ): stage 06's spec but for the consumers' order, no ptxas remark on the
wgmma pipeline, the counts of HGMMA and of the waits on them, the next step's Sᵀ between dQ and the
stores of the dQ share; the same SASS with and without its trace points, and the traced build's spills.
Stage 08 (stage 07 with its softmax's exponentials as straight-line code): stage 07's source but for
`softmax_gradient`'s exponent loop, stage 07's gemms, waits and registers, without the branch regions
(BSSY) 07's mask was compiled to, two exponent loops (unmasked and masked), no spills or remarks;
the same SASS with and without its trace points, and the traced build's spills."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hopattn import build, cuda_tools, lineage
from hopattn.records import compiler_facts

pytestmark = pytest.mark.nvcc

STAGES = ("04_dq-bulk-reduce", "05_ordered-dq", "06_warp-specialized")
# Per stage: the bulk reduce-adds in the main kernel's SASS, and its registers as ptxas reports them (the
# notes': 04 246, 05 255, 06 168 at launch, 65536 / 384 rounded down, before setmaxnreg).
REDUCE_ADDS = {"04_dq-bulk-reduce": 1, "05_ordered-dq": 1, "06_warp-specialized": 1}
REGISTERS = {"04_dq-bulk-reduce": 246, "05_ordered-dq": 255, "06_warp-specialized": 168, "07_scores-ahead": 168,
             "08_mask-select": 168}


def _stage(name: str) -> lineage.Stage:
    found = [s for s in lineage.discover(lineage.BACKWARD_DIR) if s.dir.name == name]
    assert found, f"backward stage {name} is not in {lineage.BACKWARD_DIR}"
    return found[0]


def _tool_or_skip(name: str) -> str:
    try:
        return cuda_tools.require(name)
    except cuda_tools.ToolError as err:
        pytest.skip(str(err))


def test_stages_04_to_06_read_as_the_lineage_s_next_stages():
    stages = lineage.discover(lineage.BACKWARD_DIR)
    assert [s.dir.name for s in stages[3:6]] == list(STAGES)
    three = stages[2]
    four, five, six = (_stage(name) for name in STAGES)
    assert [s.number for s in (three, four, five, six)] == [3, 4, 5, 6]
    for stage in (four, five, six):
        assert (stage.block_m, stage.block_n) == (64, 128) and stage.deterministic
    for stage in (four, five):
        assert stage.threads == 256
    assert four.smem_bytes == three.smem_bytes + 2 * 64 * 64 * 4  # stage 03's buffers + two dQ tiles
    assert five.smem_bytes == four.smem_bytes + 4  # + the CTA's key block (a ticket when deterministic)
    assert "dq_kernel" in four.kernel_path.read_text() and "dq_kernel" not in five.kernel_path.read_text()
    # 06: a producer warpgroup of 24 registers and two consumers of 240, two more dQ tiles, the statistics
    assert six.threads == 384 and [(r.name, r.registers) for r in six.roles] == [("producer", 24), ("consumer", 240)]
    assert six.smem_bytes == five.smem_bytes + 2 * 64 * 64 * 4 + 2 * 2 * 64 * 4 + 10 * 8  # + tiles, statistics, barriers


def test_the_committed_compiler_facts_have_the_spec_s_shared_memory():
    """Each backward stage's compiler facts (kernels/compiler_facts/attention_backward/) hold the
    dynamic shared memory its describe_kernel launches with (a constexpr over lines, as 05's and
    06's SMEM_BYTES, included) and it is the spec's buffers' sum; no spills."""
    for stage in lineage.discover(lineage.BACKWARD_DIR):
        facts = json.loads(compiler_facts.path_for(stage).read_text())
        assert facts["dynamic_smem"] is not None, stage.name
        assert facts["dynamic_smem"] + facts["static_smem"] == stage.smem_bytes, stage.name
        if stage.number >= 3:  # 01 and 02 spill a few bytes of addresses (their notes)
            assert (facts["spill_stores"], facts["spill_loads"]) == (0, 0), stage.name
        if stage.dir.name in REGISTERS:
            assert facts["registers"] == REGISTERS[stage.dir.name], stage.name


def test_the_deterministic_order_runs_from_the_last_key_block_down():
    """05 and 06: the preprocess starts each turn counter at the query block's last key block, a
    reduce-add's completion counts it down, and a CTA's key block is the last one less its ticket."""
    for name in STAGES[1:]:
        kernel = _stage(name).kernel_path.read_text()
        assert "const int first_turn = last_key_block(row, p.len_q, p.len_k, p.causal != 0);" in kernel, name
        assert "red_release_gpu_add(turn, -1);" in kernel, name
        assert "red.release.gpu.global.add.s32" in kernel, name
        assert re.search(r"int\(gridDim\.x\) - 1 - atomicAdd\(key_block_tickets\(p\)", kernel), name


def _added_by_the_count(dump: str) -> int:
    """The value the turn count's REDG.E.ADD.S32 adds: the immediate its source register was last
    set to before it (IMAD.MOV.U32 Rn, RZ, RZ, imm or MOV Rn, imm)."""
    lines = [line for line in dump.splitlines() if "/*" in line]
    at = next(i for i, line in enumerate(lines) if "REDG.E.ADD.S32.STRONG.GPU" in line)
    register = re.search(r"REDG\.E\.ADD\.S32\.STRONG\.GPU\s+\S+,\s*(R\d+)\s*;", lines[at]).group(1)
    for line in reversed(lines[:at]):
        code = line.split("*/", 1)[1].split(";")[0].strip() if "*/" in line else ""
        if m := re.match(rf"(?:@!?P\d\s+)?(?:IMAD\.MOV\.U32|MOV)\s+{register},\s*(?:RZ,\s*RZ,\s*)?(-?0x[0-9a-f]+)$", code):
            value = int(m.group(1), 16)
            return value - (1 << 32) if value >= 1 << 31 else value
        if re.match(rf"\S+\s+{register}\b", code):
            raise AssertionError(f"{register} is set by {code!r} before the count")
    raise AssertionError(f"no write of {register} before the count")


@pytest.mark.parametrize("name", STAGES)
def test_the_stage_compiles_as_its_notes_say(tmp_path, name):
    nvcc, cuobjdump = _tool_or_skip("nvcc"), _tool_or_skip("cuobjdump")
    stage = _stage(name)
    flags = [f for f in build.nvcc_flags(stage) if f not in ("-shared", "-Xcompiler=-fPIC,-fvisibility=hidden")]
    fatbin = tmp_path / f"{name}.fatbin"
    run = subprocess.run([nvcc, *flags, "-fatbin", "-o", str(fatbin), str(stage.kernel_path)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    ptxas = run.stdout + run.stderr
    assert "C7517" not in ptxas and "C7519" not in ptxas, "ptxas injected waits on the wgmmas in flight"
    main = ptxas[ptxas.index("Compiling entry function '_Z11dkdv_kernel"):]
    main = main[:main.index("Compiling entry function", 10)] if "Compiling entry function" in main[10:] else main
    assert "0 bytes spill stores, 0 bytes spill loads" in main, main
    assert int(re.search(r"Used (\d+) registers", main).group(1)) == REGISTERS[name]
    dump = subprocess.run([cuobjdump, "-sass", "-fun", "dkdv_kernel", str(fatbin)], capture_output=True,
                          text=True).stdout
    if "Function" not in dump:  # older cuobjdump: no -fun filter by the plain name
        dump = subprocess.run([cuobjdump, "-sass", str(fatbin)], check=True, capture_output=True, text=True).stdout
        dump = dump[dump.index("Function : _Z11dkdv_kernel"):]
        dump = dump[:dump.index("Function :", 10)] if "Function :" in dump[10:] else dump
    assert dump.count("UBLKRED.G.S.ADD.F32") == REDUCE_ADDS[name]
    assert "REDG.E.ADD.F32" not in dump and "SHFL" not in dump
    # the deterministic mode's turn: stage 05's spin and count (the count adds -1 now), none in stage 04
    turn = "NANOSLEEP" in dump and "REDG.E.ADD.S32.STRONG.GPU" in dump
    assert turn == (name != "04_dq-bulk-reduce")
    if turn:  # one count, of -1 (the register it adds was last set to -1), and one ticket
        assert dump.count("REDG.E.ADD.S32") == 1 and dump.count("ATOMG.E.ADD") == 1
        assert _added_by_the_count(dump) == -1
    else:
        assert "REDG" not in dump and "ATOMG" not in dump
    assert ("LDG.E.STRONG.GPU" in dump) == turn  # the spin's read of the counter
    if name == "06_warp-specialized":
        assert re.search(r"USETMAXREG\.DEALLOC\.CTAPOOL\s+0x18\b", dump)  # 24 registers
        assert re.search(r"USETMAXREG\.TRY_ALLOC\.CTAPOOL\s+\w+,\s*0xf0\b", dump)  # 240 registers
        # the load warp's 8 TMA loads and 2 bulk copies (lse₂, D), the statistics read from shared memory,
        # the consumers' two named barriers of 256 threads
        assert (dump.count("UTMALDG.4D"), dump.count("UBLKCP.S.G"), dump.count("LDS.64")) == (8, 2, 16)
        assert re.search(r"BAR\.SYNC\S*\s+0x1, 0x100\b", dump) and re.search(r"BAR\.SYNC\S*\s+0x2, 0x100\b", dump)
    else:  # dQ's share into its tile (8 STS.128 a thread) between two barriers of its warpgroup's 128 threads
        assert dump.count("STS.128") == 8 and len(re.findall(r"BAR\.SYNC\S*\s+R\d+, 0x80\b", dump)) == 2
    assert dump.count("HGMMA.64x64x16") == 24 and dump.count("HGMMA.64x128x16") == 8


# --- stage 07: the next step's scores ahead ---------------------------------------------------------

SEVEN = "07_scores-ahead"
REMARKS = ("C7512", "C7514", "C7517", "C7518", "C7519")  # ptxas serialising or waiting on the wgmmas


def _compile(stage: lineage.Stage, kernel: Path, out: Path, traced: bool = False) -> tuple[str, str]:
    """(the main kernel's ptxas report and the remarks about it, its SASS one instruction a line) of
    one compile of ``kernel`` with the stage's flags."""
    nvcc, cuobjdump = _tool_or_skip("nvcc"), _tool_or_skip("cuobjdump")
    flags = [f for f in build.nvcc_flags(stage, traced) if f not in ("-shared", "-Xcompiler=-fPIC,-fvisibility=hidden")]
    run = subprocess.run([nvcc, *flags, "-fatbin", "-o", str(out), str(kernel)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    ptxas = run.stdout + run.stderr
    main = ptxas[ptxas.index("Compiling entry function '_Z11dkdv_kernel"):]
    main = main[:main.index("Compiling entry function", 10)] if "Compiling entry function" in main[10:] else main
    dump = subprocess.run([cuobjdump, "-sass", str(out)], check=True, capture_output=True, text=True).stdout
    dump = dump[dump.index("Function : _Z11dkdv_kernel"):]
    dump = dump[:dump.index("Function :", 10)] if "Function :" in dump[10:] else dump
    sass = [re.sub(r"^\s+/\*[0-9a-f]{4,}\*/\s*", "", line).split(";")[0].strip() for line in dump.splitlines()
            if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]
    remarks = "\n".join(line for line in ptxas.splitlines() if "dkdv_kernel" in line and "Potential" in line)
    return main + remarks, "\n".join(sass)


def test_stage_07_is_stage_06_but_for_the_consumers_order():
    stages = lineage.discover(lineage.BACKWARD_DIR)
    six, seven = _stage("06_warp-specialized"), _stage(SEVEN)
    assert stages.index(seven) == stages.index(six) + 1 and seven.number == six.number + 1 == 7
    assert (seven.block_m, seven.block_n, seven.head_dim) == (64, 128, 128) and seven.deterministic
    assert seven.threads == six.threads == 384
    assert [(r.name, r.warps, r.registers) for r in seven.roles] == [(r.name, r.warps, r.registers) for r in six.roles]
    assert seven.roles[0] == six.roles[0]  # the producer, tasks and all: its loads, dQ warps and turns are 06's
    assert seven.smem == six.smem and seven.smem_bytes == six.smem_bytes
    assert seven.diagram == six.diagram and seven.diagram.dq_deterministic == "ordered"
    assert [o.op for o in seven.schedule] == [o.op for o in six.schedule]
    assert next(o for o in seven.schedule if o.op == "qk").after == ("load_q", "prev.dq")


def test_stage_07_compiles_as_its_notes_say(tmp_path):
    stage = _stage(SEVEN)
    ptxas, sass = _compile(stage, stage.kernel_path, tmp_path / "seven.fatbin")
    for remark in REMARKS:
        assert remark not in ptxas, f"ptxas serialised or waited on the wgmmas: {ptxas}"
    assert "0 bytes spill stores, 0 bytes spill loads" in ptxas, ptxas
    assert int(re.search(r"Used (\d+) registers", ptxas).group(1)) == 168  # 65536 / 384 at launch
    assert re.search(r"USETMAXREG\.DEALLOC\.CTAPOOL\s+0x18\b", sass)  # the producer: 24 registers
    assert re.search(r"USETMAXREG\.TRY_ALLOC\.CTAPOOL\s+\w+,\s*0xf0\b", sass)  # the consumers: 240
    # three copies of parts of a step: the prologue (Sᵀ, dPᵀ), the loop (all five), the last step (dV, dK, dQ)
    assert sass.count("HGMMA.64x64x16") == 48 and sass.count("HGMMA.64x128x16") == 16
    assert sass.count("WARPGROUP.ARRIVE") == 8
    assert sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") == 5 and sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x0") == 3
    assert sass.count("MUFU.EX2") == 64 and sass.count("STS.128") == 16
    assert sass.count("BAR.SYNC.DEFER_BLOCKING 0x1, 0x100") == 2 and sass.count("BAR.SYNC.DEFER_BLOCKING 0x2, 0x100") == 2
    assert sass.count("UBLKRED.G.S.ADD.F32") == 1 and "REDG.E.ADD.F32" not in sass
    assert "NANOSLEEP" in sass and "REDG.E.ADD.S32.STRONG.GPU" in sass  # the deterministic turns (stage 05's)
    assert len(sass.splitlines()) == 3000

    _assert_the_loop_s_order(sass)


def _assert_the_loop_s_order(sass: str) -> None:
    """Stage 07's order in the loop's SASS (08 keeps it)."""
    # The idea, in the loop's SASS: between a dQ product (dSᵀ read transposed) and the stores of its
    # share, the next step's Sᵀ (K-major operands) and a wait that leaves one group in flight; after
    # the stores, dPᵀ. The last step's copy stores after a wait for everything.
    lines = sass.splitlines()
    runs = [i for i, line in enumerate(lines) if line.startswith("STS.128") and not lines[i - 1].startswith("STS.128")
            and not lines[i - 2].startswith("STS.128")]
    runs = [i for i in runs if sum(1 for line in lines[i:i + 20] if line.startswith("STS.128")) == 8]
    assert len(runs) == 2, runs

    def gemms_before(i):
        return [line for line in lines[:i] if "HGMMA" in line or "WARPGROUP.DEPBAR" in line]

    loop, last = gemms_before(runs[0]), gemms_before(runs[1])
    # dQ's last k-step, the wait<1> for dV and dK, the next step's Sᵀ (8 k-steps), the wait<1> for dQ
    assert "HGMMA.64x64x16" in loop[-11] and "tnspA" in loop[-11] and loop[-10].endswith("gsb0, 0x1"), loop[-12:]
    assert all("HGMMA.64x64x16" in line and "tnspA" not in line for line in loop[-9:-1]), loop[-9:]
    assert loop[-1].endswith("gsb0, 0x1"), loop[-3:]
    after = [line for line in lines[runs[0]:] if "HGMMA" in line][:8]
    assert all("HGMMA.64x64x16" in line and "tnspA" not in line for line in after)  # dPᵀ of the next step
    assert "tnspA" in last[-3] and last[-1].endswith("gsb0, 0x0") and last[-2].endswith("gsb0, 0x1"), last[-3:]


def test_stage_07_s_trace_points_leave_the_sass_alone_and_its_traced_build_records(tmp_path):
    from test_trace_points import without_trace_points

    stage = _stage(SEVEN)
    source = stage.kernel_path.read_text()
    assert '#include "../common/trace_backward.cuh"' in source and "TRACE_END(qk, 0, step);" in source
    # the stripped copy beside the stage, so that its includes (../common/) resolve
    stripped = tmp_path / "kernels" / "attention_backward" / f"{SEVEN}-without" / "kernel.cu"
    shutil.copytree(lineage.ATTENTION_DIR / "common", tmp_path / "kernels" / "attention" / "common")
    shutil.copytree(lineage.BACKWARD_DIR / "common", tmp_path / "kernels" / "attention_backward" / "common")
    stripped.parent.mkdir()
    stripped.write_text(without_trace_points(source))
    with_points = _compile(stage, stage.kernel_path, tmp_path / "with.fatbin")[1]
    assert with_points == _compile(stage, stripped, tmp_path / "without.fatbin")[1]
    ptxas, sass = _compile(stage, stage.kernel_path, tmp_path / "traced.fatbin", traced=True)
    for remark in REMARKS:
        assert remark not in ptxas, f"the traced build serialised or waited on the wgmmas: {ptxas}"
    assert int(re.search(r"(\d+) bytes spill stores", ptxas).group(1)) == 36  # stage 06's traced build: 8
    assert "CS2R" in sass and "STG.E.128" in sass  # the clock reads and the 16-byte rows
    assert sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") == 5 and sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x0") == 3


# --- stage 08: a softmax without branches -----------------------------------------------------------

EIGHT = "08_mask-select"
FUNCTION = "__device__ __forceinline__ void softmax_gradient("


def _split_softmax(source: str) -> tuple[str, str, str]:
    """(the source before softmax_gradient's comment, the function (comment included), the source after it)."""
    start = source.index(FUNCTION)
    comment = source.rindex("\n\n", 0, start) + 2  # the comment block right above the function
    end = source.index("\n}\n", start) + 3
    return source[:comment], source[comment:end], source[end:]


def test_stage_08_is_stage_07_but_for_the_softmax_s_exponent_loop():
    stages = lineage.discover(lineage.BACKWARD_DIR)
    seven, eight = _stage(SEVEN), _stage(EIGHT)
    assert [s.dir.name for s in stages].index(EIGHT) == [s.dir.name for s in stages].index(SEVEN) + 1 and eight.number == 8
    # the spec: 07's but for the change's words in the consumers' tasks and the title
    assert (eight.threads, eight.smem, eight.smem_bytes, eight.diagram) == (seven.threads, seven.smem, seven.smem_bytes,
                                                                            seven.diagram)
    assert eight.schedule == seven.schedule and eight.roles[0] == seven.roles[0]
    assert [(r.name, r.warps, r.registers) for r in eight.roles] == [(r.name, r.warps, r.registers) for r in seven.roles]
    # the source: 07's outside softmax_gradient; inside it, 07's but for the loop between the softmax's trace points
    # (the header comment above the first #include is each stage's own)
    source7, source8 = (s.kernel_path.read_text() for s in (seven, eight))
    assert source8.startswith("// Backward stage 08") and source7.startswith("// Backward stage 07")
    before7, function7, after7 = _split_softmax(source7[source7.index("#include"):])
    before8, function8, after8 = _split_softmax(source8[source8.index("#include"):])
    assert (before8, after8) == (before7, after7)
    head, tail = "TRACE_BEGIN(softmax);", "TRACE_END(softmax, 0, step);"
    assert function8[function8.index(FUNCTION):function8.index(head)] == function7[function7.index(FUNCTION):function7.index(head)]
    assert function8[function8.index(tail):] == function7[function7.index(tail):]
    loop7 = function7[function7.index(head):function7.index(tail)]
    loop8 = function8[function8.index(head):function8.index(tail)]
    assert "!masked ||" in loop7 and "visible ?" in loop7  # 07: the short-circuit mask per element
    assert "if (!masked) {" in loop8 and "first_col[i % 4 / 2] ? x : -INFINITY" in loop8 and "||" not in loop8


def test_stage_08_compiles_as_its_notes_say(tmp_path):
    stage = _stage(EIGHT)
    ptxas, sass = _compile(stage, stage.kernel_path, tmp_path / "eight.fatbin")
    for remark in REMARKS:
        assert remark not in ptxas, f"ptxas serialised or waited on the wgmmas: {ptxas}"
    assert "0 bytes spill stores, 0 bytes spill loads" in ptxas, ptxas
    assert int(re.search(r"Used (\d+) registers", ptxas).group(1)) == 168  # 65536 / 384 at launch
    assert re.search(r"USETMAXREG\.DEALLOC\.CTAPOOL\s+0x18\b", sass)  # the producer: 24 registers
    assert re.search(r"USETMAXREG\.TRY_ALLOC\.CTAPOOL\s+\w+,\s*0xf0\b", sass)  # the consumers: 240
    # stage 07's gemms and waits on them: the prologue, the loop, the last step
    assert sass.count("HGMMA.64x64x16") == 48 and sass.count("HGMMA.64x128x16") == 16
    assert sass.count("WARPGROUP.ARRIVE") == 8
    assert sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") == 5 and sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x0") == 3
    assert sass.count("STS.128") == 16 and sass.count("BAR.SYNC") == 5
    assert sass.count("BAR.SYNC.DEFER_BLOCKING 0x1, 0x100") == 2 and sass.count("BAR.SYNC.DEFER_BLOCKING 0x2, 0x100") == 2
    assert sass.count("UBLKRED.G.S.ADD.F32") == 1 and "REDG.E.ADD.F32" not in sass
    assert "NANOSLEEP" in sass and "REDG.E.ADD.S32.STRONG.GPU" in sass  # the deterministic turns (stage 05's)
    # the change: two exponent loops (unmasked, masked) in the prologue's and the loop's softmax, 4 x 32
    # (07: 2 x 32), one FFMA an exponential; the masked loops' −∞ by a select, not a branch
    assert sass.count("MUFU.EX2") == 128 and sass.count("FFMA ") == 128
    assert sass.count("FSEL") == 64 and sass.count("-INF") == 64
    # the branch regions of 07's mask gone: 73 BSSY there, 9 here (the waits' and the turns')
    lines = sass.splitlines()
    assert sum(1 for line in lines if line.startswith("BSSY")) == 9
    assert sum(1 for line in lines if re.match(r"(@!?U?P\w+\s+)?BRA\b", line)) == 60  # 07: 376
    assert len(lines) == 2408  # stage 07: 3000
    _assert_the_loop_s_order(sass)  # dQ, the wait for dV and dK, the next Sᵀ, the wait for dQ, the share, dPᵀ

    # the unmasked loop: from the step's first lse₂ load to its last exponential, only loads, FFMA, MUFU
    first = lines.index(next(line for line in lines if line.startswith("MUFU.EX2")))
    start = max(i for i in range(first) if lines[i].startswith("LDS.64"))
    start = min(i for i in range(start - 12, start + 1) if lines[i].startswith(("LDS.64", "FFMA")))
    body = lines[start:first + 64]
    exps = [i for i, line in enumerate(body) if line.startswith("MUFU.EX2")]
    unmasked = body[:exps[31] + 1]
    assert {line.split()[0] for line in unmasked} <= {"LDS.64", "FFMA", "MUFU.EX2"}, unmasked
    assert sum(line.startswith("FFMA") for line in unmasked) == 32


def test_stage_08_s_trace_points_leave_the_sass_alone_and_its_traced_build_records(tmp_path):
    from test_trace_points import without_trace_points

    stage = _stage(EIGHT)
    source = stage.kernel_path.read_text()
    assert '#include "../common/trace_backward.cuh"' in source and "TRACE_END(softmax, 0, step);" in source
    stripped = tmp_path / "kernels" / "attention_backward" / f"{EIGHT}-without" / "kernel.cu"
    shutil.copytree(lineage.ATTENTION_DIR / "common", tmp_path / "kernels" / "attention" / "common")
    shutil.copytree(lineage.BACKWARD_DIR / "common", tmp_path / "kernels" / "attention_backward" / "common")
    stripped.parent.mkdir()
    stripped.write_text(without_trace_points(source))
    with_points = _compile(stage, stage.kernel_path, tmp_path / "with.fatbin")[1]
    assert with_points == _compile(stage, stripped, tmp_path / "without.fatbin")[1]
    ptxas, sass = _compile(stage, stage.kernel_path, tmp_path / "traced.fatbin", traced=True)
    for remark in REMARKS:
        assert remark not in ptxas, f"the traced build serialised or waited on the wgmmas: {ptxas}"
    assert int(re.search(r"(\d+) bytes spill stores", ptxas).group(1)) == 8  # stage 07's traced build: 36
    assert "CS2R" in sass and "STG.E.128" in sass  # the clock reads and the 16-byte rows
    assert sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") == 5 and sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x0") == 3


# --- stage 09: consumers out of phase ---------------------------------------------------------------

NINE = "09_out-of-phase"


def test_stage_09_is_08_with_the_exchange_and_the_turns():
    stages = lineage.discover(lineage.BACKWARD_DIR)
    eight, nine = _stage(EIGHT), _stage(NINE)
    assert stages[8].dir.name == NINE and stages[7].dir.name == EIGHT and nine.number == 9
    assert (nine.threads, nine.diagram) == (eight.threads, eight.diagram) and nine.roles[0] == eight.roles[0]
    assert nine.smem_bytes == eight.smem_bytes + 128 * 64 * 2 + 4 * 8 <= 227 * 1024  # a second dSᵀ tile, 4 mbarriers
    source8, source9 = (s.kernel_path.read_text() for s in (eight, nine))
    assert source9.startswith("// Backward stage 09")
    # 08's softmax, untouched; its dSᵀ barriers gone, the turns and the tiles' mbarriers in
    _, softmax8, _ = _split_softmax(source8[source8.index("#include"):])
    _, softmax9, _ = _split_softmax(source9[source9.index("#include"):])
    assert softmax9 == softmax8
    assert "DS_FULL_BAR" in source8 and "DS_FULL_BAR" not in source9 and "DS_FREE_BAR" not in source9
    assert "TURN_BAR" in source9 and "s.ds_full" in source9 and "s.ds_free" in source9 and "issue_dq(step - 1)" in source9


def test_stage_09_compiles_as_its_notes_say(tmp_path):
    stage = _stage(NINE)
    ptxas, sass = _compile(stage, stage.kernel_path, tmp_path / "nine.fatbin")
    for remark in REMARKS:
        assert remark not in ptxas, f"ptxas serialised or waited on the wgmmas: {ptxas}"
    assert "0 bytes spill stores, 0 bytes spill loads" in ptxas, ptxas
    assert int(re.search(r"Used (\d+) registers", ptxas).group(1)) == 168
    assert re.search(r"USETMAXREG\.DEALLOC\.CTAPOOL\s+0x18\b", sass)
    assert re.search(r"USETMAXREG\.TRY_ALLOC\.CTAPOOL\s+\w+,\s*0xf0\b", sass)
    # 08's products plus the last step's dQ after the loop (8 more m64n64k16)
    assert sass.count("HGMMA.64x64x16") == 56 and sass.count("HGMMA.64x128x16") == 16
    assert sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") == 5 and sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x0") == 4
    # the turns: bar.sync on one's own barrier, bar.arrive on the other's (256 threads); no dSᵀ barrier
    # of 08 (named barriers 1 and 2 with a fixed id)
    assert len(re.findall(r"BAR\.SYNC\.DEFER_BLOCKING R\d+, 0x100", sass)) == 2
    assert len(re.findall(r"BAR\.ARV R\d+, 0x100", sass)) == 2
    assert "BAR.SYNC.DEFER_BLOCKING 0x1, 0x100" not in sass and "BAR.SYNC.DEFER_BLOCKING 0x2, 0x100" not in sass
    assert sass.count("MUFU.EX2") == 128 and sass.count("UBLKRED.G.S.ADD.F32") == 1
    assert len(sass.splitlines()) == 2600  # 08: 2408


# --- stage 10: causal CTAs heaviest first ----------------------------------------------------------

TEN = "10_heavy-first"


def _body(source: str) -> str:
    """The source after its head comment."""
    return source[source.index("#include"):]


def test_stage_10_is_09_with_the_cta_order_alone():
    stages = lineage.discover(lineage.BACKWARD_DIR)
    nine, ten = _stage(NINE), _stage(TEN)
    assert stages[9].dir.name == TEN and ten.number == 10
    assert (ten.threads, ten.diagram, ten.roles, ten.smem, ten.schedule) == \
        (nine.threads, nine.diagram, nine.roles, nine.smem, nine.schedule)
    assert (nine.cta_order, ten.cta_order) == ("blockidx", "heavy-first")
    source9, source10 = (s.kernel_path.read_text() for s in (nine, ten))
    assert source10.startswith("// Backward stage 10")
    # 09's kernel but for cta_tile() and the three places that read the CTA's coordinates from it
    body9, body10 = _body(source9), _body(source10)
    start, end = body10.index("struct CtaTile"), body10.index("__global__ void __launch_bounds__(NUM_THREADS, 1) dkdv_kernel")
    rest10 = body10[:start] + body10[end:]
    for old, new in (("blockIdx.z * p.kv_heads + blockIdx.y", "tile.batch * p.kv_heads + tile.kv_head"),
                     (": int(blockIdx.x));", ": tile.key_block);"),
                     ("steps.kv_head = blockIdx.y;", "steps.kv_head = tile.kv_head;"),
                     ("steps.batch = blockIdx.z;", "steps.batch = tile.batch;")):
        assert old in body9 and new in rest10, (old, new)
        rest10 = rest10.replace(new, old)
    rest10 = rest10.replace("    const CtaTile tile = cta_tile(p);\n", "")
    rest10 = rest10.replace("The CTA's key block: cta_tile's, or", "The CTA's key block: its blockIdx, or")
    assert rest10 == body9
    assert "constexpr int WINDOW_WAVES = 2;" in body10 and "%%nsmid" in body10


def test_stage_10_compiles_as_its_notes_say(tmp_path):
    stage = _stage(TEN)
    ptxas, sass = _compile(stage, stage.kernel_path, tmp_path / "ten.fatbin")
    for remark in REMARKS:
        assert remark not in ptxas, f"ptxas serialised or waited on the wgmmas: {ptxas}"
    assert "0 bytes spill stores, 0 bytes spill loads" in ptxas, ptxas
    assert int(re.search(r"Used (\d+) registers", ptxas).group(1)) == 168
    assert sass.count("HGMMA.64x64x16") == 56 and sass.count("HGMMA.64x128x16") == 16  # 09's products
    assert len(sass.splitlines()) == 2712  # 09: 2600; cta_tile's index arithmetic, once a CTA


# --- stage 11: dQ in whole rows ----------------------------------------------------------------------

ELEVEN = "11_dq-rows"
DQ_ROWS_PATCH = Path(__file__).resolve().parent.parent / "research" / "backward_next" / "drafts_on_10" / "13_dq-rows.patch"


def _convert_sass(fatbin: Path) -> str:
    """The dQ conversion kernel's SASS, one instruction a line."""
    dump = subprocess.run([_tool_or_skip("cuobjdump"), "-sass", str(fatbin)], check=True, capture_output=True,
                          text=True).stdout
    dump = dump[dump.index("Function : _Z17dq_convert_kernel"):]
    dump = dump[:dump.index("Function :", 10)] if "Function :" in dump[10:] else dump
    return "\n".join(re.sub(r"^\s+/\*[0-9a-f]{4,}\*/\s*", "", line).split(";")[0].strip()
                     for line in dump.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line))


def test_stage_11_is_10_with_the_dq_conversion_alone(tmp_path):
    """11's kernel is 10's with draft 13 (research/backward_next/drafts_on_10/13_dq-rows.patch) applied,
    but for the head comment: the conversion kernel and the host's check of dq's alignment, nothing else."""
    stages = lineage.discover(lineage.BACKWARD_DIR)
    ten, eleven = _stage(TEN), _stage(ELEVEN)
    assert stages[10].dir.name == ELEVEN and eleven.number == 11
    assert (eleven.threads, eleven.diagram, eleven.roles, eleven.smem, eleven.schedule, eleven.cta_order) == \
        (ten.threads, ten.diagram, ten.roles, ten.smem, ten.schedule, ten.cta_order)
    assert (ten.movement.dq_convert, eleven.movement.dq_convert) == ("fragments", "staged rows")
    patch = _tool_or_skip("patch") if shutil.which("patch") is None else shutil.which("patch")
    work = tmp_path / "ten"
    work.mkdir()
    shutil.copy(ten.kernel_path, work / "kernel.cu")
    subprocess.run([patch, "-s", "-p1", "-d", str(work), "-i", str(DQ_ROWS_PATCH)], check=True)
    source11 = eleven.kernel_path.read_text()
    assert source11.startswith("// Backward stage 11")
    assert _body(source11) == _body((work / "kernel.cu").read_text())


def test_stage_11_compiles_as_its_notes_say(tmp_path):
    """The dkdv kernel is 10's instruction for instruction; the conversion's global stores are 16 bytes
    (10's: 4), through shared memory and one CTA barrier."""
    ten, eleven = _stage(TEN), _stage(ELEVEN)
    ten_ptxas, ten_sass = _compile(ten, ten.kernel_path, tmp_path / "ten.fatbin")
    ptxas, sass = _compile(eleven, eleven.kernel_path, tmp_path / "eleven.fatbin")
    assert sass == ten_sass
    for remark in REMARKS:
        assert remark not in ptxas, ptxas
    assert "0 bytes spill stores, 0 bytes spill loads" in ptxas, ptxas
    before, after = _convert_sass(tmp_path / "ten.fatbin"), _convert_sass(tmp_path / "eleven.fatbin")
    count = lambda sass, op: len(re.findall(rf"\b{re.escape(op)}(?=\s)", sass))  # noqa: E731
    assert (count(before, "STG.E"), count(before, "STG.E.128"), count(before, "STS")) == (16, 0, 0)
    assert (count(after, "STG.E"), count(after, "STS"), count(after, "BAR.SYNC.DEFER_BLOCKING")) == (0, 16, 1)
    assert count(after, "STG.E.128") == count(after, "LDS.128") == 5
    assert count(before, "LDG.E.128") == count(after, "LDG.E.128") == 8
