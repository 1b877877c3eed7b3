"""The host-side cost of a call (issue #29), on CPU with the device stubbed (research/host_cost.py):
the per-call time of hopattn.attention stays under a generous bound, and every cache on the call's
path is keyed by what it depends on — a call that differs from one seen before in dtype, shape,
strides, device, device capability, stage, pointer or argument still gets its own checks and errors."""

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the API needs torch (pip install torch)")
from hopattn import api, contract  # noqa: E402
from hopattn.integrations import routing  # noqa: E402

BF16 = torch.bfloat16
_spec = importlib.util.spec_from_file_location(
    "host_cost", Path(__file__).resolve().parent.parent / "research" / "host_cost.py")
host_cost = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(host_cost)

# research/host_cost.md: ~10 µs per call on the 2-core CPU it was measured on (43-51 µs before the
# caches), where checking a call in full (contract._check_call, uncached) costs ~12 µs. A loaded CI
# machine (this suite runs with -n 2, beside other jobs) slows both alike, so the bound is on their
# ratio, timed in turns: ~0.8 now, ~3.6 before; 2 fails the old cost and not a noisy run. An absolute
# bound of 10x the measured time catches a cost that grew with the full check too.
RATIO_BOUND = 2.0
BOUND_US = 100.0


@pytest.fixture
def stubbed():
    """The device stubbed as research/host_cost.py does; yields (patches, stub libraries by stage)."""
    mp = host_cost._Patches()
    libraries = host_cost.stub_device(mp)
    try:
        yield mp, libraries
    finally:
        mp.undo()


def bshd(b=1, s=256, h=4, d=128, dtype=BF16, device="cpu"):
    return torch.empty(b, s, h, d, dtype=dtype, device=device)


def last_launch(libraries):
    (lib,) = [lib for lib in libraries.values() if lib.launches]
    return lib.last


def test_host_time_per_call_stays_under_the_bound(stubbed):
    q, k, v = host_cost.tensors(host_cost.SHAPES["ltx2-self"])
    stage, table = api._stage(None), api._stages()

    def full_check():  # the contract's checks without the cache: the yardstick of this machine's speed
        contract._check_call(q, k, v, causal=False, scale=None, stage=stage, layout="bshd", lineage=table)

    call, check = [], []
    for _ in range(5):  # in turns, so a burst of load hits both
        call.append(host_cost.time_per_call(lambda: api.attention(q, k, v, layout="bshd"), 300, 3)["min_us"])
        check.append(host_cost.time_per_call(full_check, 300, 3)["min_us"])
    best, yardstick = min(call), min(check)
    assert best < BOUND_US, f"hopattn.attention costs {best:.1f} µs of host time per call (bound {BOUND_US})"
    assert best < RATIO_BOUND * yardstick, (f"hopattn.attention costs {best:.1f} µs of host time per call, "
                                            f"{best / yardstick:.2f}x a full contract check ({yardstick:.1f} µs; "
                                            f"bound {RATIO_BOUND}x)")


def test_the_harness_measures_every_layer(stubbed):
    found = host_cost.measure(20, 3)
    layers = found["ltx2-self"]
    assert "hopattn.attention bshd" in layers and "diffusers backend (no mask)" in layers
    assert all(s["median_us"] > 0 for s in layers.values())


def test_a_stubbed_call_reaches_the_launch_with_its_own_arguments(stubbed):
    _, libraries = stubbed
    q = bshd(b=2)
    api.attention(q, q, q, layout="bshd", scale=0.5)
    args = last_launch(libraries)
    assert args[4] == (256 * 4 * 128, 128, 4 * 128) and args[13] == 0.5
    # the same tensors seen as BHSD views (another key): the kernel's strides are the same
    qh = q.transpose(1, 2)
    api.attention(qh, qh, qh)
    args = last_launch(libraries)
    assert args[4] == (256 * 4 * 128, 128, 4 * 128) and args[13] == pytest.approx(128 ** -0.5)
    # another layout of the same shape: strides of their own (Call.strides is not shared across shapes)
    c = torch.empty(2, 4, 256, 128, dtype=BF16)
    api.attention(c, c, c)
    assert last_launch(libraries)[4] == (4 * 256 * 128, 256 * 128, 128)
    api.attention(q, q, q, layout="bshd", causal=True)
    assert last_launch(libraries)[14] is True


def test_a_call_seen_before_in_another_dtype_is_checked_again(stubbed):
    q = bshd()
    api.attention(q, q, q, layout="bshd")
    half = bshd(dtype=torch.float16)
    with pytest.raises(TypeError, match="q: expected dtype torch.bfloat16"):
        api.attention(half, q, q, layout="bshd")
    with pytest.raises(TypeError, match="v: expected dtype torch.bfloat16"):
        torch.ops.hopattn.attention(q, q, half, False, None, None, "bshd")


