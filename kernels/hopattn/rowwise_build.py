"""Builds Part II's rowwise lineages: every RMSNorm stage into its own shared library (through
hopattn.build, cached by its sources, in parallel) and the binding rowwise_native.cpp.

    python -m hopattn.rowwise_build            # every stage and the binding
    python -m hopattn.rowwise_build 4-5        # some stages (and the binding)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from . import build, rowwise

NATIVE_SOURCE = build.PACKAGE_DIR / "rowwise_native.cpp"
ABI_HEADER = rowwise.RMSNORM_DIR / "common" / "abi_rmsnorm.h"


def native_path() -> Path:
    import pybind11

    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    key = build._key(NATIVE_SOURCE.read_text(), ABI_HEADER.read_text(), pybind11.__version__, sys.version,
                     build.nvcc_version())
    return build.build_dir() / f"_rowwise_native-{key}{suffix}"


def build_native() -> Path:
    """Compile rowwise_native.cpp (host code only) into a Python extension, as build.build_native does
    for the attention binding."""
    import pybind11

    target = native_path()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    includes = [pybind11.get_include(), sysconfig.get_paths()["include"], str(ABI_HEADER.parent)]
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        tmp_target = Path(tmp) / target.name
        cmd = [build.nvcc(), "-O2", "-std=c++17", "-shared", "-Xcompiler=-fPIC,-fvisibility=hidden",
               *[f"-I{i}" for i in includes], "-o", str(tmp_target), str(NATIVE_SOURCE), "-ldl"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise build.BuildError(f"rowwise binding: build failed ({' '.join(cmd)})\n{proc.stdout}{proc.stderr}")
        os.replace(tmp_target, target)
    return target


def select(stages: list[rowwise.RowStage], args: list[str]) -> list[rowwise.RowStage]:
    from .lineage import parse_selection

    if not args:
        return stages
    numbers = set(parse_selection(" ".join(args), [s.number for s in stages]))
    return [s for s in stages if s.number in numbers]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hopattn.rowwise_build", description=__doc__.splitlines()[0])
    parser.add_argument("stages", nargs="*", help="RMSNorm stage numbers or ranges (1 3-5); default: all")
    parser.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes")
    parser.add_argument("--no-native", action="store_true", help="skip the binding")
    args = parser.parse_args(argv)
    try:
        stages = select(rowwise.discover(), args.stages)
    except ValueError as err:
        parser.error(str(err))
    start = time.perf_counter()
    print(f"building {len(stages)} rmsnorm stage(s) into {build.build_dir()} with {build.nvcc_version()}", flush=True)
    try:
        build.build_stages(stages, args.jobs, verbose=True)
        if not args.no_native:
            print(f"  binding: {build_native().name}", flush=True)
    except build.BuildError as err:
        print(err, file=sys.stderr)
        return 1
    print(f"done in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
