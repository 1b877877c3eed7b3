"""Shapes that exercise masks, tails and layouts, for compute-sanitizer (stage 17 on):

    compute-sanitizer --tool racecheck python3 research/sanitize_contract.py 17
"""
import sys

import hopattn
import torch

SHAPES = [  # (batch, heads, len_q, len_k, causal, layout)
    (1, 3, 1000, 300, True, "bhsd"),   # rows that see no key, CTAs with nothing but zero rows
    (1, 2, 777, 1029, True, "bshd"),   # tails on both sides, the diagonal across two K/V tiles
    (2, 40, 200, 1100, False, "bhsd"),  # 160 output tiles (CTAs run two), 9 K/V tiles each, the last one a tail
    (1, 70, 300, 700, True, "bshd"),    # 210 output tiles: CTAs run several
]
for stage in [int(s) for s in sys.argv[1:]]:
    for b, h, lq, lk, causal, layout in SHAPES:
        shape_q, shape_k = ((b, h, lq, 128), (b, h, lk, 128)) if layout == "bhsd" else ((b, lq, h, 128), (b, lk, h, 128))
        q = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(shape_k, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        out = hopattn.attention(q, k, v, causal=causal, stage=stage, layout=layout)
        torch.cuda.synchronize()
        print(f"stage {stage:02d} {(b, h, lq, lk, causal, layout)}: finite {bool(out.isfinite().all())}", flush=True)
