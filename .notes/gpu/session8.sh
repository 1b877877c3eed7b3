#!/bin/bash
# Device call B, right after call A (the machine keeps /opt/fa4): FA4's second half, then the
# Usage: bash .notes/gpu/session8.sh <full 40-digit commit of the tree>
# harness for stages 16-18 with both peers (7 rounds), and ncu of stage 18 next to FA4 at 8k.
test -f /opt/fa4/cu13.tar.xz.00 || exit 3
cat /opt/fa4/cu13.tar.xz.00 .fa4b/cu13.tar.xz.01 | python3 -c "import sys,tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall('/opt/fa4')" && python3 -c "import zipfile,glob; [zipfile.ZipFile(w).extractall('/opt/fa4') for w in glob.glob('.fa4b/*.whl')]"
export PYTHONPATH=kernels:.:/opt/fa4:/opt/fa4/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH HOPATTN_BUILD_DIR=/tmp/hb HOPATTN_GIT_COMMIT=$1 HOPATTN_GIT_DIRTY=0
mkdir -p /tmp/hr && cp bench/results/nvidia-h200.json /tmp/hr/
timeout 330 python3 -m bench --stages 16-18 --peers fa4,cudnn --reps 7 --causal both --out /tmp/hr/nvidia-h200.json --raw $OUT/raw.json > $OUT/bench.log 2>&1; cp /tmp/hr/nvidia-h200.json $OUT/; tail -30 $OUT/bench.log
timeout 200 ncu --clock-control none -k regex:"attention_kernel|flash" --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section InstructionStats python3 .notes/ncu_fa4.py > $OUT/ncu.txt 2>&1; grep -E "==PROF==|Duration|Compute \(SM\) Thr|Issue Slots Busy|Warp Cycles Per Issued|Stall|SM Frequency" $OUT/ncu.txt | head -60
