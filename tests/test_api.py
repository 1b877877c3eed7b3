"""The input checks (hopattn.contract), on meta and CPU tensors: every bad input names the argument
and the expectation, through the Python function and through the raw ops torch.ops.hopattn.* alike,
and nothing reaches a launch."""

import pytest

torch = pytest.importorskip("torch", reason="the API needs torch (pip install torch)")
import hopattn  # noqa: E402
from hopattn import api, contract  # noqa: E402

BF16 = torch.bfloat16


def meta(*shape, dtype=BF16):
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.fixture
def no_launch(monkeypatch):
    """Any attempt to load a stage library (the step before a launch) fails the test."""
    def refuse(number):
        raise AssertionError(f"stage {number} was about to be launched")
    monkeypatch.setattr(api, "_library", refuse)


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
         "q: expected dtype torch.bfloat16, got torch.float16 (pass q.bfloat16()"),
        ({}, (meta(1, 1, 128, 128), meta(1, 1, 128, 128, dtype=torch.float32), meta(1, 1, 128, 128)), TypeError,
         "k: expected dtype torch.bfloat16, got torch.float32"),
        ({}, (meta(1, 64, 128), meta(1, 64, 128), meta(1, 64, 128)), ValueError, "q: expected a 4-d tensor"),
        ({}, (meta(1, 1, 128, 64), meta(1, 1, 128, 64), meta(1, 1, 128, 64)), ValueError,
         "q: head dim 64 (the last axis): stage 01 serves head dim 128"),
        ({}, (meta(1, 1, 100, 128), meta(1, 1, 128, 128), meta(1, 1, 128, 128)), ValueError, "multiple of 128, got 100"),
        ({}, (meta(1, 1, 128, 128), meta(1, 1, 65, 128), meta(1, 1, 65, 128)), ValueError,
         "k: stage 01 needs the key length to be a multiple of 64, got 65"),
        ({}, (meta(1, 1, 128, 128), meta(1, 1, 128, 128), meta(1, 1, 256, 128)), ValueError, "v: expected the shape of k"),
        ({}, (meta(1, 2, 128, 128), meta(1, 3, 128, 128), meta(1, 3, 128, 128)), ValueError,
         "k: expected 2 heads as in q"),
        ({}, (meta(2, 1, 128, 128), meta(1, 1, 128, 128), meta(1, 1, 128, 128)), ValueError, "k: expected batch 2"),
        ({"stage": 99}, None, ValueError, "stage: expected one of"),
        ({"stage": "1"}, None, ValueError, "stage: expected one of"),
        ({"stage": True}, None, ValueError, "stage: expected one of"),
        ({"causal": True}, None, ValueError, "causal: stage 01 is non-causal only"),
        ({"scale": 0.0}, None, ValueError, "scale: expected a finite positive number"),
        ({"scale": float("nan")}, None, ValueError, "scale: expected a finite positive number"),
        ({"scale": -0.1}, None, ValueError, "scale: expected a finite positive number"),
        ({"layout": "sbhd"}, None, ValueError, "layout: expected 'bhsd'"),
        ({"layout": "bshd"}, None, ValueError, "layout: stage 01 reads 'bhsd' only"),
    ],
)
def test_bad_inputs_name_the_argument(kwargs, args, error, message):
    if args is None:
        args = (meta(1, 1, 128, 128),) * 3
    kwargs = {"stage": 1, **kwargs}
    with pytest.raises(error) as caught:
        hopattn.attention(*args, **kwargs)
    assert message in str(caught.value)


def test_causal_must_be_a_bool():
    q = meta(1, 1, 128, 128)
    with pytest.raises(TypeError, match="causal: expected a bool"):
        hopattn.attention(q, q, q, stage=19, causal=1)


@pytest.mark.parametrize("entry", ["function", "op", "op_out"])
@pytest.mark.parametrize("case, error, message", [
    ("cpu", ValueError, "q: expected a CUDA tensor, got device cpu"),
    ("fp16", TypeError, "q: expected dtype torch.bfloat16, got torch.float16"),
    ("fp32", TypeError, "q: expected dtype torch.bfloat16, got torch.float32"),
])
def test_raw_ops_check_like_the_function(no_launch, entry, case, error, message):
    """torch.ops.hopattn.* are entry points of their own (a traced graph calls them directly): the
    same checks, the same messages, nothing launched."""
    dtype = {"cpu": BF16, "fp16": torch.float16, "fp32": torch.float32}[case]
    device = "cpu" if case == "cpu" else "meta"
    x = torch.zeros(1, 2, 128, 128, dtype=dtype, device=device)
    with pytest.raises(error, match=message):
        if entry == "function":
            hopattn.attention(x, x, x)
        elif entry == "op":
            torch.ops.hopattn.attention(x, x, x)
        else:
            torch.ops.hopattn.attention_out(x, x, x, torch.empty_like(x))


