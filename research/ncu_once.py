"""Launch each given stage once on one shape, for Nsight Compute:

    ncu --clock-control none -k attention_kernel --section SpeedOfLight ... python3 research/ncu_once.py 10 11
"""
import sys

import hopattn
import torch

B, H, L = 4, 16, 4096
q, k, v = (torch.randn(B, H, L, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for stage in [int(s) for s in sys.argv[1:]]:
    hopattn.attention(q, k, v, stage=stage)
    torch.cuda.synchronize()
    print(f"stage {stage:02d} launched", flush=True)
