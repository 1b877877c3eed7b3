"""Builds Part II's rowwise lineages: every RMSNorm and softmax stage, forward and backward, and every
cross-entropy stage, each into its
own shared library (through hopattn.build, cached by its sources, in parallel) and the binding
rowwise_native.cpp.

    python -m hopattn.rowwise_build                               # every stage of every lineage, and the binding
    python -m hopattn.rowwise_build 4-5                           # some RMSNorm forward stages (and the binding)
    python -m hopattn.rowwise_build --lineage rmsnorm_backward 3-4   # some stages of one lineage
    python -m hopattn.rowwise_build --lineage softmax,softmax_backward
    python -m hopattn.rowwise_build --lineage cross_entropy   # its binding: hopattn.cross_entropy_ops.build_native
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

from . import build, cross_entropy_lineage, rowwise, rowwise_backward, softmax_lineage

NATIVE_SOURCE = build.PACKAGE_DIR / "rowwise_native.cpp"
ABI_HEADER = rowwise.RMSNORM_DIR / "common" / "abi_rmsnorm.h"
BACKWARD_ABI_HEADER = rowwise_backward.RMSNORM_BACKWARD_DIR / "common" / "abi_rmsnorm_backward.h"
SOFTMAX_ABI_HEADER = softmax_lineage.SOFTMAX_DIR / "common" / "abi_softmax.h"
LINEAGES = {"rmsnorm": rowwise.discover, "rmsnorm_backward": rowwise_backward.discover,
            "softmax": softmax_lineage.discover, "softmax_backward": softmax_lineage.discover_backward,
            "cross_entropy": cross_entropy_lineage.discover}


def native_path() -> Path:
    import pybind11

    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    key = build._key(NATIVE_SOURCE.read_text(), ABI_HEADER.read_text(), BACKWARD_ABI_HEADER.read_text(),
                     SOFTMAX_ABI_HEADER.read_text(), pybind11.__version__, sys.version, build.nvcc_version())
    return build.build_dir() / f"_rowwise_native-{key}{suffix}"


def build_native() -> Path:
    """Compile rowwise_native.cpp (host code only) into a Python extension, as build.build_native does
    for the attention binding."""
    import pybind11

    target = native_path()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    includes = [pybind11.get_include(), sysconfig.get_paths()["include"], str(ABI_HEADER.parent),
                str(BACKWARD_ABI_HEADER.parent), str(SOFTMAX_ABI_HEADER.parent)]
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        tmp_target = Path(tmp) / target.name
        cmd = [build.nvcc(), "-O2", "-std=c++17", "-shared", "-Xcompiler=-fPIC,-fvisibility=hidden",
               *[f"-I{i}" for i in includes], "-o", str(tmp_target), str(NATIVE_SOURCE), "-ldl"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise build.BuildError(f"rowwise binding: build failed ({' '.join(cmd)})\n{proc.stdout}{proc.stderr}")
        os.replace(tmp_target, target)
    return target


def build_all(stages: list[rowwise.RowStage], jobs: int | None = None, verbose: bool = False) -> dict:
    """Compile stages of one or several lineages at once (build.build_stages keys its results by stage
    number, which two lineages share); returns {(lineage, number): build.CompileResult}."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = jobs or min(len(stages), os.cpu_count() or 1) or 1
    results, errors = {}, []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {(s.lineage, s.number): pool.submit(build.compile_stage, s) for s in stages}
        for (name, number), fut in futures.items():
            try:
                r = results[(name, number)] = fut.result()
            except build.BuildError as err:
                errors.append(str(err))
                continue
            if verbose:
                print(f"  {name} {number:02d}: {'cached' if r.cached else f'{r.seconds:.1f} s'}  {r.library.name}",
                      flush=True)
    if errors:
        raise build.BuildError("\n\n".join(errors))
    return results


def select(stages: list[rowwise.RowStage], args: list[str]) -> list[rowwise.RowStage]:
    from .lineage import parse_selection

    if not args:
        return stages
    numbers = set(parse_selection(" ".join(args), [s.number for s in stages]))
    return [s for s in stages if s.number in numbers]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hopattn.rowwise_build", description=__doc__.splitlines()[0])
    parser.add_argument("stages", nargs="*", help="stage numbers or ranges (1 3-5) of one lineage; default: all")
    parser.add_argument("--lineage", default=None,
                        help=f"which lineages, comma-separated from {', '.join(LINEAGES)}, or all "
                             "(default: all, or rmsnorm when stages are named)")
    parser.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes")
    parser.add_argument("--no-native", action="store_true", help="skip the binding")
    args = parser.parse_args(argv)
    chosen = args.lineage or ("rmsnorm" if args.stages else "all")
    names = list(LINEAGES) if chosen == "all" else [n.strip() for n in chosen.split(",") if n.strip()]
    unknown = [n for n in names if n not in LINEAGES]
    if unknown or not names:
        parser.error(f"--lineage: unknown {unknown[0] if unknown else chosen!r}; expected some of "
                     f"{', '.join(LINEAGES)}, or all")
    if len(names) > 1 and args.stages:
        parser.error(f"name one --lineage for the stages to build (one of {', '.join(LINEAGES)})")
    try:
        stages = [s for name in names for s in select(LINEAGES[name](), args.stages)]
    except ValueError as err:
        parser.error(str(err))
    start = time.perf_counter()
    names = ", ".join(names)
    print(f"building {len(stages)} {names} stage(s) into {build.build_dir()} with {build.nvcc_version()}", flush=True)
    try:
        build_all(stages, args.jobs, verbose=True)
        if not args.no_native:
            print(f"  binding: {build_native().name}", flush=True)
    except build.BuildError as err:
        print(err, file=sys.stderr)
        return 1
    print(f"done in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
