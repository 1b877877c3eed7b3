"""The host-side cost of one attention call, layer by layer, up to (not including) the CUDA launch (issue #29).

    PYTHONPATH=kernels:. python research/host_cost.py            # CPU: device parts stubbed, every Python check runs
    PYTHONPATH=kernels:. python research/host_cost.py --profile  # ... and a cProfile of hopattn.attention
    PYTHONPATH=kernels:. python research/host_cost.py --gpu      # GPU: real calls, host time against kernel time
    PYTHONPATH=kernels:. python research/host_cost.py --gpu --profile  # ... and the pieces and a cProfile, real calls

CPU mode (no GPU needed): CPU tensors of LTX-2's shapes, strides and dtype stand in for CUDA ones, and
the device parts are stubbed — the contract's device-type check also takes "cpu", the device
capability reads (9, 0) (an H200), the SM count 132, the stage library is a stub whose launch does
nothing (nothing is compiled), and torch.cuda's device guard and current stream are no-ops. Every
other line of the call runs as it does on a GPU: the argument checks, the contract, the custom op's
dispatch (autograd key included), the output allocation (on the CPU allocator, not CUDA's caching
one), the strides and the binding's arguments. What the stubs stand for (cudaGetDevice/SetDevice,
the current stream, CUDA's allocator, the launch itself) only ``--gpu`` measures.

Each layer is timed as the median over ``--repeats`` batches of ``--calls`` calls (µs per call),
with the 10th and 90th percentile of the batches as its spread.

GPU mode: per shape (LTX-2's, and a tiny one where the launch alone is longer than the kernel),
``--calls`` calls launched back to back: the CPU time per call until the last one is queued, the
wall time per call once the GPU is done (torch.cuda.synchronize), and the kernel's own time per call
from the profiler. host/call above kernel/call: the GPU waits for the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "kernels"), str(Path(__file__).resolve().parent.parent)]

from hopattn import api, contract  # noqa: E402

BF16 = torch.bfloat16
# LTX-2 (BSHD, head dim 128): video self-attention and its text cross-attention, at lengths the CPU
# allocator stands (the host cost does not depend on the lengths; the allocation's does a little).
SHAPES = {"ltx2-self": (1, 32, 256, 256, 128), "ltx2-cross": (1, 32, 256, 128, 128)}
# The shapes the GPU mode runs for real: LTX-2's, and a tiny call whose kernel is shorter than its host time.
GPU_SHAPES = {"ltx2-self": (1, 32, 6144, 6144, 128), "ltx2-cross": (1, 32, 6144, 1024, 128),
              "ltx2-audio": (1, 32, 256, 256, 64), "tiny": (1, 1, 128, 128, 128)}


class StubLibrary:
    """The stage library's interface, launching nothing."""

    def __init__(self, number: int):
        self.number = number
        self.launches = 0
        self.prepared = 0  # the PreparedLaunch objects made (api._prepared)

    def launch(self, *args) -> None:
        self.launches += 1
        self.last = args  # the binding's arguments: pointers, strides, sizes, scale, causal, SMs, stream, ...

    def prepare(self, *args) -> tuple:
        self.prepared += 1
        return args  # the binding's PreparedLaunch: strides, sizes, scale, causal, SMs, K/V heads

    def launch_prepared(self, prepared, q, k, v, o, lse, stream) -> None:
        self.launches += 1
        p = prepared  # recorded in launch()'s order, as the binding would have been given them
        self.last = (q, k, v, o, *p[0:4], *p[4:9], p[9], p[10], p[11], stream, p[12], lse)

    def describe(self) -> dict:
        return {"threads": 384, "dynamic_smem": 0, "static_smem": 0, "registers": 168, "max_threads": 384,
                "local_bytes": 0, "block_m": 128, "block_n": 128}


class _Stream:
    cuda_stream = 0


