#!/bin/bash
# Device session: staged stage 17 (masks) beside the lineage: GPU tests (spec, float64, contract),
# sanitizers on causal and ragged shapes, dev timings causal and not.
set -x
export PYTHONPATH=kernels:. HOPATTN_BUILD_DIR=/tmp/hb
for d in .notes/next/1*_*; do cp -r $d kernels/attention/; done
cp .notes/next/common/*.cuh kernels/attention/common/
python3 -m hopattn.build > $OUT/build.log 2>&1; tail -3 $OUT/build.log
timeout 240 python3 -m pytest -x -q tests/test_kernels_gpu.py tests/test_contract_gpu.py -k "17 or contract" > $OUT/gputests.log 2>&1; tail -30 $OUT/gputests.log
for shape in 4,16,8192 8,16,4096 2,16,16384; do timeout 60 python3 .notes/devtime.py $shape 16,17 > $OUT/devtime_$(echo $shape | tr , _).log 2>&1; cat $OUT/devtime_$(echo $shape | tr , _).log; timeout 60 python3 .notes/devtime.py $shape 17 causal > $OUT/devtime_causal_$(echo $shape | tr , _).log 2>&1; cat $OUT/devtime_causal_$(echo $shape | tr , _).log; done
timeout 90 compute-sanitizer --tool racecheck python3 .notes/sanitize_contract.py 17 > $OUT/race17.log 2>&1; tail -8 $OUT/race17.log
timeout 60 compute-sanitizer --tool memcheck python3 .notes/sanitize_contract.py 17 > $OUT/mem17.log 2>&1; tail -8 $OUT/mem17.log
timeout 60 compute-sanitizer --tool synccheck python3 .notes/sanitize_contract.py 17 > $OUT/sync17.log 2>&1; tail -4 $OUT/sync17.log
