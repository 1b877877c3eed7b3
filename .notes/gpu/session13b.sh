#!/bin/bash
# Device call B (session 4 of 2026-11-29), right after session13a.sh: FA4's second half, the full
# harness run (all stages, both masks), then ncu stall reasons for the final stage and FA4 at 8k
# non-causal. Usage: bash .notes/gpu/session13b.sh <full 40-digit commit>
test -f /opt/fa4/cu13.tar.xz.00 || exit 3
cat /opt/fa4/cu13.tar.xz.00 .fa4b/cu13.tar.xz.01 | python3 -c "import sys,tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall('/opt/fa4')" && python3 -c "import zipfile,glob; [zipfile.ZipFile(w).extractall('/opt/fa4') for w in glob.glob('.fa4b/*.whl')]"
export PYTHONPATH=kernels:.:/opt/fa4:/opt/fa4/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH HOPATTN_BUILD_DIR=/tmp/hb HOPATTN_GIT_COMMIT=$1 HOPATTN_GIT_DIRTY=0
mkdir -p /tmp/hr && cp bench/results/nvidia-h200.json /tmp/hr/
timeout 400 python3 -m bench --causal both --out /tmp/hr/nvidia-h200.json --raw $OUT/raw.json > $OUT/bench.log 2>&1; cp /tmp/hr/nvidia-h200.json $OUT/; tail -12 $OUT/bench.log
timeout 120 ncu --clock-control none -k regex:"attention_kernel|flash" --metrics regex:"smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio",sm__cycles_elapsed.avg,smsp__inst_executed.sum,lts__t_bytes.sum python3 .notes/ncu_fa4.py > $OUT/ncu_stalls.txt 2>&1; grep -E "==PROF==|stalled|cycles_elapsed|inst_executed|lts__t_bytes" $OUT/ncu_stalls.txt | grep -v " 0$" | head -70
