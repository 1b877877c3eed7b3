"""The API's input checks, on meta tensors: every bad input names the argument and the expectation."""

import pytest

torch = pytest.importorskip("torch", reason="the API needs torch (pip install torch)")
import hopattn  # noqa: E402

BF16 = torch.bfloat16


def meta(*shape, dtype=BF16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_valid_call_returns_q_shaped_output():
    q, k = meta(2, 3, 128, 128), meta(2, 3, 192, 128)
    out = hopattn.attention(q, k, k, stage=1)
    assert out.shape == q.shape and out.dtype == BF16


def test_out_is_returned():
    q = meta(1, 1, 128, 128)
    out = meta(1, 1, 128, 128)
    assert hopattn.attention(q, q, q, stage=2, out=out) is out


@pytest.mark.parametrize(
    "kwargs, args, error, message",
    [
        ({}, (meta(1, 1, 64, 128, dtype=torch.float16), meta(1, 1, 128, 128), meta(1, 1, 128, 128)), TypeError,
         "q: expected dtype torch.bfloat16"),
        ({}, (meta(1, 64, 128), meta(1, 64, 128), meta(1, 64, 128)), ValueError, "q: expected a 4-d tensor"),
        ({}, (meta(1, 1, 128, 64), meta(1, 1, 128, 64), meta(1, 1, 128, 64)), ValueError, "q: expected head dim 128"),
        ({}, (meta(1, 1, 100, 128), meta(1, 1, 128, 128), meta(1, 1, 128, 128)), ValueError, "multiple of 128, got 100"),
        ({}, (meta(1, 1, 128, 128), meta(1, 1, 65, 128), meta(1, 1, 65, 128)), ValueError, "k: stage 01 needs the key length to be a multiple of 64, got 65"),
        ({}, (meta(1, 1, 128, 128), meta(1, 1, 128, 128), meta(1, 1, 256, 128)), ValueError, "v: expected the shape of k"),
        ({}, (meta(1, 2, 128, 128), meta(1, 3, 128, 128), meta(1, 3, 128, 128)), ValueError, "k: expected batch 1 and heads 2"),
        ({}, (meta(2, 1, 128, 128), meta(1, 1, 128, 128), meta(1, 1, 128, 128)), ValueError, "k: expected batch 2"),
        ({}, (meta(1, 1, 0, 128), meta(1, 1, 128, 128), meta(1, 1, 128, 128)), ValueError, "q: expected a non-empty sequence"),
        ({"stage": 99}, None, ValueError, "stage: expected one of"),
        ({"stage": "1"}, None, ValueError, "stage: expected one of"),
        ({"causal": True}, None, ValueError, "causal: stage 01 is non-causal only"),
        ({"causal": 1}, None, TypeError, "causal: expected a bool"),
        ({"scale": 0.0}, None, ValueError, "scale: expected a finite positive number"),
        ({"scale": float("nan")}, None, ValueError, "scale: expected a finite positive number"),
        ({"scale": -0.1}, None, ValueError, "scale: expected a finite positive number"),
        ({"layout": "sbhd"}, None, ValueError, "layout: expected 'bhsd' or 'bshd'"),
        ({"layout": "bshd"}, None, ValueError, "layout: stage 01 supports 'bhsd' only"),
    ],
)
def test_bad_inputs_name_the_argument(kwargs, args, error, message):
    if args is None:
        args = (meta(1, 1, 128, 128),) * 3
    kwargs = {"stage": 1, **kwargs}
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        hopattn.attention(*args, **kwargs)


def test_non_tensor_and_cpu_inputs_are_rejected():
    q = meta(1, 1, 128, 128)
    with pytest.raises(TypeError, match="k: expected a torch.Tensor"):
        hopattn.attention(q, [1, 2], q, stage=1)
    cpu = torch.zeros(1, 1, 128, 128, dtype=BF16)
    with pytest.raises(ValueError, match="q: expected a CUDA tensor, got device cpu"):
        hopattn.attention(cpu, cpu, cpu, stage=1)


def test_non_contiguous_input_is_rejected():
    k = meta(1, 128, 2, 128).transpose(1, 2)  # BSHD storage seen as BHSD
    q = meta(1, 2, 128, 128)
    with pytest.raises(ValueError, match="k: stage 01 expects a contiguous BHSD tensor"):
        hopattn.attention(q, k, meta(1, 2, 128, 128), stage=1)


def test_bad_out_is_rejected():
    q = meta(1, 1, 128, 128)
    with pytest.raises(ValueError, match="out: expected a torch.bfloat16 tensor of shape"):
        hopattn.attention(q, q, q, stage=1, out=meta(1, 1, 256, 128))
    with pytest.raises(ValueError, match="out: expected a contiguous tensor"):
        hopattn.attention(q, q, q, stage=1, out=meta(1, 1, 128, 128).transpose(2, 3))


def test_default_stage_is_the_last():
    assert hopattn.final_stage() == hopattn.stages()[-1].number
