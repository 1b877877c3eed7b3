"""The RMSNorm lineage (Part II, kernels/rmsnorm): discovery beside the attention lineages, the typed
stage.toml, its [constants] against kernel.cu, the ABI every stage exports, and (slow, needs nvcc)
every stage compiled for sm_90a without spills, its ptxas report as its notes state it."""

import re
import shutil

import pytest
from hopattn import build, cuda_tools, lineage, rowwise

STAGES = rowwise.discover()
needs_nvcc = pytest.mark.skipif(cuda_tools.find("nvcc") is None,
                                reason="nvcc not found (install the CUDA toolkit or pip's nvidia-cuda-nvcc)")


def test_lineage_is_discovered_in_order_and_apart_from_attention():
    assert [s.number for s in STAGES] == list(range(1, len(STAGES) + 1))
    assert len(STAGES) >= 5
    assert all(s.lineage == "rmsnorm" and s.dir.parent == lineage.RMSNORM_DIR for s in STAGES)
    # the attention lineages see none of it
    assert all(s.lineage == "attention" for s in lineage.discover())
    assert all(s.lineage == "attention_backward" for s in lineage.discover(lineage.BACKWARD_DIR))


def test_library_names_carry_the_lineage():
    names = {build.library_path(s).name for s in STAGES}
    assert all(n.startswith("rmsnorm-stage") for n in names) and len(names) == len(STAGES)


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_spec_constants_match_the_kernel(stage):
    assert rowwise.constant_mismatches(stage) == []
    assert re.search(rf"__global__ void .*?\b{stage.kernel}\(", stage.kernel_path.read_text()), stage.kernel
    assert stage.spec.launch.threads in stage.constants().values()


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_every_stage_exports_the_abi_and_states_its_prediction(stage):
    source = stage.kernel_path.read_text()
    assert '#include "../common/abi_rmsnorm.h"' in source
    for name in ("hopattn_rmsnorm_launch", "hopattn_rmsnorm_describe"):
        assert f"HOPATTN_EXPORT int {name}(" in source
    assert "rms_check_params(p, err, errlen)" in source
    notes = stage.notes_path.read_text()
    assert "## Prediction" in notes and "Not measured yet" in notes  # until a GPU run measures it
    assert "ptxas -v" in notes


def test_spec_errors_name_the_file_and_the_field(tmp_path):
    folder = tmp_path / "rmsnorm" / "01_row-per-thread"
    shutil.copytree(STAGES[0].dir, folder)
    spec = folder / "stage.toml"
    spec.write_text(spec.read_text().replace('held = "none"', 'held = "disk"'))
    with pytest.raises(lineage.SpecError, match=r"stage.toml: field 'row.held' must be one of none, registers, smem"):
        rowwise.load_stage(folder)
    spec.write_text(spec.read_text().replace('held = "disk"', 'held = "none"\nspeed = 3'))
    with pytest.raises(lineage.SpecError, match=r"\[row\].speed: unknown key"):
        rowwise.load_stage(folder)
    (folder / "notes.md").unlink()
    with pytest.raises(lineage.SpecError, match="missing notes.md"):
        rowwise.load_stage(folder)


def test_a_wrong_constant_is_reported(tmp_path):
    folder = tmp_path / "rmsnorm" / "01_row-per-thread"
    shutil.copytree(STAGES[0].dir, folder)
    shutil.copytree(STAGES[0].dir.parent / "common", tmp_path / "rmsnorm" / "common")
    spec = folder / "stage.toml"
    spec.write_text(spec.read_text().replace("kThreads = 128", "kThreads = 64"))
    assert rowwise.constant_mismatches(rowwise.load_stage(folder)) == [
        f"{spec}: constants.kThreads = 64, kernel.cu has 128"]


def _sm90a_functions(log: str) -> dict[str, tuple[int, int, int]]:
    """{kernel: (registers, spill stores, spill loads)} of a ptxas -v report's sm_90a entries."""
    out = {}
    for m in re.finditer(r"Compiling entry function '(\S+)' for 'sm_90a'\n.*?\n\s+\d+ bytes stack frame, (\d+) bytes "
                         r"spill stores, (\d+) bytes spill loads\n.*?Used (\d+) registers", log):
        out[m.group(1)] = (int(m.group(4)), int(m.group(2)), int(m.group(3)))
    return out


@needs_nvcc
@pytest.mark.nvcc
@pytest.mark.slow  # five stages for sm_90a: about a minute on two cores, cached after
def test_every_stage_compiles_without_spills():
    results = build.build_stages(STAGES, jobs=2)
    for stage in STAGES:
        functions = _sm90a_functions(results[stage.number].ptxas_log)
        assert any(stage.kernel in name for name in functions), (stage.name, list(functions))
        spilled = {n: f for n, f in functions.items() if f[1] or f[2]}
        assert not spilled, f"stage {stage.id} spills: {spilled}"
        assert all(f[0] <= 64 for n, f in functions.items() if "Li1024E" in n), "1024-thread CTAs need <= 64 registers"
