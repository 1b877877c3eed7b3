"""hopattn.rms_norm's contract without a GPU: every bad input raises before a launch, naming the
argument and the fix, through the Python function and torch.ops.hopattn.rms_norm alike (checked on
fake CUDA tensors, which need no device); the fake implementation's shapes (what torch.compile
traces); the rows a strided view folds into."""

import math

import pytest

torch = pytest.importorskip("torch", reason="the op needs torch")
import hopattn  # noqa: E402
from hopattn import rmsnorm  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

BF16 = torch.bfloat16


@pytest.fixture
def fake():
    with FakeTensorMode():
        yield Fake()


class Fake:
    """Fake CUDA tensors (no device needed): f(4, 8) contiguous, f.strided((4, 8), (16, 1)) a view's
    strides (fake CUDA tensors cannot be sliced without a device)."""

    def __call__(self, *shape, dtype=BF16):
        return torch.empty(*shape, dtype=dtype, device="cuda")

    def strided(self, shape, stride, dtype=BF16):
        return torch.empty_strided(shape, stride, dtype=dtype, device="cuda")


def test_cpu_tensors_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"x: expected a CUDA tensor, got one on cpu: pass x.cuda\(\)"):
        hopattn.rms_norm(torch.ones(2, 8))
    with pytest.raises(ValueError, match="x: expected a CUDA tensor"):
        torch.ops.hopattn.rms_norm(torch.ones(2, 8), None, 1e-6, None)


BAD = [
    (lambda f: (f(4, 8, dtype=torch.float64), None, 1e-6, None), ValueError, "x: expected torch.bfloat16, torch.float16"),
    (lambda f: (f(4, 0), None, 1e-6, None), ValueError, "x: the last axis is empty"),
    (lambda f: (f.strided((4, 8), (1, 4)), None, 1e-6, None), ValueError, r"x: the last axis must be contiguous .* pass x.contiguous"),
    (lambda f: (f.strided((6, 4, 16), (16, 96, 1)), None, 1e-6, None), ValueError, "do not fold into rows"),
    (lambda f: (f(4, 8), f(7), 1e-6, None), ValueError, r"weight: expected shape \(8,\)"),
    (lambda f: (f(4, 8), f(8, dtype=torch.float32), 1e-6, None), ValueError,
     r"weight: expected x's dtype torch.bfloat16, got torch.float32: pass weight.to\(torch.bfloat16\)"),
    (lambda f: (f(4, 8), f.strided((8,), (2,)), 1e-6, None), ValueError, "weight: expected a contiguous tensor"),
    (lambda f: (f(4, 8), None, -1.0, None), ValueError, "eps: expected a finite number >= 0"),
    (lambda f: (f(4, 8), None, math.nan, None), ValueError, "eps: expected a finite number >= 0"),
    (lambda f: (f(4, 8), None, 1e-6, 99), ValueError, "stage: expected None"),
]


@pytest.mark.parametrize("make,error,message", BAD, ids=[m for _, _, m in BAD])
def test_bad_inputs_name_the_argument(fake, make, error, message):
    x, weight, eps, stage = make(fake)
    with pytest.raises(error, match=message):
        hopattn.rms_norm(x, weight, eps, stage=stage)
    with pytest.raises(error, match=message):
        torch.ops.hopattn.rms_norm(x, weight, eps, stage)


def test_weight_on_another_device_and_wrong_types():
    with FakeTensorMode():
        x = torch.empty(4, 8, dtype=BF16, device="cuda")
        with pytest.raises(ValueError, match="weight: expected a tensor on x's device"):
            rmsnorm.check(x, torch.empty(8, dtype=BF16, device="cpu"), 1e-6, None)
        with pytest.raises(ValueError, match="stage: expected None"):  # the op's schema would read True as 1
            hopattn.rms_norm(x, stage=True)
        with pytest.raises(TypeError, match="eps: expected a float, got bool"):
            rmsnorm.check(x, None, True, None)
        with pytest.raises(TypeError, match="return_rstd: expected a bool"):
            hopattn.rms_norm(x, return_rstd=1)
        with pytest.raises(TypeError, match="x: expected a torch.Tensor, got list"):
            rmsnorm.check([1.0], None, 1e-6, None)


def test_the_op_has_a_backward():
    # the backward's own contract and wiring: tests/test_rmsnorm_backward.py; .backward() itself on a GPU:
    # tests/test_rmsnorm_backward_gpu.py (recording autograd on fake CUDA tensors needs a CUDA build of torch)
    assert rmsnorm.final_backward_stage() >= 1
    assert "no backward" not in (rmsnorm.rms_norm.__doc__ or "")


def test_fake_outputs_have_the_op_shapes(fake):
    for dtype in (BF16, torch.float16, torch.float32):
        out, rstd = torch.ops.hopattn.rms_norm(fake(2, 3, 4096, dtype=dtype), fake(4096, dtype=dtype), 1e-6, None)
        assert out.shape == (2, 3, 4096) and out.dtype == dtype and out.is_contiguous()
        assert rstd.shape == (2, 3) and rstd.dtype == torch.float32
    out, rstd = hopattn.rms_norm(fake(5), return_rstd=True)  # one row
    assert out.shape == (5,) and rstd.shape == ()


@pytest.mark.parametrize("shape,stride,rows,row_stride", [
    ((8, 4096), (4096, 1), 8, 4096),
    ((8, 4096), (4100, 1), 8, 4100),              # a column slice of a wider tensor
    ((2, 3, 4096), (12288, 4096, 1), 6, 4096),
    ((2, 3, 4096), (15000, 5000, 1), 6, 5000),   # leading axes that fold into one stride
    ((3, 1, 4096), (8192, 4096, 1), 3, 8192),    # every other row; an axis of one is ignored
    ((1, 1, 64), (64, 64, 1), 1, 64),
    ((0, 64), (64, 1), 0, 64),                   # no rows: nothing to launch
])
def test_rows_of_strided_views(fake, shape, stride, rows, row_stride):
    call = rmsnorm.check(fake.strided(shape, stride), None, 1e-6, None)
    assert (call.rows, call.cols, call.x_stride) == (rows, shape[-1], row_stride)


def test_overlapping_rows_are_refused(fake):
    with pytest.raises(ValueError, match="x: rows overlap"):
        rmsnorm.check(fake.strided((4, 64), (32, 1)), None, 1e-6, None)


def test_default_stage_is_the_final_one():
    assert rmsnorm._stage(None).number == rmsnorm.final_stage() == len(rmsnorm.stages())
