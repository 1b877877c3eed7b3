"""LTX-2's two served shapes (BSHD, head dim 128) timed every way, one call at a time (CUDA events,
no L2 flush), and the kernel alone under the profiler: where stage 20's 0.963x per step goes (GPU).

    PYTHONPATH=kernels python research/ltx2_shapes.py

The difference between a call's event time and its kernel's time is host time in the call (the
GPU waits for the launch). Stage 20's notes ("In real models") quote a run of it.
"""

import statistics
from functools import partial

import hopattn
import torch
from hopattn.records import runs
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

SHAPES = [(1, 32, 6144, 6144), (1, 32, 6144, 1024), (4, 16, 8192, 8192)]  # LTX-2 video self, text cross; 8k


def median_ms(fn, n=20):
    for _ in range(3):
        fn()
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    for batch, heads, len_q, len_k in SHAPES:
        q = torch.randn(batch, len_q, heads, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(batch, len_k, heads, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
        gflop = 4 * batch * heads * len_q * len_k * 128 / 1e9
        tag = f"{batch},{heads},{len_q},{len_k}"
        # each arm a call on this shape's tensors, bound now (not the loop's variables)
        arms = {"hopattn bshd": partial(hopattn.attention, q, k, v, layout="bshd"),
                "hopattn bhsd view": partial(hopattn.attention, qh, kh, vh),
                "sdpa default": partial(sdpa, qh, kh, vh)}
        for name, fn in arms.items():
            ms = median_ms(fn)
            print(f"{tag} {name:18s} {ms:7.3f} ms {gflop / ms:6.1f} TFLOP/s", flush=True)
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
            with sdpa_kernel([backend]):
                ms = median_ms(partial(sdpa, qh, kh, vh))
            print(f"{tag} sdpa {backend.name:13s} {ms:7.3f} ms {gflop / ms:6.1f} TFLOP/s", flush=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            hopattn.attention(q, k, v, layout="bshd")
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=5), flush=True)


if __name__ == "__main__":
    print(runs.log_header(runs.script_command()), flush=True)  # first: a log kept under bench/logs says what made it
    main()
