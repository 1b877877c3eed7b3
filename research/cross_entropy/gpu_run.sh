#!/usr/bin/env bash
# One GPU run of the cross-entropy draft (Part II, issue #30): copy the stages into kernels/cross_entropy/
# (where they will land; the draft's headers find kernels/rmsnorm/common from either place), build them
# and their binding, run the GPU tests under the watchdog, then the benchmark (fused forward, forward,
# backward) against the copy ceiling, eager, torch.compile, Liger and QuACK. Under 5 minutes on an
# H200 (the steps' limits add up to 285 s). Everything it wrote is packed into ONE tarball under $OUT
# (or build/ without $OUT): the logs, the GPU cases' log, the bench records and the ptxas logs.
#
#   PYTHONPATH=$PWD/kernels:$PWD bash research/cross_entropy/gpu_run.sh      # from the repository root
#
# The copy under kernels/cross_entropy/ is not committed by this script: once the tests pass, the
# draft joins by git mv (research/cross_entropy/README.md). The exit status is the first failing step's.
set -uo pipefail
[ -f /opt/peers/unpack.sh ] && source /opt/peers/unpack.sh
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '-'))" 2>/dev/null || echo unknown-gpu)
stamp=$(date -u +%Y%m%dT%H%M)
logs=bench/logs
out=${OUT:-build}
mkdir -p "$logs" build "$out"
status=0
step() {  # step NAME SECONDS COMMAND...: run under a time limit, log to bench/logs, keep the first failure
    local name=$1 limit=$2; shift 2
    local log="$logs/cross_entropy-$name-$gpu-$stamp.log"
    echo "== $name (limit ${limit} s): $*" | tee "$log"
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc" | tee -a "$log"
    [ "$status" -eq 0 ] && [ "$rc" -ne 0 ] && status=$rc
}
if [ -e kernels/cross_entropy ] && [ ! -f kernels/cross_entropy/.draft-copy ]; then
    echo "kernels/cross_entropy exists and is not this script's copy: the lineage has landed; run its own steps" >&2
    exit 2
fi
rm -rf kernels/cross_entropy
mkdir -p kernels/cross_entropy
cp -r research/cross_entropy/common research/cross_entropy/[0-9][0-9]_* kernels/cross_entropy/
touch kernels/cross_entropy/.draft-copy
step build 60 python3 -c "
from hopattn import cross_entropy_lineage as L, cross_entropy_ops as ce, rowwise_build
stages = L.discover()
assert stages[0].dir.parent.name == 'cross_entropy' and 'kernels' in str(stages[0].dir), stages[0].dir
rowwise_build.build_all(stages, verbose=True)
print('binding:', ce.build_native())
for s in stages:
    for cols in (4096, 32768, 131072, 262144):
        print(s.name, cols, ce.stage_info(s.number, cols))
"
HOPATTN_GPU_LOG="$logs/cross_entropy-gpu-cases-$gpu-$stamp.log" \
    step gpu-tests 110 python3 -m pytest -q -m gpu -rs -p no:cacheprovider tests/test_cross_entropy_gpu.py
step bench 115 python3 -m bench.rowwise_cross_entropy --rounds 3 --out build/cross_entropy_results
tar czf "$out/cross_entropy-gpu-run-$gpu-$stamp.tgz" $logs/cross_entropy-*-"$stamp".log build/cross_entropy_results \
    build/kernels/cross_entropy-stage*.ptxas.log 2>/dev/null
echo "packed: $out/cross_entropy-gpu-run-$gpu-$stamp.tgz (exit $status)"
exit $status
