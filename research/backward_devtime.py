"""Development timing loop for the backward (not the benchmark harness): the backward stages, their
deterministic mode, and the backward of cuDNN and FlashAttention-2 (torch SDPA) in one process, at
the issue's points (B·L = 32k tokens, 16 heads, head dim 128), causal and not. The backward alone:
each peer's forward runs once, outside the timed region, and its graph is kept (retain_graph).
A point may name its batch and heads, LENGTH:BxHxHKV (8192:1x32x8 is Llama-3.1-8B's attention at
8k: grouped heads, which SDPA gets with enable_gqa=True).

    python3 research/backward_devtime.py [4096,8192,16384] [stages]
"""
import contextlib
import sys
from functools import partial

import hopattn
import torch
import torch.nn.functional as F
import triton
from hopattn import backward
from hopattn.records import runs
from torch.nn.attention import SDPBackend, sdpa_kernel

print(runs.log_header(runs.script_command()), flush=True)

POINTS = ["4096", "8192", "16384"] if len(sys.argv) < 2 else sys.argv[1].split(",")
STAGES = [s.number for s in backward.stages()] if len(sys.argv) < 3 else [int(x) for x in sys.argv[2].split(",")]


def t(fn):
    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def point(text: str) -> tuple[int, int, int, int]:
    """LENGTH or LENGTH:BxHxHKV -> (length, batch, heads, kv_heads)."""
    length, _, shape = text.partition(":")
    if not shape:
        return int(length), 32768 // int(length), 16, 16
    b, h, hkv = (int(x) for x in shape.split("x"))
    return int(length), b, h, hkv


for length, B, H, HKV in map(point, POINTS):
    for causal in (False, True):
        gen = torch.Generator(device="cuda").manual_seed(length)
        q, dout = (torch.randn(B, H, length, 128, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(B, HKV, length, 128, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
        flops = 2.5 * 4 * B * H * length * length * 128 / (2 if causal else 1)
        rows = []
        peers = (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION))
        for name, be in peers + ((("sdpa", None),) if HKV != H else ()):  # grouped: also SDPA's own choice
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            try:
                with sdpa_kernel(be) if be is not None else contextlib.nullcontext():
                    out = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=HKV != H)
                    ms = t(partial(torch.autograd.grad, out, leaves, dout, retain_graph=True))
            except RuntimeError as err:  # a backend that does not take the grouped heads
                print(f"  {name}: {str(err).splitlines()[0][:160]}", flush=True)
                continue
            rows.append((name, ms))
        out, lse = hopattn.attention(q, k, v, causal=causal, return_lse=True)
        for s in STAGES:
            for det in (False, True):
                ms = t(partial(backward.attention_backward, dout, q, k, v, out, lse, causal=causal,
                               deterministic=det, stage=s))
                info = backward.stage_info(s)
                rows.append((f"backward {s:02d}{' det' if det else ''} (regs {info['registers']})", ms))
        print(f"shape {B},{H}{f'/{HKV}' if HKV != H else ''},{length} {'causal' if causal else 'non-causal'}",
              flush=True)
        best = min((ms for name, ms in rows if name in ("cudnn", "fa2", "sdpa")), default=float("nan"))
        for name, ms in rows:
            print(f"  {name:32s} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s  {best / ms:5.3f}x best SDPA", flush=True)
