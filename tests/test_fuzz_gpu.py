"""The seeded fuzz over the whole contract (fuzz_shapes.py), for every stage that declares it:
each shape against float64 with the output poisoned first, through the watchdog, so a case that
hangs fails naming its stage, shape, mask, layout, view and seed, and the run goes on; and for the
stages that serve head dims besides 128 (stage 24 on), a fuzz of each of those head dims.

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


# The head dims besides 128 of the stages that serve several (supports.head_dims, stage 24 on): the
# regression shapes and HEAD_DIM_COUNT random ones per head dim, lengths on and off that head dim's
# own tile (kernel.cu's HeadDimTile<D>).
HEAD_DIM_COUNT = 96


def _head_dim_shapes(stage, head_dim, head_dim_v):
    c = stage.constants(head_dim)
    return fuzz_shapes(GPU_SEED + head_dim, count=HEAD_DIM_COUNT, gqa=stage.gqa, head_dim=head_dim,
                       head_dim_v=head_dim_v, tile=(c["BLOCK_M"], c["BLOCK_N"]))


HEAD_DIM_CASES = [(s, i, shape) for s in FULL if len(s.head_dims) > 1 for d, dv in s.head_dims if (d, dv) != (128, 128)
                  for i, shape in enumerate(_head_dim_shapes(s, d, dv))]


@pytest.mark.parametrize("stage, index, shape", HEAD_DIM_CASES,
                         ids=[f"{s.name}-d{sh.head_dim}-{i:03d}" for s, i, sh in HEAD_DIM_CASES])
def test_fuzz_head_dims(gpu, stage, index, shape):
    seed = GPU_SEED + shape.head_dim + index
    out_view = "strided" if index % 5 == 4 else "contiguous"
    label = f"stage {stage.id}, head-dim fuzz #{index}, {shape.label()}, out={out_view}, seed {seed}"
    gpu.call("check", label=label, timeout=90, stage=stage.number, shape=shape.asdict(), seed=seed, out_view=out_view)
