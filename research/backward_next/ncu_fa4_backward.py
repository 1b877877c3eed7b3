"""FlashAttention-4's Hopper backward launched for Nsight Compute on the shapes stage 08's ncu run used
(B 4, H 16, 8k, head dim 128, bf16, BSHD), non-causal then causal, after a warm-up that JIT-compiles
it outside the profile (ncu's -k filter and --launch-skip keep the warm-up out):

    ncu --clock-control none -k regex:"FlashAttentionBackward|bwd" --launch-skip 0 --set full \
        -o fa4-bwd python3 research/backward_next/ncu_fa4_backward.py

What it is for: FA4's sm90 backward has stage 08's tiles (128 keys a CTA, 64 x 64 Sᵀ and dPᵀ a
warpgroup, dQ through a bulk reduce-add; 80 queries a step without a mask) and runs 14–15 % faster at
the same tile causally. Its instruction count, tensor-pipe activity, shared-memory wavefronts and
stall reasons beside 08's (bench/logs/ncu-backward-07-08-nvidia-h200-20261202T2124.txt) say where.
"""
import sys

import torch
from flash_attn.cute import flash_attn_func

B, H, L = 4, 16, 8192
gen = torch.Generator(device="cuda").manual_seed(8192)
q, k, v, dout = (torch.randn(B, L, H, 128, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(4))
for causal in (False, True):
    qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    for _ in range(3 if "--warm" in sys.argv else 2):  # the first call compiles (cute DSL JIT)
        out = flash_attn_func(qq, kk, vv, causal=causal)
        out = out[0] if isinstance(out, tuple) else out
        torch.autograd.grad(out, (qq, kk, vv), dout)
        torch.cuda.synchronize()
    print(f"fa4 backward causal={causal} done", flush=True)
