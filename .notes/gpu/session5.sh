#!/bin/bash
# Device session: stages 17/18 with the uniform-branch fix; racecheck details for 18.
set -x
export PYTHONPATH=kernels:. HOPATTN_BUILD_DIR=/tmp/hb
for d in .notes/next/1*_*; do cp -r $d kernels/attention/; done
cp .notes/next/common/*.cuh kernels/attention/common/
python3 -m hopattn.build > $OUT/build.log 2>&1; tail -2 $OUT/build.log
timeout 200 python3 -m pytest -x -q tests/test_kernels_gpu.py tests/test_contract_gpu.py -k "17 or 18 or contract" > $OUT/gputests.log 2>&1; tail -5 $OUT/gputests.log
for shape in 4,16,8192 8,16,4096 2,16,16384; do n=$(echo $shape | tr , _); timeout 60 python3 .notes/devtime.py $shape 16,17,18 > $OUT/devtime_$n.log 2>&1; cat $OUT/devtime_$n.log; timeout 60 python3 .notes/devtime.py $shape 17,18 causal > $OUT/devtime_causal_$n.log 2>&1; cat $OUT/devtime_causal_$n.log; done
timeout 90 compute-sanitizer --tool racecheck --racecheck-report all python3 .notes/sanitize_contract.py 17 18 > $OUT/race.log 2>&1; grep -v "^=========     \(Saved\|Host\)" $OUT/race.log | head -60