class _Patches:
    """setattr with undo, as pytest's monkeypatch (which the test passes in instead)."""

    def __init__(self):
        self._undo = []
        self.on_undo = []  # called after the attributes are restored

    def setattr(self, target, name, value, raising=True):
        old = getattr(target, name, _MISSING)
        if old is _MISSING and raising:
            raise AttributeError(name)
        self._undo.append((target, name, old))
        setattr(target, name, value)

    def undo(self):
        for target, name, old in reversed(self._undo):
            if old is _MISSING:
                delattr(target, name)
            else:
                setattr(target, name, old)
        self._undo.clear()
        for fn in self.on_undo:
            fn()
        self.on_undo.clear()


_MISSING = object()


def stub_device(mp, capability=(9, 0), sm_count=132) -> dict[int, StubLibrary]:
    """Stand CPU in for CUDA in hopattn's call path (``mp``: a monkeypatch). Returns the stub libraries
    by stage number (their ``launches`` count the calls that reached the launch)."""
    libraries: dict[int, StubLibrary] = {}

    def library(number):
        if number not in libraries:
            libraries[number] = StubLibrary(number)
        return libraries[number]

    mp.setattr(contract, "DEVICE_TYPES", ("cuda", "meta", "cpu"))
    if hasattr(api, "DIRECT_DEVICE_TYPES"):  # the eager calls that skip the op's dispatch (as CUDA ones do)
        mp.setattr(api, "DIRECT_DEVICE_TYPES", ("cuda", "cpu"))
    mp.setattr(api, "_library", library)
    mp.setattr(api, "_device_capability", lambda device: (*capability, "stub device"))
    mp.setattr(api, "_sm_count", lambda device: sm_count)
    mp.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    mp.setattr(torch.cuda, "current_stream", lambda device=None: _Stream)
    # the raw CUDA calls a launch may use instead of torch.cuda's wrappers (a CPU build has none)
    mp.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 0, raising=False)
    mp.setattr(torch.cuda, "_exchange_device", lambda index: -1)
    mp.setattr(torch.cuda, "_maybe_exchange_device", lambda index: -1)
    if hasattr(api, "_reset_caches"):  # facts cached per device are read again through the stubs,
        api._reset_caches()  # and forgotten with them
        mp.on_undo.append(api._reset_caches)
    return libraries


def tensors(shape, device="cpu", layout="bshd"):
    """q, k, v as a model makes them: BSHD (a projection's output viewed as heads), or those views
    transposed to BHSD (what transformers' attention functions get)."""
    batch, heads, len_q, len_k, dim = shape
    q = torch.empty(batch, len_q, heads, dim, dtype=BF16, device=device)
    k = torch.empty(batch, len_k, heads, dim, dtype=BF16, device=device)
    v = torch.empty(batch, len_k, heads, dim, dtype=BF16, device=device)
    return (q, k, v) if layout == "bshd" else tuple(t.transpose(1, 2) for t in (q, k, v))


def time_per_call(fn, calls: int = 2000, repeats: int = 15) -> dict:
    """µs per call: the median over ``repeats`` batches of ``calls`` calls, with p10/p90 of the batches."""
    for _ in range(min(calls, 200)):
        fn()
    per_call = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter_ns() - t0) / calls / 1e3)
    per_call.sort()
    q = statistics.quantiles(per_call, n=10) if len(per_call) > 1 else per_call * 9
    return {"median_us": statistics.median(per_call), "p10_us": q[0], "p90_us": q[-1], "min_us": per_call[0]}


def _transformers_fn(kernel):
    from hopattn.integrations import transformers as hop_tf

    return hop_tf.make_attention_function(kernel, strict=False)


def _diffusers_fn(kernel):
    from hopattn.integrations import diffusers as hop_df

    return hop_df.make_backend(kernel, strict=False)


class _Module:  # what transformers' attention functions read of the module
    def __init__(self, is_causal: bool):
        self.is_causal = is_causal


