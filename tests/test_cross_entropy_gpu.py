"""The cross-entropy lineage on the GPU (kernels/cross_entropy; research/cross_entropy/gpu_run.sh runs
this file), every case through the watchdog (a worker
process, a time limit per case, the case named in the log before its launch): against float64 with
every output poisoned (cross_entropy_cases.py), at every configuration's edge lengths from 1 to 524289
classes, views (strided, unaligned, 3-D), magnitudes and outlier logits, ignored rows, label smoothing,
the forward alone, the fused gradient (beside the logits and in place of them), a per-row dloss, and a
seeded fuzz; rows of −inf and targets out of range; determinism; autograd against float64
torch.nn.functional.cross_entropy; torch.compile and CUDA graphs; torch.library.opcheck; bad inputs;
the compiled configurations' local memory.

    pytest -m gpu -rs tests/test_cross_entropy_gpu.py
    HOPATTN_TEST_SEED=1234 pytest -m gpu tests/test_cross_entropy_gpu.py
"""

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine (torch.cuda.is_available() is false): the cross-entropy lineage "
                "runs on an H200, see research/cross_entropy/README.md", allow_module_level=True)

import cross_entropy_cases  # noqa: E402
from conftest import GPU_SEED, gpu_log_path  # noqa: E402
from hopattn import cross_entropy_lineage  # noqa: E402

STAGES = cross_entropy_lineage.discover()
CASES = cross_entropy_cases.cases(GPU_SEED)


@pytest.fixture(scope="module")
def ce():
    from gpu_watchdog import Worker
    from hopattn import cross_entropy_ops, rowwise_build

    rowwise_build.build_all(STAGES)
    cross_entropy_ops.build_native()
    worker = Worker(gpu_log_path(), cases="cross_entropy_cases")
    yield worker
    worker.close()


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"case{i:03d}" for i in range(len(CASES))])
def test_matches_float64(ce, stage, index):
    case = CASES[index]
    seed = GPU_SEED + index
    ce.call("check", label=f"cross-entropy {stage.id}, #{index}, {cross_entropy_cases.label(case)}, seed {seed}",
            timeout=30, stage=stage.number, case=case, seed=seed)


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_rows_of_minus_infinity_and_targets_out_of_range(ce, stage):
    ce.call("special_rows", label=f"cross-entropy {stage.id}, rows of -inf, targets out of range", timeout=60,
            stage=stage.number, seed=GPU_SEED)


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_repeats_bit_for_bit(ce, stage):
    ce.call("repeats_bit_for_bit", label=f"cross-entropy {stage.id}, determinism", timeout=60, stage=stage.number,
            seed=GPU_SEED)


def test_autograd_matches_float64_torch(ce):
    ce.call("autograd_matches", label="cross-entropy autograd vs float64 F.cross_entropy", timeout=120, seed=GPU_SEED)


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_bad_inputs_are_refused_and_the_context_survives(ce, stage):
    ce.call("rejects", label=f"cross-entropy {stage.id}, bad inputs", timeout=60, stage=stage.number)


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_compiled_configurations_use_no_local_memory(ce, stage):
    ce.call("stage_info", label=f"cross-entropy {stage.id}, stage_info", timeout=60, stage=stage.number)


def test_compiled_and_graphed_equal_eager(ce):
    ce.call("compiled_and_graphed", label="cross-entropy torch.compile and CUDA graph", timeout=240, seed=GPU_SEED)


def test_opcheck(ce):
    ce.call("opcheck", label="cross-entropy ops: torch.library.opcheck", timeout=240, seed=GPU_SEED)
