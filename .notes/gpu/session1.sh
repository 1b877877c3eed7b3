#!/bin/bash
# Device session: staged stages 12-15 tested beside the lineage, sanitizers, dev timings.
set -x
export PYTHONPATH=kernels:. HOPATTN_BUILD_DIR=/tmp/hb
for d in .notes/next/1*_*; do cp -r $d kernels/attention/; done
cp .notes/next/common/*.cuh kernels/attention/common/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv > $OUT/smi.txt
time python3 -m hopattn.build > $OUT/build.log 2>&1; tail -5 $OUT/build.log
timeout 170 python3 -m pytest -x -q tests/test_kernels_gpu.py -k "10_ or 11_ or 12_ or 13_ or 14_ or 15_" > $OUT/gputests.log 2>&1; tail -15 $OUT/gputests.log
timeout 60 python3 .notes/next/checks/gpu_persistent.py 14 15 > $OUT/persistent.log 2>&1; tail -15 $OUT/persistent.log
timeout 80 python3 .notes/devtime.py 4,16,8192 9,10,11,12,13,14,15 > $OUT/devtime8k.log 2>&1; cat $OUT/devtime8k.log
SANITIZE_KV_TILES=8 timeout 90 compute-sanitizer --tool racecheck python3 .notes/sanitize.py 11 12 13 > $OUT/race.log 2>&1; tail -12 $OUT/race.log
SANITIZE_KV_TILES=8 SANITIZE_HEADS=40 timeout 90 compute-sanitizer --tool racecheck python3 .notes/sanitize.py 14 15 > $OUT/race_p.log 2>&1; tail -12 $OUT/race_p.log
SANITIZE_KV_TILES=8 timeout 50 compute-sanitizer --tool synccheck python3 .notes/sanitize.py 11 12 13 14 15 > $OUT/sync.log 2>&1; tail -8 $OUT/sync.log
SANITIZE_KV_TILES=8 timeout 50 compute-sanitizer --tool memcheck python3 .notes/sanitize.py 7 8 9 10 11 12 13 14 15 > $OUT/mem.log 2>&1; tail -8 $OUT/mem.log
