#!/usr/bin/env bash
# One GPU run of the cross-entropy lineage (Part II, issue #30; kernels/cross_entropy): build its stages
# and their binding, run the GPU tests under the watchdog, then the benchmark (fused forward, forward,
# backward) against the copy ceiling, eager, torch.compile, Liger and QuACK. Under 5 minutes on an
# H200 (the steps' limits add up to 285 s).
#
#   PYTHONPATH=$PWD/kernels:$PWD bash research/cross_entropy/gpu_run.sh      # from the repository root
#   CE_BENCH_STAGES=4-5 PYTHONPATH=... bash research/cross_entropy/gpu_run.sh   # bench only stages 04-05 (+ peers)
#
# Logs: bench/logs/cross_entropy-{build,gpu-tests,gpu-cases,bench}-<gpu>-<time>.log; the records:
# bench/results/cross_entropy_{fused,forward,backward}/<gpu>.json, each written after every size, so
# a bench step stopped by its limit keeps the sizes it finished. Liger and QuACK are measured where
# importable (source /opt/peers/unpack.sh first when the peers bundle is unpacked; this script does so
# itself when it finds it). With $OUT set, the logs, the records and the ptxas logs are also packed
# into ONE tarball there. The exit status is the first failing step's.
set -uo pipefail
[ -f /opt/peers/unpack.sh ] && source /opt/peers/unpack.sh
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '-'))" 2>/dev/null || echo unknown-gpu)
stamp=$(date -u +%Y%m%dT%H%M)
logs=bench/logs
mkdir -p "$logs" build
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
step build 60 python3 -c "
from hopattn import cross_entropy_lineage as L, cross_entropy_ops as ce, rowwise_build
stages = L.discover()
rowwise_build.build_all(stages, verbose=True)
print('binding:', ce.build_native())
for s in stages:
    for cols in (4096, 32768, 131072, 262144):
        print(s.name, cols, ce.stage_info(s.number, cols))
"
HOPATTN_GPU_LOG="$logs/cross_entropy-gpu-cases-$gpu-$stamp.log" \
    step gpu-tests 110 python3 -m pytest -q -m gpu -rs -p no:cacheprovider tests/test_cross_entropy_gpu.py
step bench 115 python3 -m bench.rowwise_cross_entropy --rounds 3 --stages "${CE_BENCH_STAGES:-all}"
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    tar czf "$OUT/cross_entropy-gpu-run-$gpu-$stamp.tgz" $logs/cross_entropy-*-"$stamp".log \
        bench/results/cross_entropy_*/"$gpu".json build/kernels/cross_entropy-stage*.ptxas.log 2>/dev/null
    echo "packed: $OUT/cross_entropy-gpu-run-$gpu-$stamp.tgz (exit $status)"
fi
exit $status
