#!/bin/bash
# Device call A (session 4 of 2026-11-29): stage 18 without the tile-id ring on non-causal launches
# and stage 19 (descriptor offsets): every stage built, all GPU tests, racecheck on the contract
# shapes for 18 and 19, synccheck and memcheck for 19. Carries .fa4a (half of FA4) for call B.
mkdir -p /opt/fa4 && cp .fa4a/cu13.tar.xz.00 /opt/fa4/
export PYTHONPATH=kernels:. HOPATTN_BUILD_DIR=/tmp/hb
python3 -m hopattn.build > $OUT/build.log 2>&1; tail -n 2 $OUT/build.log
timeout 200 python3 -m pytest -q tests/test_kernels_gpu.py tests/test_contract_gpu.py tests/test_bench_gpu.py > $OUT/gputests.log 2>&1; tail -n 3 $OUT/gputests.log
for s in 18 19; do
  timeout 90 compute-sanitizer --tool racecheck python3 .notes/sanitize_contract.py $s > $OUT/race$s.log 2>&1; tail -n 1 $OUT/race$s.log
done
(timeout 60 compute-sanitizer --tool synccheck python3 .notes/sanitize_contract.py 19; timeout 60 compute-sanitizer --tool memcheck python3 .notes/sanitize_contract.py 19) > $OUT/san19.log 2>&1; grep -E "ERROR SUMMARY" $OUT/san19.log