def layers(shape=SHAPES["ltx2-self"], device="cpu") -> dict:
    """name -> a call of that layer on ``shape``, outermost last. Needs stub_device on CPU."""
    from hopattn.integrations import kernels, masks, routing

    q, k, v = tensors(shape, device)
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    stage = api._stage(None)
    op, op_default = torch.ops.hopattn.attention, torch.ops.hopattn.attention.default
    # the integrations' own device check (Kernel.devices) takes CPU too, or every call would fall back
    kernel = dataclasses.replace(kernels.hopattn_kernel(), devices=("cuda", device))
    batch, heads, len_q, len_k, _ = shape
    text_mask = torch.ones(batch, len_k, dtype=torch.bool, device=device)  # LTX-2's text mask: all ones
    out = torch.empty_like(q)
    out_args = (q, k, v, out, False, None, None, "bshd")
    tf, df = _transformers_fn(kernel), _diffusers_fn(kernel)
    module = _Module(is_causal=len_q <= len_k)  # a decoder's self-attention; cross-attention is not causal
    call = contract.check_call(q, k, v, causal=False, scale=None, stage=stage, layout="bshd", lineage=api._stages())

    def run_only():
        api._run(call, q, k, v, out)

    def routed_tracked():
        with routing.track():
            df(query=q, key=k, value=v)

    result = {
        "contract.check_call": lambda: contract.check_call(q, k, v, causal=False, scale=None, stage=stage,
                                                           layout="bshd", lineage=api._stages()),
        "api._run (memory checks, strides, launch args)": run_only,
        "op impl (check + alloc + _run, no dispatcher)": lambda: api._attention_op._init_fn(
            q, k, v, False, None, None, "bshd"),
        "torch.ops.hopattn.attention.default": lambda: op_default(q, k, v, False, None, None, "bshd"),
        "torch.ops.hopattn.attention (packet)": lambda: op(q, k, v, False, None, None, "bshd"),
        "torch.ops.hopattn.attention_out.default": lambda: torch.ops.hopattn.attention_out.default(*out_args),
        "hopattn.attention bshd": lambda: api.attention(q, k, v, layout="bshd"),
        "hopattn.attention bhsd view": lambda: api.attention(qh, kh, vh),
        "hopattn.attention out=": lambda: api.attention(q, k, v, layout="bshd", out=out),
        "kernel.unsupported": lambda: kernel.unsupported(qh, kh, vh, False),
        "masks.classify (cached)": lambda: masks.classify(text_mask, len_q, len_k),
        "transformers attention fn (no mask)": lambda: tf(module, qh, kh, vh, None),
        "diffusers backend (no mask)": lambda: df(query=q, key=k, value=v),
        "diffusers backend (all-ones text mask)": lambda: df(query=q, key=k, value=v, attn_mask=text_mask),
        "diffusers backend inside routing.track()": routed_tracked,
    }
    if not hasattr(api._attention_op, "_init_fn"):
        del result["op impl (check + alloc + _run, no dispatcher)"]
    return result


def measure(calls: int, repeats: int, shape_names=("ltx2-self",), only=None) -> dict:
    """{shape: {layer: stats}} on CPU with the device stubbed."""
    mp = _Patches()
    try:
        stub_device(mp)
        found = {}
        for name in shape_names:
            found[name] = {}
            for layer, fn in layers(SHAPES[name]).items():
                if only is None or layer in only:
                    found[name][layer] = time_per_call(fn, calls, repeats)
        return found
    finally:
        mp.undo()


def profile(calls: int = 20000, top: int = 25) -> str:
    """cProfile of ``calls`` eager hopattn.attention calls (BSHD, LTX-2 self), sorted by own time."""
    mp = _Patches()
    try:
        stub_device(mp)
        q, k, v = tensors(SHAPES["ltx2-self"])
        for _ in range(200):
            api.attention(q, k, v, layout="bshd")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            api.attention(q, k, v, layout="bshd")
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
        return text.getvalue()
    finally:
        mp.undo()


