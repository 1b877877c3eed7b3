#!/usr/bin/env bash
# On a GPU machine, from the repository root, with PYTHONPATH=$PWD/kernels:$PWD: bring the drafted
# backward stages into the lineage of this working tree (plain moves: commit them only once they
# pass), build, run the backward GPU tests (every case under the watchdog) and the development
# timing loop. Logs go to $OUT (default bench/logs). About 4 minutes.
set -u
OUT=${OUT:-bench/logs}
STAMP=$(date -u +%Y%m%dT%H%M)
mkdir -p "$OUT"
cp research/backward_next/common/*.cuh kernels/attention_backward/common/
for d in research/backward_next/0[4-9]_*; do cp -r "$d" kernels/attention_backward/; done
python3 -c "from hopattn import build, lineage; build.build_stages(lineage.discover(lineage.BACKWARD_DIR)); build.build_stages([lineage.discover()[-1]]); build.build_native()" \
    > "$OUT/backward-next-build-$STAMP.log" 2>&1 || { tail -30 "$OUT/backward-next-build-$STAMP.log"; exit 1; }
# The tests of the new stages (and autograd, torch.compile, CUDA graphs on the last one).
HOPATTN_GPU_LOG="$OUT/gpu-tests-backward-next-$STAMP.log" timeout 300 python3 -m pytest -q -m gpu tests/test_backward_gpu.py \
    -k "dq-bulk-reduce or ordered-dq or warp-specialized or autograd or compiled" -p no:cacheprovider > "$OUT/gpu-tests-backward-next-$STAMP-pytest.log" 2>&1
echo "tests rc=$?"; tail -15 "$OUT/gpu-tests-backward-next-$STAMP-pytest.log"
timeout 200 python3 research/backward_devtime.py 4096,8192,16384 3,4,5,6 > "$OUT/backward-devtime-next-$STAMP.log" 2>&1
echo "devtime rc=$?"; cat "$OUT/backward-devtime-next-$STAMP.log"
