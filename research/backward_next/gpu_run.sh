#!/usr/bin/env bash
# On a GPU machine, from the repository root, with PYTHONPATH=$PWD/kernels:$PWD: bring the next drafted
# backward stage (the one NN_slug/ folder here, or DRAFT=NN_slug) into the lineage of this working tree
# (plain copies: commit them only once they pass), build, run its GPU tests (every case under the
# watchdog; autograd, torch.compile and CUDA graphs run on it, the lineage's last stage), the
# development timing loop against the lineage's last stage, and the traces of both (python -m
# bench.trace; what trace_roles.py says of them). About 3 minutes, at most 300 s of time limits
# (build 120, tests 90, timing 40, traces 50). Written for stage 07 (its run: 2026-12-02T1350).
#
# What comes back: $OUT (default bench/logs) gets three files — the tests' pytest log, the timing
# log, and one tarball of everything (the build log, the watchdog's case log, both logs again, the
# trace log, the four trace records and trace_roles.py's reading of them): a GPU call returns at
# most eight files.
set -u
OUT=${OUT:-bench/logs}
STAMP=$(date -u +%Y%m%dT%H%M)
GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name(0).lower().replace(' ', '-'))" 2>/dev/null || echo gpu)
WORK=$(mktemp -d)
if [ -z "${DRAFT:-}" ]; then
    DRAFT=$(cd research/backward_next && ls -d [0-9][0-9]_*/ 2>/dev/null | head -1)
    DRAFT=${DRAFT%/}
fi
[ -n "$DRAFT" ] && [ -d "research/backward_next/$DRAFT" ] || { echo "no draft stage in research/backward_next/"; exit 2; }
NEW=$((10#${DRAFT%%_*}))
SLUG=${DRAFT#*_}
PREV=${PREV:-$((NEW - 1))}  # DRAFT=NN_slug PREV=M: a draft beside stage M (a diagnostic of an earlier stage)
NN=$(printf %02d "$NEW")
RUN="backward-$NN-$GPU-$STAMP"
mkdir -p "$OUT" "$WORK/$RUN"
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

if compgen -G "research/backward_next/common/*.cuh" > /dev/null; then
    cp research/backward_next/common/*.cuh kernels/attention_backward/common/
fi
cp -r "research/backward_next/$DRAFT" kernels/attention_backward/
timeout 120 python3 -u -c "from hopattn import build, lineage; build.build_stages(lineage.discover(lineage.BACKWARD_DIR)); build.build_stages([lineage.discover()[-1]]); build.build_native()" \
    > "$WORK/$RUN/build.log" 2>&1 || { say "build failed"; tail -30 "$WORK/$RUN/build.log"; tar -czf "$OUT/$RUN.tar.gz" -C "$WORK" "$RUN"; exit 1; }
say "built"

# The new stage's tests (its id, NN-slug), and autograd, torch.compile and CUDA graphs on it.
PYTEST_LOG="gpu-tests-backward-$NN-$GPU-$STAMP-pytest.log"
HOPATTN_GPU_LOG="$WORK/$RUN/gpu-tests-backward-$NN-cases.log" timeout 90 python3 -m pytest -q -m gpu tests/test_backward_gpu.py \
    -k "$SLUG or autograd or compiled" -p no:cacheprovider > "$OUT/$PYTEST_LOG" 2>&1
say "tests rc=$?"; tail -6 "$OUT/$PYTEST_LOG"; cp "$OUT/$PYTEST_LOG" "$WORK/$RUN/"

DEVTIME_LOG="backward-devtime-$NN-$GPU-$STAMP.log"
timeout 40 python3 research/backward_devtime.py 4096,8192,16384 "$PREV,$NEW" > "$OUT/$DEVTIME_LOG" 2>&1
say "devtime rc=$?"; grep -v "^  fa2" "$OUT/$DEVTIME_LOG"; cp "$OUT/$DEVTIME_LOG" "$WORK/$RUN/"

# The traces of the last stage and the new one, and where their consumers' time goes.
timeout 50 python3 -m bench.trace --lineage backward --stages "$PREV-$NEW" > "$WORK/$RUN/trace-backward.log" 2>&1
say "trace rc=$?"; tail -4 "$WORK/$RUN/trace-backward.log"
mkdir -p "$WORK/$RUN/traces"
for n in "$PREV" "$NEW"; do cp bench/results/traces/*/backward/$(printf %02d "$n")*.json "$WORK/$RUN/traces/" 2>/dev/null; done
python3 research/backward_next/trace_roles.py "$WORK/$RUN"/traces/*.json > "$WORK/$RUN/trace-roles.txt" 2>&1
grep -A3 "mean per step\|no wgmma in flight" "$WORK/$RUN/trace-roles.txt" | head -40

tar -czf "$OUT/$RUN.tar.gz" -C "$WORK" "$RUN"
say "done: $OUT/$RUN.tar.gz, $OUT/$PYTEST_LOG, $OUT/$DEVTIME_LOG"