def test_a_call_seen_before_with_another_shape_is_checked_again(stubbed):
    q = bshd()
    api.attention(q, q, q, layout="bshd")
    with pytest.raises(ValueError, match="k: expected batch 1"):
        api.attention(q, bshd(b=2), bshd(b=2), layout="bshd")
    with pytest.raises(ValueError, match="head dim 72"):
        api.attention(bshd(d=72), bshd(d=72), bshd(d=72), layout="bshd")
    with pytest.raises(ValueError, match="v: expected the shape of k"):
        api.attention(q, q, bshd(s=128), layout="bshd")


def test_a_call_seen_before_with_other_strides_is_checked_again(stubbed):
    x = torch.empty(1, 4, 256, 128, dtype=BF16)
    api.attention(x, x, x, stage=1)
    view = torch.empty(1, 256, 4, 128, dtype=BF16).transpose(1, 2)  # the same shape, BSHD storage
    with pytest.raises(ValueError, match="stage 01 reads contiguous tensors only"):
        api.attention(view, x, x, stage=1)
    api.attention(view, x, x)  # the final stage reads it in place
    odd = torch.empty(1, 4, 256, 132, dtype=BF16)[..., :128]  # rows 264 bytes apart
    with pytest.raises(ValueError, match="positive multiple of 8 elements"):
        api.attention(odd, x, x)
    flipped = torch.empty(1, 4, 128, 256, dtype=BF16).transpose(2, 3)
    with pytest.raises(ValueError, match="head-dim axis"):
        api.attention(flipped, x, x)


def test_a_call_seen_before_on_another_device_is_checked_again(stubbed):
    mp, _ = stubbed
    q = bshd()
    api.attention(q, q, q, layout="bshd")
    with pytest.raises(ValueError, match="k, v: expected the device of q"):
        api.attention(q, bshd(device="meta"), bshd(device="meta"), layout="bshd")
    mp.undo()  # CPU is no longer taken for CUDA: the call checked before is refused now
    with pytest.raises(ValueError, match="q: expected a CUDA tensor, got device cpu"):
        api.attention(q, q, q, layout="bshd")
    with pytest.raises(ValueError, match="q: expected a CUDA tensor, got device cpu"):
        contract.check_call(q, q, q, causal=False, scale=None, stage=api._stage(None), layout="bshd")


def test_another_device_capability_gets_its_own_check():
    q = bshd()
    for capability, fails in (((9, 0), False), ((8, 0), True), ((9, 0), False), ((10, 0), True)):
        mp = host_cost._Patches()
        host_cost.stub_device(mp, capability=capability)
        try:
            if fails:
                with pytest.raises(RuntimeError, match="only Hopper"):
                    api.attention(q, q, q, layout="bshd")
            else:
                api.attention(q, q, q, layout="bshd")
        finally:
            mp.undo()


def test_a_call_seen_before_with_another_stage_or_argument_is_checked_again(stubbed):
    x = torch.empty(1, 4, 256, 128, dtype=BF16)
    api.attention(x, x, x, stage=1)
    with pytest.raises(ValueError, match="causal: stage 01 is non-causal only"):
        api.attention(x, x, x, stage=1, causal=True)
    with pytest.raises(ValueError, match="return_lse: stage 01"):
        api.attention(x, x, x, stage=1, return_lse=True)
    with pytest.raises(ValueError, match="layout: stage 01 reads 'bhsd'"):
        api.attention(x, x, x, stage=1, layout="bshd")
    with pytest.raises(TypeError, match="causal: expected a bool, got int"):
        contract.check_call(x, x, x, causal=1, scale=None, stage=api._stage(1), layout="bhsd")
    with pytest.raises(ValueError, match="scale: expected a finite positive number"):
        contract.check_call(x, x, x, causal=False, scale=-1.0, stage=api._stage(1), layout="bhsd")
    short = torch.empty(1, 4, 100, 128, dtype=BF16)
    api.attention(short, short, short)  # the final stage takes any length
    with pytest.raises(ValueError, match="multiple of 128, got 100"):
        api.attention(short, short, short, stage=1)


def test_pointers_and_overlaps_are_checked_every_call(stubbed):
    big = torch.empty(1, 4, 257, 128, dtype=BF16)
    aligned, shifted = big[:, :, :256], big[:, :, 1:]  # the same shape and strides, another pointer
    api.attention(aligned, aligned, aligned)
    api.attention(big[:, :, 1:].clone(), aligned, aligned)
    # one element (2 bytes) past a boundary: the row stride keeps it, the pointer does not
    odd = torch.empty(1 * 4 * 256 * 128 + 1, dtype=BF16)[1:].view(1, 4, 256, 128)
    with pytest.raises(ValueError, match="q: the kernels read and write rows with 16-byte accesses"):
        api.attention(odd, aligned, aligned)
    out = torch.empty(1, 4, 256, 128, dtype=BF16)
    api.attention(aligned, aligned, aligned, out=out)
    with pytest.raises(ValueError, match="out: must not share memory with q"):
        api.attention(aligned, shifted.clone(), shifted.clone(), out=aligned)
    k = aligned.clone()
    with pytest.raises(ValueError, match="out: must not share memory with k"):
        api.attention(out, k, aligned.clone(), out=k)


