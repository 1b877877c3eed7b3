#!/usr/bin/env bash
# One GPU run of the softmax lineages (Part II), forward and backward: build their stages and the
# binding, run the GPU tests under the watchdog, then the benchmark against the copy ceiling, eager,
# torch.compile, Liger and QuACK. Under 5 minutes on an H200 (the steps' limits add up to 285 s).
#
#   PYTHONPATH=$PWD/kernels:$PWD bash research/softmax/gpu_run.sh      # from the repository root
#
# Logs: bench/logs/softmax-{build,gpu-tests,bench}-<gpu>-<time>.log; the records:
# bench/results/softmax/<gpu>.json and bench/results/softmax_backward/<gpu>.json, each written after
# every size, so a bench step stopped by its limit keeps the sizes it finished. Liger and QuACK are
# measured where importable (source /opt/peers/unpack.sh first when the peers bundle is unpacked;
# this script does so itself when it finds it). The exit status is the first failing step's.
set -uo pipefail
[ -f /opt/peers/unpack.sh ] && source /opt/peers/unpack.sh
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '-'))" 2>/dev/null || echo unknown-gpu)
stamp=$(date -u +%Y%m%dT%H%M)
logs=bench/logs
mkdir -p "$logs" build
status=0
step() {  # step NAME SECONDS COMMAND...: run under a time limit, log to bench/logs, keep the first failure
    local name=$1 limit=$2; shift 2
    local log="$logs/softmax-$name-$gpu-$stamp.log"
    echo "== $name (limit ${limit} s): $*" | tee "$log"
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc" | tee -a "$log"
    [ "$status" -eq 0 ] && [ "$rc" -ne 0 ] && status=$rc
}
step build 45 python3 -m hopattn.rowwise_build --lineage softmax,softmax_backward
HOPATTN_GPU_LOG="$logs/softmax-gpu-cases-$gpu-$stamp.log" \
    step gpu-tests 90 python3 -m pytest -q -m gpu -rs -p no:cacheprovider tests/test_softmax_gpu.py
step bench 150 python3 -m bench.rowwise_softmax
exit $status
