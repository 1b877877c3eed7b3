"""The RMSNorm lineage on the GPU, every case through the watchdog (a worker process, a time limit
per case, the case named in the log before its launch): outputs and rstd against float64 within a
float32-derived bound (rmsnorm_cases.py) at every edge length from 1 to 524289 columns and a seeded
fuzz (rmsnorm_fuzz.py: dtypes, views, magnitudes, eps), determinism, torch.compile and CUDA graphs,
bad inputs, the compiled configurations.

    pytest -m gpu -rs tests/test_rmsnorm_gpu.py                          # a fresh seed (in the header)
    HOPATTN_TEST_SEED=1234 pytest -m gpu tests/test_rmsnorm_gpu.py       # the same cases and inputs again
"""

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine (torch.cuda.is_available() is false): the kernels run on an "
                "H200, see README", allow_module_level=True)

from conftest import GPU_SEED, gpu_log_path  # noqa: E402
from hopattn import rowwise  # noqa: E402
from rmsnorm_fuzz import edge_cases, fuzz_cases  # noqa: E402

STAGES = rowwise.discover()
CASES = edge_cases() + fuzz_cases(GPU_SEED)


@pytest.fixture(scope="module")
def rms():
    from gpu_watchdog import Worker
    from hopattn import build, rowwise_build

    build.build_stages(STAGES)
    rowwise_build.build_native()
    worker = Worker(gpu_log_path(), cases="rmsnorm_cases")
    yield worker
    worker.close()


def _limit(stage, case) -> float:
    # stage 01 walks a row with one thread: about a microsecond per element at worst
    per_row = case.cols * 2e-6 if stage.number == 1 else 0.0
    return 30 + per_row * (1 + case.rows / 4096)


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"case{i:03d}" for i in range(len(CASES))])
def test_matches_float64(rms, stage, index):
    case = CASES[index]
    seed = GPU_SEED + index
    rms.call("check", label=f"rmsnorm {stage.id}, #{index}, {case.label()}, seed {seed}", timeout=_limit(stage, case),
             stage=stage.number, case=case.asdict(), seed=seed)


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_repeats_bit_for_bit(rms, stage):
    rms.call("repeats_bit_for_bit", label=f"rmsnorm {stage.id}, determinism", timeout=120, stage=stage.number,
             seed=GPU_SEED)


def test_compiled_and_graphed_equal_eager(rms):
    rms.call("compiled_and_graphed", label="rmsnorm torch.compile and CUDA graph", timeout=240, seed=GPU_SEED)


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_bad_inputs_are_refused_and_the_context_survives(rms, stage):
    rms.call("rejects", label=f"rmsnorm {stage.id}, bad inputs", timeout=60, stage=stage.number)


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_compiled_configurations_use_no_local_memory(rms, stage):
    rms.call("stage_info", label=f"rmsnorm {stage.id}, stage_info", timeout=60, stage=stage.number)