def test_misaligned_pointers_are_refused_before_launch(no_launch):
    """A view 2 bytes past a 16-byte boundary: the 16-byte loads and the copy engine cannot read it.
    (CPU tensors stand in for CUDA ones: check_memory reads only the pointers.)"""
    flat = torch.zeros(1 * 2 * 128 * 128 + 8, dtype=BF16)
    good = flat[8:8 + 2 * 128 * 128].view(1, 2, 128, 128)
    bad = flat[1:1 + 2 * 128 * 128].view(1, 2, 128, 128)
    call = contract.check_call(meta(1, 2, 128, 128), meta(1, 2, 128, 128), meta(1, 2, 128, 128), causal=False,
                               scale=None, stage=api._stage(None), layout="bhsd")
    out = torch.zeros(1, 2, 128, 128, dtype=BF16)
    contract.check_memory(call, good, good, good, out)  # 16-byte aligned: fine
    for args, name in (((bad, good, good, out), "q"), ((good, bad, good, out), "k"), ((good, good, good, bad), "out")):
        with pytest.raises(ValueError, match=f"{name}: .*16-byte aligned data pointer, got one 2 bytes past"):
            api._run(call, *args)


def test_out_overlapping_an_input_is_refused(no_launch):
    x = torch.zeros(1, 2, 128, 128, dtype=BF16)
    call = contract.check_call(meta(1, 2, 128, 128), meta(1, 2, 128, 128), meta(1, 2, 128, 128), causal=False,
                               scale=None, stage=api._stage(None), layout="bhsd")
    with pytest.raises(ValueError, match="out: must not share memory with k"):
        api._run(call, x.clone(), x, x.clone(), x)


def test_bad_out_is_rejected():
    q = meta(1, 1, 128, 128)
    with pytest.raises(ValueError, match="out: expected a torch.bfloat16 tensor of shape"):
        hopattn.attention(q, q, q, stage=1, out=meta(1, 1, 256, 128))
    with pytest.raises(ValueError, match="out: expected the head-dim axis"):
        hopattn.attention(q, q, q, stage=1, out=meta(1, 1, 128, 128).transpose(2, 3))
    with pytest.raises(ValueError, match="out: stage 01 reads contiguous tensors only"):
        hopattn.attention(q, q, q, stage=1, out=meta(1, 1, 256, 128)[:, :, ::2])
    with pytest.raises(TypeError, match="out: expected dtype torch.bfloat16"):
        hopattn.attention(q, q, q, stage=1, out=meta(1, 1, 128, 128, dtype=torch.float32))
    expanded = meta(1, 1, 1, 128).expand(1, 1, 128, 128)
    with pytest.raises(ValueError, match="out: the copy engine needs every stride|out: its elements overlap"):
        hopattn.attention(q, q, q, stage=19, out=expanded)


def test_non_contiguous_input_on_an_early_stage_says_what_to_pass():
    k = meta(1, 128, 2, 128).transpose(1, 2)  # BSHD storage seen as BHSD
    q = meta(1, 2, 128, 128)
    with pytest.raises(ValueError, match=r"k: stage 01 reads contiguous tensors only.*pass k.contiguous\(\), or use "
                                         r"stage 17 or later"):
        hopattn.attention(q, k, meta(1, 2, 128, 128), stage=1)


def test_layouts_the_final_stage_reads_in_place():
    """Head dim contiguous, other strides multiples of 8 elements: BSHD (one head too), a packed qkv
    view, a head-dim slice. Strides of size-1 axes are whatever torch left there and do not matter."""
    final = hopattn.final_stage()
    one_head = meta(2, 1, 300, 128).transpose(1, 2)  # BSHD, H = 1, stride(2) = 300 * 128, not 128
    assert one_head.is_contiguous()
    assert hopattn.attention(one_head, one_head, one_head, layout="bshd", stage=final).shape == one_head.shape
    packed = meta(2, 300, 4, 3, 128)  # (B, S, H, 3, D): q, k, v of a fused projection
    q, k, v = packed.unbind(3)
    assert hopattn.attention(q, k, v, layout="bshd", stage=final).shape == (2, 300, 4, 128)
    assert hopattn.attention(*(t.transpose(1, 2) for t in (q, k, v)), stage=final).shape == (2, 4, 300, 128)
    odd = meta(2, 4, 300, 132)[..., :128]  # rows 264 bytes apart: not a multiple of 16
    with pytest.raises(ValueError, match=r"q: the copy engine needs every stride .* multiple of 8 elements"):
        hopattn.attention(odd, odd, odd, stage=final)


