#!/bin/bash
# Session 12 (2026-11-29, fourth session): the loop's instruction diet (HOIST_DESC, NO_RING,
# UNIFORM_CONSUMER) against stage 17/18 in one process, three rounds; then ncu on the cluster
# experiment against its CLUSTER = 1 build (does it halve the L2 bytes? what grid did it get?).
export PYTHONPATH=kernels:. HOPATTN_BUILD_DIR=/tmp/hb
VARIANT_ROUNDS=3 VARIANT_SHAPES="4,16,8192,0;8,16,4096,0;2,16,16384,0;4,16,8192,1" \
  timeout 300 python3 .notes/variants.py ${1:-s17,s18,ab_no_ring,ab_hoist,ab_hoist_nr,ab_hoist_nr_uni,ab_hoist_nr_uni_l2n,cluster,cluster1} > $OUT/diet.log 2>&1
tail -5 $OUT/diet.log
cat > /tmp/ncu_cluster.py <<'PY'
import math, torch
from hopattn import api
B, H, L = 4, 16, 8192
q, k, v = (torch.randn(B, H, L, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
o = torch.empty_like(q)
st = (H * L * 128, L * 128, 128)
for name in ("cluster", "cluster1"):
    lib = api._native().StageLibrary(f"/tmp/variants/{name}/lib.so")
    lib.launch(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), st, st, st, st, B, H, L, L, 128,
               1 / math.sqrt(128), False, 132, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
PY
timeout 200 ncu --kernel-name regex:attention_kernel --metrics lts__t_bytes.sum,sm__cycles_elapsed.avg,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,launch__grid_size,launch__cluster_dim_x,dram__bytes_read.sum \
  python3 /tmp/ncu_cluster.py > $OUT/ncu_cluster.txt 2>&1
grep -E "attention_kernel|lts__t|cycles_elapsed|inst_exec|hmma|grid_size|cluster_dim|dram|stalled" $OUT/ncu_cluster.txt | cut -c1-130
