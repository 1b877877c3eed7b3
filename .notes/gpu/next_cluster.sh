#!/bin/bash
# For the next device session: the cluster experiment (make_cluster.py) — correctness on shapes
# with phantom q-blocks and tails, timing against stage 18 in one process, then racecheck and
# memcheck on a small shape. A hang is the likeliest failure: every step has its own timeout.
export PYTHONPATH=kernels:. HOPATTN_BUILD_DIR=/tmp/hb
VARIANT_SHAPES="1,3,1152,0;1,3,1000,0;2,40,200,0;4,16,8192,0;2,16,16384,0;8,16,4096,0;4,16,8192,1" \
  timeout 150 python3 .notes/variants.py s17,s18,ab_no_ring,cluster1,cluster > $OUT/cluster.log 2>&1; cat $OUT/cluster.log
# One launch of the variant on a small odd shape under the sanitizers (the .so the run above built).
cat > /tmp/one_cluster.py <<'PY'
import math, torch
from hopattn import api
lib = api._native().StageLibrary("/tmp/variants/cluster/lib.so")
B, H, L = 1, 3, 1152
q, k, v = (torch.randn(B, H, L, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
o = torch.full_like(q, float("nan"))
st = (H * L * 128, L * 128, 128)
lib.launch(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), st, st, st, st, B, H, L, L, 128,
           1 / math.sqrt(128), False, 132, torch.cuda.current_stream().cuda_stream)
torch.cuda.synchronize()
ref = torch.softmax((q.float() @ k.float().transpose(-1, -2)) / 128**0.5, dim=-1) @ v.float()
print("rel err", ((o.float() - ref).norm() / ref.norm()).item())
PY
for tool in racecheck memcheck synccheck; do
  timeout 120 compute-sanitizer --tool $tool python3 /tmp/one_cluster.py > $OUT/san_cluster_$tool.log 2>&1; tail -2 $OUT/san_cluster_$tool.log
done
