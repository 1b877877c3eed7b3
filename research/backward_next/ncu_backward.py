"""Each given backward stage launched once on the 8k non-causal shape (B 4, H 16, head dim 128), for
Nsight Compute; the kernel filter keeps the preprocess and the dQ conversion out:

    ncu --clock-control none -k regex:dkdv_kernel --section SpeedOfLight --section WarpStateStats \
        --section SchedulerStats --section ComputeWorkloadAnalysis python3 research/backward_next/ncu_backward.py 7 8

What it is for: the trace records when a consumer issues a wgmma and when it sees one retired, not
when the tensor pipe executes; ncu's tensor-pipe activity and the warps' stall reasons say whether
the pipe is busy and slow or idle between the consumers' CUDA-core work.
"""
import sys

import hopattn
import torch
from hopattn import backward

B, H, L = 4, 16, 8192
gen = torch.Generator(device="cuda").manual_seed(8192)
q, k, v, dout = (torch.randn(B, H, L, 128, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(4))
out, lse = hopattn.attention(q, k, v, return_lse=True)
for stage in [int(s) for s in sys.argv[1:]]:
    backward.attention_backward(dout, q, k, v, out, lse, stage=stage)
    torch.cuda.synchronize()
    print(f"backward stage {stage:02d} launched", flush=True)
