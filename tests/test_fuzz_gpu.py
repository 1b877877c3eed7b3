"""The seeded fuzz over the whole contract (fuzz_shapes.py), for every stage that declares it:
each shape against float64 with the output poisoned first, through the watchdog, so a case that
hangs fails naming its stage, shape, mask, layout, view and seed, and the run goes on.

    pytest -m gpu tests/test_fuzz_gpu.py                       # a fresh seed (printed in the header)
    HOPATTN_TEST_SEED=1234 pytest -m gpu tests/test_fuzz_gpu.py  # the same shapes and inputs again
"""

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine (torch.cuda.is_available() is false): the kernels run on an "
                "H200, see README", allow_module_level=True)

from conftest import GPU_SEED  # noqa: E402
from fuzz_shapes import fuzz_shapes  # noqa: E402
from hopattn import lineage  # noqa: E402

FULL = [s for s in lineage.discover() if s.causal and s.tails and s.strided]
# Shape by shape, each stage in turn: the worker keeps the last reference, so each shape's float64
# reference is computed once.
SHAPES = {gqa: fuzz_shapes(GPU_SEED, gqa=gqa) for gqa in (False, True)}
CASES = [(s, i, SHAPES[s.gqa][i]) for i in range(len(SHAPES[False])) for s in FULL]


@pytest.mark.parametrize("stage, index, shape", CASES, ids=[f"{s.name}-{i:03d}" for s, i, _ in CASES])
def test_fuzz(gpu, stage, index, shape):
    seed = GPU_SEED + index  # the same inputs for every stage on this shape: one reference
    out_view = "strided" if index % 5 == 4 else "contiguous"
    label = f"stage {stage.id}, fuzz #{index}, {shape.label()}, out={out_view}, seed {seed}"
    gpu.call("check", label=label, timeout=90, stage=stage.number, shape=shape.asdict(), seed=seed, out_view=out_view)
