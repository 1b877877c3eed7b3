#!/usr/bin/env bash
# One GPU run of the RMSNorm lineages (Part II), forward or backward: build the stages and the
# binding, run the GPU tests under the watchdog, then the benchmark against the copy ceiling, eager,
# torch.compile, Liger and QuACK. Each part stays under 5 minutes on an H200 (its steps' limits add
# up to 240 s forward, 300 s backward; a cold build is most of the first step); `all` runs both, one
# after the other (about 9 minutes: two calls, one a part, fit a short lease better).
#
#   PYTHONPATH=$PWD/kernels:$PWD bash research/rmsnorm/gpu_run.sh              # the forward (as before)
#   PYTHONPATH=$PWD/kernels:$PWD bash research/rmsnorm/gpu_run.sh backward     # the backward
#   PYTHONPATH=$PWD/kernels:$PWD bash research/rmsnorm/gpu_run.sh all          # both
#
# Logs: bench/logs/rmsnorm{,-backward}-{build,gpu-tests,bench}-<gpu>-<time>.log; the records:
# bench/results/rmsnorm/<gpu>.json and bench/results/rmsnorm_backward/<gpu>.json (the backward's is
# written after every size, so a bench step stopped by its limit keeps the sizes it finished). Liger
# and QuACK are measured where importable: source /opt/peers/unpack.sh first when the peers bundle is
# unpacked (../shared/tools/peers-on-gpu-machine.md); this script does so itself when it finds it.
# The exit status is the first failing step's.
set -uo pipefail
part=${1:-forward}
case "$part" in forward|backward|all) ;; *) echo "usage: $0 [forward|backward|all]" >&2; exit 2 ;; esac
[ -f /opt/peers/unpack.sh ] && source /opt/peers/unpack.sh
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '-'))" 2>/dev/null || echo unknown-gpu)
stamp=$(date -u +%Y%m%dT%H%M)
logs=bench/logs
mkdir -p "$logs" build
status=0
step() {  # step NAME SECONDS COMMAND...: run under a time limit, log to bench/logs, keep the first failure
    local name=$1 limit=$2; shift 2
    local log="$logs/rmsnorm-$name-$gpu-$stamp.log"
    echo "== $name (limit ${limit} s): $*" | tee "$log"
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc" | tee -a "$log"
    [ "$status" -eq 0 ] && [ "$rc" -ne 0 ] && status=$rc
}
if [ "$part" != backward ]; then
    step build 45 python3 -m hopattn.rowwise_build --lineage rmsnorm
    HOPATTN_GPU_LOG="$logs/rmsnorm-gpu-cases-$gpu-$stamp.log" \
        step gpu-tests 75 python3 -m pytest -q -m gpu -rs -p no:cacheprovider tests/test_rmsnorm_gpu.py
    step bench 120 python3 -m bench.rowwise
fi
if [ "$part" != forward ]; then
    # both RMSNorm lineages (the forward's final stage makes the rstd the backward's tests and bench
    # start from; cached when the forward part ran first) and the binding, not the softmax lineages
    step backward-build 70 python3 -m hopattn.rowwise_build --lineage rmsnorm,rmsnorm_backward
    HOPATTN_GPU_LOG="$logs/rmsnorm-backward-gpu-cases-$gpu-$stamp.log" \
        step backward-gpu-tests 110 python3 -m pytest -q -m gpu -rs -p no:cacheprovider tests/test_rmsnorm_backward_gpu.py
    step backward-bench 120 python3 -m bench.rowwise_backward
fi
exit $status
