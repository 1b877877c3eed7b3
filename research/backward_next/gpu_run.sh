#!/usr/bin/env bash
# On a GPU machine, from the repository root, with PYTHONPATH=$PWD/kernels:$PWD: bring the drafted
# backward stage 07 into the lineage of this working tree (plain copies: commit them only once they
# pass), build, run its GPU tests (every case under the watchdog; autograd, torch.compile and CUDA
# graphs run on it, the lineage's last stage), the development timing loop against stage 06, and the
# traces of 06 and 07 (python -m bench.trace; what trace_roles.py says of them). About 3 minutes,
# at most 300 s of time limits (build 120, tests 90, timing 40, traces 50).
#
# What comes back: $OUT (default bench/logs) gets three files — the tests' pytest log, the timing
# log, and one tarball of everything (the build log, the watchdog's case log, both logs again, the
# trace log, the four trace records and trace_roles.py's reading of them): a GPU call returns at
# most eight files, and the last one lost five of its eight trace records that way.
set -u
OUT=${OUT:-bench/logs}
STAMP=$(date -u +%Y%m%dT%H%M)
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name(0).lower().replace(' ', '-'))" 2>/dev/null || echo gpu)
WORK=$(mktemp -d)
RUN="backward-07-$GPU-$STAMP"
mkdir -p "$OUT" "$WORK/$RUN"
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

if compgen -G "research/backward_next/common/*.cuh" > /dev/null; then
    cp research/backward_next/common/*.cuh kernels/attention_backward/common/
fi
cp -r research/backward_next/07_scores-ahead kernels/attention_backward/
timeout 120 python3 -u -c "from hopattn import build, lineage; build.build_stages(lineage.discover(lineage.BACKWARD_DIR)); build.build_stages([lineage.discover()[-1]]); build.build_native()" \
    > "$WORK/$RUN/build.log" 2>&1 || { say "build failed"; tail -30 "$WORK/$RUN/build.log"; tar -czf "$OUT/$RUN.tar.gz" -C "$WORK" "$RUN"; exit 1; }
say "built"

# The new stage's tests (its id, 07-scores-ahead), and autograd, torch.compile and CUDA graphs on it.
PYTEST_LOG="gpu-tests-backward-07-$GPU-$STAMP-pytest.log"
HOPATTN_GPU_LOG="$WORK/$RUN/gpu-tests-backward-07-cases.log" timeout 90 python3 -m pytest -q -m gpu tests/test_backward_gpu.py \
    -k "scores-ahead or autograd or compiled" -p no:cacheprovider > "$OUT/$PYTEST_LOG" 2>&1
say "tests rc=$?"; tail -6 "$OUT/$PYTEST_LOG"; cp "$OUT/$PYTEST_LOG" "$WORK/$RUN/"

DEVTIME_LOG="backward-devtime-07-$GPU-$STAMP.log"
timeout 40 python3 research/backward_devtime.py 4096,8192,16384 6,7 > "$OUT/$DEVTIME_LOG" 2>&1
say "devtime rc=$?"; grep -v "^  fa2" "$OUT/$DEVTIME_LOG"; cp "$OUT/$DEVTIME_LOG" "$WORK/$RUN/"

# The traces of 06 (the records the last run lost) and 07, and where their consumers' time goes.
timeout 50 python3 -m bench.trace --lineage backward --stages 6-7 > "$WORK/$RUN/trace-backward.log" 2>&1
say "trace rc=$?"; tail -4 "$WORK/$RUN/trace-backward.log"
mkdir -p "$WORK/$RUN/traces"
cp bench/results/traces/*/backward/0[67]*.json "$WORK/$RUN/traces/" 2>/dev/null
python3 research/backward_next/trace_roles.py "$WORK/$RUN"/traces/*.json > "$WORK/$RUN/trace-roles.txt" 2>&1
grep -A3 "mean per step\|no wgmma in flight" "$WORK/$RUN/trace-roles.txt" | head -40

tar -czf "$OUT/$RUN.tar.gz" -C "$WORK" "$RUN"
say "done: $OUT/$RUN.tar.gz, $OUT/$PYTEST_LOG, $OUT/$DEVTIME_LOG"
