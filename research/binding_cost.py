"""The binding's own cost per forward launch (research/host_cost.md): StageLibrary.launch with its 19
arguments against launch_prepared with a PreparedLaunch and the five pointers, both into a stage library
that only records what it is given (no CUDA call), so only pybind11's side is timed. No GPU needed.

    PYTHONPATH=kernels:. python research/binding_cost.py

tests/test_native_prepared_launch.py builds the same recording library to check that both ways hand it
the same AttnParams."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import timeit
from pathlib import Path

from hopattn import api, build, cuda_tools, lineage

RECORDER = r"""
#include <cstring>
#include "abi.h"
static AttnParams last;
extern "C" __attribute__((visibility("default"))) int hopattn_launch(const AttnParams* p, cudaStream_t, char*, int) {
    last = *p;
    return 0;
}
extern "C" __attribute__((visibility("default"))) int hopattn_describe(KernelInfo* info, char*, int) {
    info->abi_version = HOPATTN_ABI_VERSION;
    return 0;
}
extern "C" __attribute__((visibility("default"))) int last_params(void* out) {
    std::memcpy(out, &last, sizeof last);
    return sizeof last;
}
"""


def build_recorder(folder: Path) -> Path:
    """The recording stage library, compiled into ``folder`` (nvcc, host code only)."""
    source, library = folder / "recorder.cpp", folder / "recorder.so"
    source.write_text(RECORDER)
    subprocess.run([cuda_tools.require("nvcc"), "-O2", "-std=c++17", "-shared", "-Xcompiler=-fPIC",
                    f"-I{lineage.ATTENTION_DIR / 'common'}", str(source), "-o", str(library)],
                   check=True, capture_output=True)
    return library


def main() -> int:
    build.build_native()
    with tempfile.TemporaryDirectory() as tmp:
        lib = api._native().StageLibrary(str(build_recorder(Path(tmp))))
        strides = (256 * 32 * 64, 64, 32 * 64)  # LTX-2's audio call: BSHD, 32 heads, 256 rows, d 64
        plain = (1, 2, 3, 4, strides, strides, strides, strides, 1, 32, 256, 256, 64, 0.125, False, 132, 0, 32, 0)
        prepared = lib.prepare(strides, strides, strides, strides, 1, 32, 256, 256, 64, 0.125, False, 132, 32)
        print(f"# python {' '.join(sys.argv)}: µs a call, the best of 3 x 5 x 20000 calls", flush=True)
        for name, fn in (("launch (19 arguments)", lambda: lib.launch(*plain)),
                         ("launch_prepared (7)", lambda: lib.launch_prepared(prepared, 1, 2, 3, 4, 0, 0))):
            best = min(min(timeit.repeat(fn, number=20000, repeat=5)) for _ in range(3)) / 20000 * 1e6
            print(f"{name:24s} {best:.2f} µs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
