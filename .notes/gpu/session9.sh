#!/bin/bash
# Device call (session 3 of 2026-11-29): instruction-diet candidates for stage 18 — the consumer
# index made warp-uniform, tree reductions, one Q buffer, 144/160-key tiles (make_ablate.py).
export PYTHONPATH=kernels:. HOPATTN_BUILD_DIR=/tmp/hb
VARIANT_SHAPES="${3:-4,16,8192,0;2,16,16384,0;8,16,4096,0;4,16,8192,1}" timeout ${2:-420} python3 .notes/variants.py ${1:-s17,s18,ab_uni,ab_tree,ab_unitree,ab_q1,ab_n160,ab_uni_n160} > $OUT/diet.log 2>&1; cat $OUT/diet.log
