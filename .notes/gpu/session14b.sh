#!/bin/bash
# A third harness run of stages 17-19 against FA4 and cuDNN (7 rounds), right after call A
# (`mkdir -p /opt/fa4 && cp .fa4a/cu13.tar.xz.00 /opt/fa4/ && python3 -m hopattn.build 17-19`).
# Usage: bash .notes/gpu/session14b.sh <full 40-digit commit>
test -f /opt/fa4/cu13.tar.xz.00 || exit 3
cat /opt/fa4/cu13.tar.xz.00 .fa4b/cu13.tar.xz.01 | python3 -c "import sys,tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall('/opt/fa4')" && python3 -c "import zipfile,glob; [zipfile.ZipFile(w).extractall('/opt/fa4') for w in glob.glob('.fa4b/*.whl')]"
export PYTHONPATH=kernels:.:/opt/fa4:/opt/fa4/nvidia_cutlass_dsl/dsl_packages HOPATTN_BUILD_DIR=/tmp/hb HOPATTN_GIT_COMMIT=$1 HOPATTN_GIT_DIRTY=0
mkdir -p /tmp/hr3
timeout 300 python3 -m bench --stages 17-19 --peers fa4,cudnn --causal both --reps 7 --out /tmp/hr3/nvidia-h200.json --raw $OUT/raw3.json > $OUT/bench3.log 2>&1
cp /tmp/hr3/nvidia-h200.json $OUT/run3.json; grep -E "^(stage|fa4|cudnn) " $OUT/bench3.log
