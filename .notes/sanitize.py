"""Run stages on a small shape, for compute-sanitizer (racecheck / memcheck / synccheck).

    compute-sanitizer --tool racecheck python3 .notes/sanitize.py 7 8

SANITIZE_KV_TILES (default 3) sets len_k in K/V tiles: a ring of depth d needs more than d tiles
before its empty barriers and phase flips are exercised. SANITIZE_HEADS (default 2) sets the head
count: a persistent kernel needs more output tiles than SMs before a CTA runs a second tile.
"""
import os
import sys

import torch

import hopattn

kv_tiles = int(os.environ.get("SANITIZE_KV_TILES", "3"))
heads = int(os.environ.get("SANITIZE_HEADS", "2"))
for stage in [int(s) for s in sys.argv[1:]] or [hopattn.final_stage()]:
    s = hopattn.stages()[stage - 1]
    q, k, v = (torch.randn(1, heads, max(2, kv_tiles) * s.block_m, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    k, v = k[:, :, : kv_tiles * s.block_n].contiguous(), v[:, :, : kv_tiles * s.block_n].contiguous()
    out = hopattn.attention(q, k, v, stage=stage)
    torch.cuda.synchronize()
    # Plain matmul + softmax, not SDPA: a sanitizer run must launch no kernels but ours and cuBLAS's.
    ref = torch.softmax((q.float() @ k.float().transpose(-1, -2)) / 128**0.5, dim=-1) @ v.float()
    print(f"stage {stage:02d}: rel err {((out.float() - ref).norm() / ref.norm()).item():.2e}", flush=True)