def pieces(calls: int = 20000) -> dict:
    """perf_counter_ns around the pieces of the eager op's implementation (µs per call, medians)."""
    mp = _Patches()
    try:
        stub_device(mp)
        q, k, v = tensors(SHAPES["ltx2-self"])
        stage, table = api._stage(None), api._stages()
        call = contract.check_call(q, k, v, causal=False, scale=None, stage=stage, layout="bshd", lineage=table)
        out = q.new_empty(q.shape)
        steps = {
            "api._stage(None)": lambda: api._stage(None),
            "contract.check_call": lambda: contract.check_call(q, k, v, causal=False, scale=None, stage=stage,
                                                               layout="bshd", lineage=table),
            "contract.check_memory": lambda: contract.check_memory(call, q, k, v, out),
            "output allocation (new_empty, CPU allocator)": lambda: api._new_out(q, call),
            "4x call.strides": lambda: [call.strides(t) for t in (q, k, v, out)],
            "4x data_ptr": lambda: [t.data_ptr() for t in (q, k, v, out)],
            "torch.is_grad_enabled + requires_grad x3": lambda: torch.is_grad_enabled() and any(
                t.requires_grad for t in (q, k, v)),
        }
        return {name: time_per_call(fn, calls // 10, 15)["median_us"] for name, fn in steps.items()}
    finally:
        mp.undo()


# --- GPU mode -------------------------------------------------------------------------------------

def _gpu_arms(q, k, v, kernel) -> dict:
    backend = _diffusers_fn(kernel)
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    return {"hopattn.attention bshd": lambda: api.attention(q, k, v, layout="bshd"),
            "torch.ops.hopattn.attention.default": lambda: torch.ops.hopattn.attention.default(
                q, k, v, False, None, None, "bshd"),
            "diffusers backend": lambda: backend(query=q, key=k, value=v),
            "sdpa (reference)": lambda: torch.nn.functional.scaled_dot_product_attention(qh, kh, vh)}


def gpu(calls: int = 1000) -> None:
    """Real calls on the GPU: host time per call against the kernel's (see the module's docstring)."""
    from hopattn.integrations import kernels
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    assert torch.cuda.is_available(), "--gpu needs a CUDA device"
    kernel = kernels.hopattn_kernel()
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  calls per point {calls}", flush=True)
    for name, shape in GPU_SHAPES.items():
        q, k, v = tensors(shape, "cuda")
        for t in (q, k, v):
            t.normal_()
        n = calls if shape[2] * shape[3] <= 1 << 20 else max(20, calls // 50)  # LTX-2's long calls: fewer
        arms = _gpu_arms(q, k, v, kernel)
        for arm, fn in arms.items():
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn()
            t1 = time.perf_counter_ns()
            torch.cuda.synchronize()
            t2 = time.perf_counter_ns()
            with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(n):
                    fn()
                torch.cuda.synchronize()
            # the GPU's own activity only (kernels, memsets), not the CPU-side rows that sum their children
            kernel_us = sum(e.time_range.elapsed_us() for e in prof.events()
                            if e.device_type == DeviceType.CUDA) / n
            host, wall = (t1 - t0) / n / 1e3, (t2 - t0) / n / 1e3
            bound = "host-bound" if host > kernel_us else "device-bound"
            print(f"{name:11s} {arm:38s} host {host:8.2f} µs/call  wall {wall:9.2f} µs/call  "
                  f"kernel {kernel_us:9.2f} µs/call  {bound}", flush=True)
        # the single call, CPU side only, the way LTX-2 sees it: one call after a sync, kernel not yet done
        times = []
        for _ in range(50):
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            api.attention(q, k, v, layout="bshd")
            times.append((time.perf_counter_ns() - t0) / 1e3)
        print(f"{name:11s} one call after a sync: host {statistics.median(times):.2f} µs (median of 50)", flush=True)
    torch.cuda.synchronize()


def gpu_profile(calls: int = 5000, top: int = 30) -> None:
    """Where a real call's host time goes (the audio shape, host-bound): perf_counter around the
    pieces of hopattn.attention's eager path with real CUDA tensors, a calibration (an empty torch op,
    SDPA), and a cProfile of ``calls`` calls sorted by own time."""
    assert torch.cuda.is_available(), "--gpu --profile needs a CUDA device"
    q, k, v = tensors(GPU_SHAPES["ltx2-audio"], "cuda")
    for t in (q, k, v):
        t.normal_()
    stage, table = api._stage(None), api._stages()
    call = contract.check_call(q, k, v, causal=False, scale=None, stage=stage, layout="bshd", lineage=table)
    out = api._new_out(q, call)
    lib = api._library(stage.number)
    index = q.device.index
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    steps = {
        "torch.empty_like(q) (calibration: one torch op)": lambda: torch.empty_like(q),
        "sdpa (calibration)": lambda: torch.nn.functional.scaled_dot_product_attention(qh, kh, vh),
        "api._plain_eager(q)": lambda: api._plain_eager(q),
        "contract.check_call (seen before)": lambda: contract.check_call(
            q, k, v, causal=False, scale=None, stage=stage, layout="bshd", lineage=table),
        "contract.check_memory (fresh out)": lambda: contract.check_memory(call, q, k, v, out, True),
        "api._new_out (CUDA caching allocator)": lambda: api._new_out(q, call),
        "4x call.strides": lambda: [call.strides(t) for t in (q, k, v, out)],
        "torch.cuda._exchange_device x2": lambda: torch.cuda._maybe_exchange_device(torch.cuda._exchange_device(index)),
        "torch._C._cuda_getCurrentRawStream": lambda: torch._C._cuda_getCurrentRawStream(index),
        "api._sm_count(device)": lambda: api._sm_count(q.device),
        "lib.launch alone (the binding and cudaLaunch)": lambda: lib.launch(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), call.strides(q), call.strides(k),
            call.strides(v), call.strides(out), call.batch, call.heads, call.len_q, call.len_k, call.head_dim,
            call.scale, call.causal, api._sm_count(q.device), torch._C._cuda_getCurrentRawStream(index),
            call.kv_heads, 0),
        "lib.launch_prepared (the prepared arguments, as api._run)": lambda: lib.launch_prepared(
            api._prepared(call, lib, q, k, v, out, api._sm_count(q.device)), q.data_ptr(), k.data_ptr(),
            v.data_ptr(), out.data_ptr(), 0, torch._C._cuda_getCurrentRawStream(index)),
        "api._run (fresh out)": lambda: api._run(call, q, k, v, out, fresh_out=True),
        "hopattn.attention bshd": lambda: api.attention(q, k, v, layout="bshd"),
        "torch.ops.hopattn.attention.default": lambda: torch.ops.hopattn.attention.default(
            q, k, v, False, None, None, "bshd"),
    }
    print(f"pieces on the GPU ({GPU_SHAPES['ltx2-audio']}, BSHD bf16), µs per call, median of 15 batches:")
    for name, fn in steps.items():
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        s = time_per_call(fn, 500, 15)
        torch.cuda.synchronize()
        print(f"  {name:50s} {s['median_us']:7.2f} µs  (p10 {s['p10_us']:.2f}, p90 {s['p90_us']:.2f})", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for i in range(calls):
        api.attention(q, k, v, layout="bshd")
        if i % 500 == 499:
            torch.cuda.synchronize()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    print(text.getvalue(), flush=True)


def _table(found: dict) -> str:
    lines = []
    for shape, rows in found.items():
        lines.append(f"{shape} {SHAPES[shape]} (B, H, Lq, Lk, D), BSHD bf16, device stubbed")
        for layer, s in rows.items():
            lines.append(f"  {layer:50s} {s['median_us']:7.2f} µs  (p10 {s['p10_us']:.2f}, p90 {s['p90_us']:.2f})")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true", help="real calls on the GPU")
    parser.add_argument("--profile", action="store_true", help="also a cProfile of hopattn.attention")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    if args.gpu:
        gpu(min(args.calls, 1000))
        if args.profile:
            gpu_profile()
        return
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, {args.calls} calls x {args.repeats}")
    print(_table(measure(args.calls, args.repeats, tuple(SHAPES))))
    print("pieces of the op's implementation (µs per call):")
    for name, us in pieces().items():
        print(f"  {name:50s} {us:7.2f} µs")
    if args.profile:
        print(profile())


if __name__ == "__main__":
    main()
