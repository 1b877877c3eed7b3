#!/usr/bin/env bash
# One GPU run of the softmax lineages (Part II), forward and backward: build their stages and the
# binding, print the long rows' occupancy (research/softmax/occupancy.cu: CTAs an SM, clusters resident),
# run the GPU tests under the watchdog, then the benchmark against the copy ceiling, eager,
# torch.compile, Liger and QuACK. About 3–4 minutes on an H200 (the steps' limits add up to 315 s; the
# benchmark of every stage takes about 80 s).
#
#   PYTHONPATH=$PWD/kernels:$PWD bash research/softmax/gpu_run.sh      # from the repository root
#   SOFTMAX_BENCH_ARGS="--direction forward --stages 3-5" PYTHONPATH=... bash research/softmax/gpu_run.sh
#       # the benchmark's arguments (python -m bench.rowwise_softmax --help); its record then holds only
#       # the stages it ran, so commit a record of every stage, not this one
#
# Logs: bench/logs/softmax-{build,occupancy,gpu-tests,gpu-cases,bench}-<gpu>-<time>.log; the records:
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
occupancy() {  # the long rows' occupancy as the GPU reports it, with the nvcc the build used
    local nvcc
    nvcc=$(python3 -c "from hopattn import cuda_tools; print(cuda_tools.require('nvcc'))") || return 1
    "$nvcc" -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o build/softmax-occupancy \
        research/softmax/occupancy.cu && build/softmax-occupancy
}
export -f occupancy
step occupancy 30 bash -c occupancy
HOPATTN_GPU_LOG="$logs/softmax-gpu-cases-$gpu-$stamp.log" \
    step gpu-tests 90 python3 -m pytest -q -m gpu -rs -p no:cacheprovider tests/test_softmax_gpu.py
# shellcheck disable=SC2086  # the arguments split as typed
step bench 150 python3 -m bench.rowwise_softmax ${SOFTMAX_BENCH_ARGS:-}
exit $status
