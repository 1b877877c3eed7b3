"""Run stages on a small shape, for compute-sanitizer (racecheck / memcheck / synccheck).

    compute-sanitizer --tool racecheck python3 .notes/sanitize.py 7 8
"""
import sys

import torch

import hopattn

for stage in [int(s) for s in sys.argv[1:]] or [hopattn.final_stage()]:
    s = hopattn.stages()[stage - 1]
    q, k, v = (torch.randn(1, 2, 2 * s.block_m, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    k, v = k[:, :, : 3 * s.block_n].contiguous(), v[:, :, : 3 * s.block_n].contiguous()
    out = hopattn.attention(q, k, v, stage=stage)
    torch.cuda.synchronize()
    # Plain matmul + softmax, not SDPA: a sanitizer run must launch no kernels but ours and cuBLAS's.
    ref = torch.softmax((q.float() @ k.float().transpose(-1, -2)) / 128**0.5, dim=-1) @ v.float()
    print(f"stage {stage:02d}: rel err {((out.float() - ref).norm() / ref.norm()).item():.2e}", flush=True)
