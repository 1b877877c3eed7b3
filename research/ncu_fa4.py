"""The final stage and FlashAttention-4 launched once each on the 8k shape, non-causal, for Nsight Compute:

    ncu --clock-control none -k regex:"attention_kernel|flash" --section SpeedOfLight ... python3 research/ncu_fa4.py

FA4 is warmed up (its JIT compile) outside the profiled range by the kernel filter: only kernels
whose names match are profiled, and FA4's first call compiles before it launches.
"""
import hopattn
import torch
from flash_attn.cute import flash_attn_func

B, H, L = 4, 16, 8192
q, k, v = (torch.randn(B, H, L, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
hopattn.attention(q, k, v)
torch.cuda.synchronize()
print(f"stage {hopattn.final_stage()} launched", flush=True)
qs, ks, vs = (x.transpose(1, 2).contiguous() for x in (q, k, v))
flash_attn_func(qs, ks, vs)
torch.cuda.synchronize()
print("fa4 launched", flush=True)
