"""The softmax lineages on the GPU, forward and backward, every case through the watchdog (a worker
process, a time limit per case, the case named in the log before its launch): against float64 with
the output poisoned (softmax_cases.py), at the RMSNorm cases' edge lengths from 1 to 524289 columns,
views and magnitudes, a seeded fuzz and masked rows; rows of −inf; determinism; autograd against
float64 and torch.softmax; torch.compile and CUDA graphs; torch.library.opcheck; bad inputs; the
compiled configurations.

    pytest -m gpu -rs tests/test_softmax_gpu.py
    HOPATTN_TEST_SEED=1234 pytest -m gpu tests/test_softmax_gpu.py
"""

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine (torch.cuda.is_available() is false): the kernels run on an "
                "H200, see README", allow_module_level=True)

from conftest import GPU_SEED, gpu_log_path  # noqa: E402
from hopattn import softmax_lineage  # noqa: E402
from rmsnorm_fuzz import softmax_cases  # noqa: E402

FORWARD = softmax_lineage.discover()
BACKWARD = softmax_lineage.discover_backward()
STAGES = [(s, False) for s in FORWARD] + [(s, True) for s in BACKWARD]
IDS = [f"{'backward-' if b else ''}{s.name}" for s, b in STAGES]
CASES = softmax_cases(GPU_SEED)


@pytest.fixture(scope="module")
def sm():
    from gpu_watchdog import Worker
    from hopattn import rowwise_build

    rowwise_build.build_all(FORWARD + BACKWARD)
    rowwise_build.build_native()
    worker = Worker(gpu_log_path(), cases="softmax_cases")
    yield worker
    worker.close()


@pytest.mark.parametrize("stage,backward", STAGES, ids=IDS)
@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"case{i:03d}" for i in range(len(CASES))])
def test_matches_float64(sm, stage, backward, index):
    case = CASES[index]
    seed = GPU_SEED + index
    sm.call("check_backward" if backward else "check",
            label=f"softmax {'backward ' if backward else ''}{stage.id}, #{index}, {case.label()}, seed {seed}",
            timeout=30, stage=stage.number, case=case.asdict(), seed=seed)


# The edges of stage 05's slices in fp32 and fp16 (the bf16 edges are in CASES): a slice holds 8k fp32
# (16k 16-bit) columns, clusters of 4, 8 and 16 slices, then stage 04's clusters of 1024-thread CTAs.
SLICE_EDGES = [(cols, "fp32") for cols in (16385, 32768, 32769, 65536, 65537, 131072, 131073)] + [
    (cols, "fp16") for cols in (49152, 131073, 262144, 262145)]


@pytest.mark.parametrize("stage", FORWARD[-1:], ids=[s.name for s in FORWARD[-1:]])
@pytest.mark.parametrize(("cols", "dtype"), SLICE_EDGES, ids=[f"{d}-{c}" for c, d in SLICE_EDGES])
def test_every_slice_cluster_holds_its_rows(sm, stage, cols, dtype):
    for i, (rows, view, masked) in enumerate(((5, "contiguous", False), (3, "wide", True))):
        case = dict(rows=rows, cols=cols, dtype=dtype, weight=False, view=view, magnitude=1.0, eps=0.0, masked=masked)
        seed = GPU_SEED + cols + i
        sm.call("check", label=f"softmax {stage.id}, {rows}x{cols} {dtype} {view}{' masked' if masked else ''}, "
                f"seed {seed}", timeout=30, stage=stage.number, case=case, seed=seed)


@pytest.mark.parametrize("stage", FORWARD, ids=[s.name for s in FORWARD])
def test_rows_of_minus_infinity_are_nan(sm, stage):
    sm.call("fully_masked_rows", label=f"softmax {stage.id}, rows of -inf", timeout=60, stage=stage.number,
            seed=GPU_SEED)


@pytest.mark.parametrize("stage,backward", STAGES, ids=IDS)
def test_repeats_bit_for_bit(sm, stage, backward):
    sm.call("repeats_bit_for_bit", label=f"softmax {'backward ' if backward else ''}{stage.id}, determinism",
            timeout=120, stage=stage.number, backward=backward, seed=GPU_SEED)


def test_autograd_matches_float64_and_torch(sm):
    sm.call("autograd_matches", label="softmax autograd vs float64 and torch.softmax", timeout=120, seed=GPU_SEED)


def test_compiled_and_graphed_equal_eager(sm):
    sm.call("compiled_and_graphed", label="softmax torch.compile and CUDA graph", timeout=240, seed=GPU_SEED)


def test_opcheck(sm):
    sm.call("opcheck", label="softmax ops: torch.library.opcheck", timeout=240, seed=GPU_SEED)


@pytest.mark.parametrize("stage,backward", STAGES, ids=IDS)
def test_bad_inputs_are_refused_and_the_context_survives(sm, stage, backward):
    sm.call("rejects", label=f"softmax {'backward ' if backward else ''}{stage.id}, bad inputs", timeout=60,
            stage=stage.number, backward=backward)


@pytest.mark.parametrize("stage,backward", STAGES, ids=IDS)
def test_compiled_configurations_use_no_local_memory(sm, stage, backward):
    sm.call("stage_info", label=f"softmax {'backward ' if backward else ''}{stage.id}, stage_info", timeout=60,
            stage=stage.number, backward=backward)