def test_plain_eager_skips_the_dispatch_and_anything_else_takes_it(stubbed):
    """The direct path runs only when the op's dispatch would do nothing else: a dispatch mode sees the
    op, and a call that needs a gradient goes through autograd."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    q = bshd()
    assert api._plain_eager(q)
    with Seen() as seen:
        api.attention(q, q, q, layout="bshd")
    assert any("hopattn.attention" in op for op in seen.ops), seen.ops
    with Seen() as seen:
        api.attention(q, q, q, layout="bshd")  # not remembered from before: looked at every call
    assert any("hopattn.attention" in op for op in seen.ops)
    g = bshd().requires_grad_()
    out = api.attention(g, g, g, layout="bshd")
    assert out.grad_fn is not None  # through the op's autograd
    with torch.no_grad():
        assert api.attention(g, g, g, layout="bshd").grad_fn is None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        api.attention(q, q, q, layout="bshd")
    assert any("hopattn::attention" in e.key for e in prof.key_averages())


def test_call_shapes_are_kept_apart():
    q = torch.empty(1, 4, 64, 128, dtype=BF16)
    a = routing.shape_of("diffusers", q, q, False, "bshd", v=q)
    assert routing.shape_of("diffusers", q, q, False, "bshd", v=q) is a
    assert routing.shape_of("diffusers", q.half(), q, False, "bshd", v=q).dtype == "float16"
    assert routing.shape_of("diffusers", q, q, True, "bshd", v=q).causal
    assert routing.shape_of("transformers", q, q, False, "bshd", v=q).library == "transformers"
    assert routing.shape_of("diffusers", q, q, False, "bhsd", v=q).layout == "bhsd"
    k = torch.empty(1, 2, 32, 128, dtype=BF16)
    other = routing.shape_of("diffusers", q, k, False, "bshd", v=torch.empty(1, 2, 32, 64, dtype=BF16))
    assert (other.kv_heads, other.k_len, other.head_dim_v) == (2, 32, 64)


def test_a_torch_without_the_private_state_takes_the_dispatch(monkeypatch):
    """_plain_eager reads torch's private state; a torch where a piece of it is missing (another
    version) must take the op's dispatch, not fail every call."""
    import torch
    from hopattn import api

    class Bare:  # a custom op object without the attributes _plain_eager reads
        pass

    monkeypatch.setattr(api, "_attention_op", Bare())
    monkeypatch.setattr(api, "DIRECT_DEVICE_TYPES", ("cpu",))
    assert api._plain_eager(torch.zeros(1)) is False


def test_the_autocast_guard_reads_the_state_under_either_name(monkeypatch):
    """torch 2.13 keeps register_autocast's rule in ``_autocast_dtype``; torch 2.11 (the H200
    machine's) has no such attribute, and reading it made every eager call take the dispatch there.
    The guard reads whatever ``_autocast*`` attributes the op was built with: none set is no rule."""
    from hopattn import api

    class Op211:  # the attributes _plain_eager reads, under other autocast names (set in the constructor)
        def __init__(self):
            self._backend_fns = {None: object()}
            self._torch_dispatch_fns: dict = {}
            self._disabled_kernel: set = set()
            self._vmap_fn = None
            self._autocast_cuda_dtype = None
            self._autocast_cpu_dtype = None

    class Op213(Op211):
        def __init__(self):
            super().__init__()
            del self._autocast_cuda_dtype, self._autocast_cpu_dtype
            self._autocast_dtype: dict = {}

    monkeypatch.setattr(api, "DIRECT_DEVICE_TYPES", ("cpu",))
    for op in (Op211(), Op213()):
        monkeypatch.setattr(api, "_attention_op", op)
        assert api._plain_eager(torch.zeros(1)) is True
        if isinstance(op, Op213):
            op._autocast_dtype["cuda"] = torch.float16  # register_autocast fills the dict
        else:
            op._autocast_cuda_dtype = torch.float16  # ... or sets its attribute
        assert api._plain_eager(torch.zeros(1)) is False  # the dispatch applies the rule


def test_the_launch_arguments_are_prepared_once_per_call_shape_and_strides(stubbed):
    """api._prepared: the binding converts a call's strides and sizes once; the same call again only
    passes its pointers, and other strides (or another stage's library) get arguments of their own."""
    _, libraries = stubbed
    q = bshd(b=2)
    api.attention(q, q, q, layout="bshd")
    (lib,) = [lib for lib in libraries.values() if lib.launches]
    assert lib.prepared == 1
    api.attention(bshd(b=2), bshd(b=2), bshd(b=2), layout="bshd")  # new tensors, same shapes and strides
    assert lib.prepared == 1 and lib.launches == 2
    qh = q.transpose(1, 2)
    api.attention(qh, qh, qh)  # the same memory as BHSD views: another checked call, its own arguments
    assert lib.prepared == 2
    wide = torch.empty(2, 256, 4, 256, dtype=BF16)[..., :128]  # rows twice as far apart
    api.attention(wide, wide, wide, layout="bshd")
    assert lib.prepared == 3 and last_launch(libraries)[4] == (256 * 4 * 256, 256, 4 * 256)
