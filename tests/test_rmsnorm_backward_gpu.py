"""The RMSNorm backward lineage on the GPU, every case through the watchdog (a worker process, a time
limit per case, the case named in the log before its launch): dx and dw against float64 within a
float32-derived bound (rmsnorm_backward_cases.py), dx, dw and the workspace poisoned first, at every
edge length from 1 to 524289 columns and a seeded fuzz (rmsnorm_fuzz.backward_cases: dtypes, views,
magnitudes, eps, drstd, dw wanted or not); no rows; determinism; autograd (.backward() against float64
and F.rms_norm); torch.compile and CUDA graphs; torch.library.opcheck; bad inputs; the compiled
configurations.

    pytest -m gpu -rs tests/test_rmsnorm_backward_gpu.py                       # a fresh seed (in the header)
    HOPATTN_TEST_SEED=1234 pytest -m gpu tests/test_rmsnorm_backward_gpu.py    # the same cases and inputs again
"""

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine (torch.cuda.is_available() is false): the kernels run on an "
                "H200, see README", allow_module_level=True)

from conftest import GPU_SEED, gpu_log_path  # noqa: E402
from hopattn import rowwise_backward  # noqa: E402
from rmsnorm_fuzz import backward_cases  # noqa: E402

STAGES = rowwise_backward.discover()
CASES = backward_cases(GPU_SEED)


@pytest.fixture(scope="module")
def rms():
    from gpu_watchdog import Worker
    from hopattn import rowwise, rowwise_build

    rowwise_build.build_all(STAGES + rowwise.discover()[-1:])  # and the forward's final stage (autograd, compile)
    rowwise_build.build_native()
    worker = Worker(gpu_log_path(), cases="rmsnorm_backward_cases")
    yield worker
    worker.close()


def _limit(stage, case) -> float:
    # stage 01 walks a row (and a column) with one thread: about a microsecond per element at worst
    per_walk = (case.cols + case.rows) * 3e-6 if stage.number == 1 else 0.0
    return 30 + per_walk * (1 + case.rows / 4096)


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"case{i:03d}" for i in range(len(CASES))])
def test_matches_float64(rms, stage, index):
    case = CASES[index]
    seed = GPU_SEED + index
    rms.call("check", label=f"rmsnorm backward {stage.id}, #{index}, {case.label()}, seed {seed}",
             timeout=_limit(stage, case), stage=stage.number, case=case.asdict(), seed=seed)


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_no_rows_give_a_zero_weight_gradient(rms, stage):
    rms.call("no_rows", label=f"rmsnorm backward {stage.id}, no rows", timeout=60, stage=stage.number)


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_repeats_bit_for_bit(rms, stage):
    rms.call("repeats_bit_for_bit", label=f"rmsnorm backward {stage.id}, determinism", timeout=120,
             stage=stage.number, seed=GPU_SEED)


def test_autograd_matches_float64_and_torch(rms):
    rms.call("autograd_matches", label="rmsnorm autograd vs float64 and F.rms_norm", timeout=120, seed=GPU_SEED)


def test_compiled_and_graphed_backward_equal_eager(rms):
    rms.call("compiled_and_graphed", label="rmsnorm backward: torch.compile and CUDA graph", timeout=240,
             seed=GPU_SEED)


def test_opcheck(rms):
    rms.call("opcheck", label="rmsnorm ops: torch.library.opcheck", timeout=240, seed=GPU_SEED)


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_bad_inputs_are_refused_and_the_context_survives(rms, stage):
    rms.call("rejects", label=f"rmsnorm backward {stage.id}, bad inputs", timeout=60, stage=stage.number)


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_compiled_configurations_use_no_local_memory(rms, stage):
    rms.call("stage_info", label=f"rmsnorm backward {stage.id}, stage_info", timeout=60, stage=stage.number)
