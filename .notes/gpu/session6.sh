#!/bin/bash
# Device session: stage 18 scheduler variants (head groups, dynamic vs static, snake); racecheck of 18 in detail.
export PYTHONPATH=kernels:. HOPATTN_BUILD_DIR=/tmp/hb
for d in .notes/next/1*_*; do cp -r $d kernels/attention/; done
cp .notes/next/common/*.cuh kernels/attention/common/
VARIANT_SHAPES="4,16,8192,0;4,16,8192,1;8,16,4096,1;2,16,16384,1;2,16,16384,0" timeout 300 python3 .notes/variants.py s16,s17,s18,s18_g8,s18_g96,s18_lpt,s18_static,s18_snake,s18_snake_g8 > $OUT/variants.log 2>&1; cat $OUT/variants.log
timeout 100 compute-sanitizer --tool racecheck --print-limit 3 python3 .notes/sanitize_contract.py 18 > $OUT/race18.log 2>&1; grep -v "Host Frame" $OUT/race18.log | head -40