def test_size_one_axes_get_valid_strides():
    final = api._stage(None)
    x = meta(1, 1, 300, 128)
    weird = torch.empty_strided((1, 1, 300, 128), (7, 3, 128, 1), dtype=BF16, device="meta")
    call = contract.check_call(weird, x, x, causal=False, scale=None, stage=final, layout="bhsd")
    batch, head, row = call.strides(weird)
    assert row == 128 and head % 8 == 0 and batch % 8 == 0 and head > 0 and batch > 0


def test_empty_batch_heads_and_queries_are_valid():
    for shape in ((0, 2, 128, 128), (2, 0, 128, 128), (2, 2, 0, 128)):
        x = meta(*shape)
        k = meta(shape[0], shape[1], 128, 128)
        assert hopattn.attention(x, k, k, stage=19).shape == shape
    q = meta(1, 2, 5, 128)
    none = meta(1, 2, 0, 128)
    assert hopattn.attention(q, none, none, stage=19).shape == q.shape


def test_grouped_query_heads_name_the_fix_on_stages_without_them():
    q, kv = meta(1, 8, 128, 128), meta(1, 2, 128, 128)
    with pytest.raises(ValueError, match="has no grouped-query attention: repeat k and v to 8 heads"):
        hopattn.attention(q, kv, kv, stage=1)


def test_gradients_flow_through_both_ops_with_their_shapes():
    """q, k and v get gradients shaped like themselves (grouped K/V heads included), whether the
    loss used out, lse or both (meta tensors: the ops' fake implementations, no launch)."""
    for use in (lambda o, lse: o.sum(), lambda o, lse: lse.sum(), lambda o, lse: o.sum() + lse.sum()):
        q = meta(1, 4, 100, 128).requires_grad_()
        kv = meta(1, 2, 70, 128).requires_grad_()
        out, lse = hopattn.attention(q, kv, kv, return_lse=True, causal=True)
        use(out, lse).backward()
        assert q.grad.shape == q.shape and kv.grad.shape == kv.shape
    q = meta(1, 2, 128, 128).requires_grad_()
    hopattn.attention(q, q, q, layout="bshd", deterministic=True).sum().backward()
    assert q.grad.shape == q.shape


def test_out_refuses_inputs_that_require_grad():
    q = meta(1, 2, 128, 128).requires_grad_()
    with pytest.raises(RuntimeError, match="out: a result written into out= carries no gradient"):
        hopattn.attention(q, q, q, out=meta(1, 2, 128, 128))
    with torch.no_grad():
        hopattn.attention(q, q, q, out=meta(1, 2, 128, 128))


def test_backward_arguments_are_checked_before_anything_runs():
    q = meta(1, 2, 128, 128)
    with pytest.raises(TypeError, match="deterministic: expected a bool"):
        hopattn.attention(q, q, q, deterministic=1)
    with pytest.raises(ValueError, match="backward_stage: expected one of"):
        hopattn.attention(q, q, q, backward_stage=99)


def test_torch_compile_traces_a_call_with_out(no_launch):
    """fullgraph tracing with out= (the overlap check needs real pointers and runs in the op itself)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def f(q, k, v, out):
        hopattn.attention(q, k, v, out=out)
        return out * 2

    with FakeTensorMode():
        x = torch.empty(1, 2, 128, 128, dtype=BF16, device="meta")
        graph = torch.fx.experimental.proxy_tensor.make_fx(f, tracing_mode="fake")(x, x, x, torch.empty_like(x))
    assert "hopattn.attention_out" in graph.code


def test_default_stage_is_the_last():
    assert hopattn.final_stage() == hopattn.stages()[-1].number


def test_a_strided_out_with_gaps_is_accepted_by_the_strided_stages():
    q = meta(2, 300, 4, 128)
    wide = meta(2, 300, 4, 2, 128)
    out = wide[:, :, :, 0]
    assert hopattn.attention(q, q, q, layout="bshd", out=out, stage=19) is out
