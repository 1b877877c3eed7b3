#!/bin/bash
# Device session: staged stages 12-16 beside the lineage: GPU tests, persistent checks, timings,
# sanitizers on stage 16's split rings, and Nsight Compute on 10-16.
set -x
export PYTHONPATH=kernels:. HOPATTN_BUILD_DIR=/tmp/hb
for d in .notes/next/1*_*; do cp -r $d kernels/attention/; done
cp .notes/next/common/*.cuh kernels/attention/common/
python3 -m hopattn.build > $OUT/build.log 2>&1; tail -3 $OUT/build.log
timeout 150 python3 -m pytest -x -q tests/test_kernels_gpu.py -k "consumers or warp or pingpong or overlap or persistent or store or shape" > $OUT/gputests.log 2>&1; tail -6 $OUT/gputests.log
timeout 60 python3 .notes/next/checks/gpu_persistent.py 14 15 16 > $OUT/persistent.log 2>&1; cat $OUT/persistent.log
for shape in 4,16,8192 8,16,4096 2,16,16384; do timeout 60 python3 .notes/devtime.py $shape 10,11,12,13,14,15,16 > $OUT/devtime_$shape.log 2>&1; cat $OUT/devtime_$shape.log; done
SANITIZE_KV_TILES=8 SANITIZE_HEADS=40 timeout 60 compute-sanitizer --tool racecheck python3 .notes/sanitize.py 16 > $OUT/race16.log 2>&1; tail -4 $OUT/race16.log
SANITIZE_KV_TILES=8 SANITIZE_HEADS=40 timeout 40 compute-sanitizer --tool synccheck python3 .notes/sanitize.py 16 > $OUT/sync16.log 2>&1; tail -3 $OUT/sync16.log
timeout 150 ncu --clock-control none -k attention_kernel --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy python3 .notes/ncu_once.py 10 11 12 13 15 16 > $OUT/ncu.txt 2>&1; grep -E "stage|Duration|Compute \(SM\) Thr|Issue Slots Busy|Warp Cycles Per Issued|Shared|Stall" $OUT/ncu.txt | head -80
