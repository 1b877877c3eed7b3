"""Development timing loop (not the benchmark harness): one shape, every stage, two SDPA peers.

    python3 research/devtime.py 4,16,8192 [stages] [causal]
"""
import sys
from functools import partial

import hopattn
import torch
import torch.nn.functional as F
import triton
from hopattn.records import runs
from torch.nn.attention import SDPBackend, sdpa_kernel

print(runs.log_header(runs.script_command()), flush=True)  # first: a log kept under bench/logs says what made it

B, H, L = (4, 16, 8192) if len(sys.argv) < 2 else map(int, sys.argv[1].split(","))
stages = [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else [s.number for s in hopattn.stages()]
causal = len(sys.argv) > 3 and sys.argv[3] == "causal"
q, k, v = (torch.randn(B, H, L, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
flops = 4 * B * H * L * L * 128 / (2 if causal else 1)


def t(fn):
    return triton.testing.do_bench(fn, warmup=100, rep=500, return_mode="median")


rows = []
for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
    with sdpa_kernel(be):
        ms = t(partial(F.scaled_dot_product_attention, q, k, v, is_causal=causal))
    rows.append((name, ms))
for s in stages:
    if causal and not hopattn.stages()[s - 1].causal:
        continue
    ms = t(partial(hopattn.attention, q, k, v, stage=s, causal=causal))  # this stage, bound now
    info = hopattn.stage_info(s)
    rows.append((f"stage {s:02d} (regs {info['registers']})", ms))
print(f"shape {B},{H},{L} {'causal' if causal else 'non-causal'}")
for name, ms in rows:
    print(f"{name:28s} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s")
