#!/usr/bin/env bash
# One GPU run of stages 23 and 24, which are in kernels/attention/ (23_roles, 24_head-dims; their
# headers instructions.cuh, wgmma_desc.cuh and wgmma_shapes.cuh in kernels/attention/common/; their
# compiler facts in kernels/compiler_facts/attention/): build, the GPU tests of both (stage 24 at every
# head dim it serves), their measurement at head dim 128 against stage 22 and the reference peers, the
# head-dim points of issue #29, and their traces. Each part stays under 10 minutes on an H200 (its
# steps' limits add up to at most 530 s). From the repository root:
#
#   PYTHONPATH=$PWD/kernels:$PWD bash research/stage24/gpu_run.sh tests    # build + GPU tests (~4 min)
#   PYTHONPATH=$PWD/kernels:$PWD bash research/stage24/gpu_run.sh bench    # build + bench at 128 + traces
#   PYTHONPATH=$PWD/kernels:$PWD bash research/stage24/gpu_run.sh dims     # build + the head-dim points
#
# Logs: bench/logs/stage24-<step>-<gpu>-<time>.log (the GPU tests' cases in stage24-gpu-cases-...).
# Records: bench/results/<gpu>.json (merged: this run's entries replace theirs) and
# bench/results/traces/<gpu>/{23,24}[-causal].json. FA3 and FA4 are measured where importable: source
# /opt/peers/unpack.sh first when the peers bundle is there (../shared/tools/peers-on-gpu-machine.md);
# this script does so itself when it finds it. The exit status is the first failing step's.
set -uo pipefail
part=${1:-tests}
case "$part" in tests|bench|dims) ;; *) echo "usage: $0 [tests|bench|dims]" >&2; exit 2 ;; esac
for n in 23 24; do
    ls -d kernels/attention/${n}_* >/dev/null 2>&1 || { echo "stage $n is not in kernels/attention/" >&2; exit 2; }
done
[ -f /opt/peers/unpack.sh ] && source /opt/peers/unpack.sh
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '-'))" 2>/dev/null || echo unknown-gpu)
stamp=$(date -u +%Y%m%dT%H%M)
logs=bench/logs
mkdir -p "$logs" build
status=0
step() {  # step NAME SECONDS COMMAND...: run under a time limit, log to bench/logs, keep the first failure
    local name=$1 limit=$2; shift 2
    local log="$logs/stage24-$name-$gpu-$stamp.log"
    echo "== $name (limit ${limit} s): $*" | tee "$log"
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc" | tee -a "$log"
    [ "$status" -eq 0 ] && [ "$rc" -ne 0 ] && status=$rc
}
step build 90 python3 -m hopattn.build 22-24
case "$part" in
tests)
    # stage 24 at every head dim (tests/test_head_dims_gpu.py, the head-dim fuzz and numeric fuzz),
    # and stages 23 and 24 through the head-dim-128 suite as every stage
    HOPATTN_GPU_LOG="$logs/stage24-gpu-cases-$gpu-$stamp.log" \
        step gpu-tests 420 python3 -m pytest -q -m gpu -rs -p no:cacheprovider \
            tests/test_head_dims_gpu.py tests/test_kernels_gpu.py tests/test_contract_gpu.py \
            tests/test_fuzz_gpu.py tests/test_numeric_fuzz_gpu.py -k "23-roles or 24-head-dims"
    ;;
bench)
    # head dim 128: every shape, both masks, stages 22-24 and the reference peers in one process
    step bench 360 python3 -m bench --what forward --stages 22-24 --peers fa3,fa4,cudnn --shapes all
    step trace 90 python3 -m bench.trace --stages 23,24
    ;;
dims)
    # issue #29's points: 4k/8k/16k, H·D = 2048, head dims 64, 96, 128, 192 (v 128) and 256
    step bench-head-dims 440 python3 -m bench --what forward --stages 22-24 --peers fa3,fa4,cudnn \
        --shapes head-dims
    ;;
esac
exit $status
