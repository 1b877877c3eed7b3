#!/bin/bash
# Device call A (session 3 of 2026-11-29): stage 18 with the compile-time schedule — GPU tests,
# racecheck/synccheck/memcheck on the contract shapes; stage 16's missing memcheck and many-tile
# check; the ablations of stage 18 (make_ablate.py). Carries .fa4a (half of FA4) for call B.
mkdir -p /opt/fa4 && cp .fa4a/cu13.tar.xz.00 /opt/fa4/
export PYTHONPATH=kernels:. HOPATTN_BUILD_DIR=/tmp/hb
python3 -m hopattn.build 13 16-18 > $OUT/build.log 2>&1; tail -2 $OUT/build.log
timeout 150 python3 -m pytest -q -x tests/test_kernels_gpu.py tests/test_contract_gpu.py -k "18 or 16" > $OUT/gputests.log 2>&1; tail -3 $OUT/gputests.log
VARIANT_SHAPES="4,16,8192,0;8,16,4096,0;2,16,16384,0;4,16,8192,1" timeout 240 python3 .notes/variants.py s17,s18,ab_none,ab_softmax,ab_exp,ab_pingpong,ab_kv_loads,ab_q1,ab_n144,ab_n160 > $OUT/ablations.log 2>&1; cat $OUT/ablations.log
timeout 90 compute-sanitizer --tool racecheck python3 .notes/sanitize_contract.py 18 > $OUT/race18.log 2>&1; tail -3 $OUT/race18.log
(timeout 60 compute-sanitizer --tool synccheck python3 .notes/sanitize_contract.py 18; timeout 60 compute-sanitizer --tool memcheck python3 .notes/sanitize_contract.py 18) > $OUT/san18.log 2>&1; grep -E "ERROR SUMMARY|RACECHECK" $OUT/san18.log
SANITIZE_HEADS=280 timeout 90 compute-sanitizer --tool memcheck python3 .notes/sanitize.py 16 > $OUT/san16.log 2>&1; tail -2 $OUT/san16.log
timeout 60 python3 .notes/next/checks/gpu_persistent.py 16 > $OUT/persistent16.log 2>&1; tail -8 $OUT/persistent16.log
