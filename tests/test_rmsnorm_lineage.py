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
    assert "## Prediction" in notes and "## Measured" in notes and "Not measured yet" not in notes
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


# --- [[config]]: the launch configurations the figures deal a row out to --------------------------


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_configs_match_the_launcher(stage):
    assert rowwise.config_mismatches(stage) == []
    held = [c for c in stage.spec.config if c.vectors]
    found = rowwise.launcher_configs(stage.kernel_path.read_text())
    assert (found is None) == (not held)


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_every_config_is_a_compiled_bf16_instance(stage):
    """Each [[config]] against the compiler facts (made from kernel.cu): the held ones by their
    template arguments <T, threads per row, vectors, rows per CTA[, cluster]>, the streamed ones by
    their kernel's 16-byte instance."""
    from hopattn.compiler.facts import _INT_ARG_RE, _matches_kernel, instance_dtype
    from hopattn.records import compiler_facts

    facts = compiler_facts.load(stage)
    instances = [(f["function"], tuple(int(n) for n in _INT_ARG_RE.findall(f["function"])))
                 for f in [facts, *facts["other_functions"]] if instance_dtype(f["function"]) == "bf16"]
    for i, c in enumerate(stage.spec.config):
        mine = [ints for fn, ints in instances if _matches_kernel(fn, c.kernel)]
        if c.vectors:
            want = (c.threads_per_row, c.vectors, c.rows_per_cta)
            assert want in mine or want + (c.cluster,) in mine, (stage.name, i, mine)
        else:
            assert () in mine or (8,) in mine, (stage.name, i, mine)  # 8 bf16: a 16-byte access


def test_a_row_goes_to_the_first_config_that_holds_it():
    stage04, stage05 = STAGES[3], STAGES[4]
    picked = {cols: stage04.spec.config_for(cols) for cols in (256, 257, 4096, 65536, 65537)}
    assert [(c.threads_per_row, c.vectors) for c in picked.values()] == [(32, 1), (32, 2), (64, 8), (1024, 8),
                                                                         (512, 0)]
    assert stage04.spec.config_for(32768, element_bytes=4).threads_per_row == 1024  # 32k fp32 fills one CTA
    assert stage05.spec.config_for(262144).cluster == 4 and stage05.spec.config_for(524288).cluster == 8
    assert stage05.spec.config_for(524289).vectors == 0  # past the largest cluster: stage 03's CTA, read twice
    assert [c.owner for c in stage05.spec.config[-4:]] == ["cluster"] * 3 + ["cta"]
    assert stage05.spec.config[-2].levels == ("thread", "warp", "cta", "cluster")


def test_a_config_that_disagrees_is_reported(tmp_path):
    stage = STAGES[3]
    folder = tmp_path / "rmsnorm" / stage.dir.name
    shutil.copytree(stage.dir, folder)
    shutil.copytree(stage.dir.parent / "common", tmp_path / "rmsnorm" / "common")
    spec = folder / "stage.toml"
    text = spec.read_text()
    spec.write_text(text.replace("threads_per_row = 64\nvectors = 8", "threads_per_row = 96\nvectors = 8", 1))
    assert "kernel.cu's with_config launches" in rowwise.config_mismatches(rowwise.load_stage(folder))[0]
    # against the rest of the spec, at load time, naming the field
    spec.write_text(text.replace('reads = 1 ', 'reads = 2 ', 1))
    with pytest.raises(lineage.SpecError, match=r"field 'row.reads' must be 1 \(the fewest of its \[\[config\]\]\)"):
        rowwise.load_stage(folder)
    spec.write_text(text.replace("vectors = 1\n", "vectors = 1\nmax_cols = 256\n", 1))
    with pytest.raises(lineage.SpecError, match=r"field 'config\[0\].max_cols' must be left out where the row is held"):
        rowwise.load_stage(folder)
    spec.write_text(text.replace("rows_per_cta = 8\n", "rows_per_cta = 64\n", 1))
    with pytest.raises(lineage.SpecError, match=r"field 'config\[0\].rows_per_cta' must be at most"):
        rowwise.load_stage(folder)
    spec.write_text(text.replace("vectors = 1\n", "vectors = 1\nwarps = 2\n", 1))
    with pytest.raises(lineage.SpecError, match=r"\[\[config\]\]\[0\].warps: unknown key"):
        rowwise.load_stage(folder)
