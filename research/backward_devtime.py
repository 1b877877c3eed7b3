"""Development timing loop for the backward (not the benchmark harness): the backward stages, their
deterministic mode, and the backward of cuDNN and FlashAttention-2 (torch SDPA) in one process, at
the issue's points (B·L = 32k tokens, 16 heads, head dim 128), causal and not. The backward alone:
each peer's forward runs once, outside the timed region, and its graph is kept (retain_graph).

    python3 research/backward_devtime.py [4096,8192,16384] [stages]
"""
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

LENGTHS = [4096, 8192, 16384] if len(sys.argv) < 2 else [int(x) for x in sys.argv[1].split(",")]
STAGES = [s.number for s in backward.stages()] if len(sys.argv) < 3 else [int(x) for x in sys.argv[2].split(",")]


def t(fn):
    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


for length in LENGTHS:
    for causal in (False, True):
        B, H = 32768 // length, 16
        gen = torch.Generator(device="cuda").manual_seed(length)
        q, k, v, dout = (torch.randn(B, H, length, 128, generator=gen, device="cuda").to(torch.bfloat16)
                         for _ in range(4))
        flops = 2.5 * 4 * B * H * length * length * 128 / (2 if causal else 1)
        rows = []
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            with sdpa_kernel(be):
                out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
                ms = t(partial(torch.autograd.grad, out, leaves, dout, retain_graph=True))
            rows.append((name, ms))
        out, lse = hopattn.attention(q, k, v, causal=causal, return_lse=True)
        for s in STAGES:
            for det in (False, True):
                ms = t(partial(backward.attention_backward, dout, q, k, v, out, lse, causal=causal,
                               deterministic=det, stage=s))
                info = backward.stage_info(s)
                rows.append((f"backward {s:02d}{' det' if det else ''} (regs {info['registers']})", ms))
        print(f"shape {B},{H},{length} {'causal' if causal else 'non-causal'}", flush=True)
        best = min(ms for name, ms in rows if name in ("cudnn", "fa2"))
        for name, ms in rows:
            print(f"  {name:32s} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s  {best / ms:5.3f}x best SDPA", flush=True)
