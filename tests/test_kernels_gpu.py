"""Every stage against a float64 reference on the GPU, through the watchdog (gpu_watchdog.py).

Fresh random inputs each run (the seed is in the header and in every failure), outputs poisoned
with NaN before launch, scores of magnitude 50 and more, shapes with Lq != Lk and batch/heads that
are not powers of two, and a second launch that must reproduce the first bit for bit (a moving
result is a race). Bad inputs — misaligned, CPU, fp16, fp32, an out that aliases an input — are
refused by the function and by the raw ops before any launch, and the CUDA context survives them.
"""

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine (torch.cuda.is_available() is false): the kernels run on an "
                "H200, see README", allow_module_level=True)

from conftest import GPU_SEED  # noqa: E402
from hopattn import lineage  # noqa: E402

STAGES = lineage.discover()
REJECTED = ("misaligned", "misaligned_out", "cpu", "fp16", "fp32", "out_aliases_q")


def runnable(stage):
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0) if stage.arch == "sm_90a" else major < 8:
        pytest.skip(f"{torch.cuda.get_device_name()} cannot run {stage.arch} code")


def shapes_for(stage):
    """(batch, heads, len_q, len_k) for a stage, respecting its tile multiples."""
    m, n = stage.block_m, stage.block_n
    return [(1, 1, m, n), (3, 5, 3 * m, 5 * n), (2, 3, 1024, 4096), (1, 1, 2 * m, 16384), (1, 2, 16384, 16384)]


CASES = [(s, shape) for s in STAGES for shape in shapes_for(s)]


@pytest.mark.parametrize("stage, shape", CASES, ids=[f"{s.name}-{'x'.join(map(str, sh))}" for s, sh in CASES])
def test_stage_matches_float64_reference(gpu, stage, shape):
    runnable(stage)
    batch, heads, len_q, len_k = shape
    case = dict(batch=batch, heads=heads, len_q=len_q, len_k=len_k, causal=False, layout="bhsd",
                view="contiguous", kv_heads=0)
    seed = GPU_SEED + stage.number
    label = f"stage {stage.id}, (B, H, Lq, Lk)={shape}, causal=False, layout=bhsd, seed {seed}"
    gpu.call("check", label=label, stage=stage.number, shape=case, seed=seed, repeat=True)
    if len_k >= 4096:
        peak = gpu.call("peak_score", label=f"peak score, {label}", shape=case, seed=seed)
        assert peak >= 50, f"the inputs should reach scores of 50 and more, reached {peak:.1f}"


MAXIMA = [(s, kind, causal) for s in STAGES if s.causal and s.tails
          for kind in ("rising", "rising-slow", "jump", "jump-window", "falling") for causal in (False, True)]


@pytest.mark.parametrize("stage, kind, causal", MAXIMA,
                         ids=[f"{s.name}-{kind}-{'causal' if c else 'full'}" for s, kind, c in MAXIMA])
def test_row_maxima_that_move_far(gpu, stage, kind, causal):
    """Scores rising 30 or 5 log2 units a key block, one block 160 above the rest (its exponentials
    overflow fp32 against an earlier maximum), one block 127 above (finite exponentials past 2^126,
    too large to rebase by a normal fp32 factor), or the first block highest: the rescale's and the
    deferred maximum's slow paths, at an odd length (2 x 2 x 1000 x 3001)."""
    runnable(stage)
    seed = GPU_SEED + stage.number
    gpu.call("moving_maxima", label=f"stage {stage.id}: maxima {kind}, causal={causal}, seed {seed}",
             stage=stage.number, kind=kind, causal=causal, seed=seed)


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_compiled_kernel_matches_spec(gpu, stage):
    runnable(stage)
    info = gpu.call("stage_info", label=f"stage {stage.id}: describe", stage=stage.number)
    assert info["threads"] == stage.threads
    assert info["max_threads"] == stage.threads  # __launch_bounds__(NUM_THREADS)
    assert info["static_smem"] + info["dynamic_smem"] == stage.smem_bytes
    assert (info["block_m"], info["block_n"]) == (stage.block_m, stage.block_n)
    if info["local_bytes"]:  # spills: allowed only where the notes explain them
        assert "spill" in stage.notes_path.read_text().lower(), f"{stage.name} uses local memory; notes.md must say why"


@pytest.mark.parametrize("case", REJECTED)
@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_bad_inputs_are_refused_before_launch(gpu, stage, case):
    runnable(stage)
    message = gpu.call("rejects", label=f"stage {stage.id}: {case} input", stage=stage.number, case=case)
    assert message and ("q:" in message or "out:" in message), message


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_empty_inputs_give_empty_or_zero_results(gpu, stage):
    runnable(stage)
    gpu.call("empty_and_degenerate", label=f"stage {stage.id}: empty and degenerate shapes", stage=stage.number)


def test_torch_compile_with_and_without_out(gpu):
    stage = STAGES[-1]
    gpu.call("compiled_calls", label=f"stage {stage.id}: torch.compile", timeout=300, stage=stage.number,
             seed=GPU_SEED)


def test_custom_scale_is_applied(gpu):
    gpu.call("custom_scale", label="custom scale", stage=STAGES[-1].number, seed=GPU_SEED)
