"""Builds the stages and the binding: every stage its own shared library, compiled in parallel and
cached by the hash of its sources' bytes, flags and compiler.

    python -m hopattn.build            # build every stage (and the binding, if torch is present)
    python -m hopattn.build 1 5-6      # some stages

The cache lives in $HOPATTN_BUILD_DIR (default: <repo>/build/kernels). A stage whose sources have
not changed is not recompiled; a cold build of the lineage runs one nvcc per stage at once.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import cuda_tools, lineage

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent.parent
NATIVE_SOURCE = PACKAGE_DIR / "native.cpp"

# sm_80 stages also carry compute_80 PTX, so newer GPUs (Blackwell) can run them; sm_90a stages
# use wgmma/setmaxnreg, which exist only in the arch-specific sm_90a target.
GENCODE = {
    "sm_80": ["-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_80,code=[sm_80,compute_80]"],
    "sm_90a": ["-gencode=arch=compute_90a,code=sm_90a"],
}
COMMON_FLAGS = ["-O3", "-std=c++17", "-lineinfo", "-Xptxas=-v", "-shared", "-Xcompiler=-fPIC,-fvisibility=hidden"]


class BuildError(RuntimeError):
    """nvcc or the host compiler failed; the message carries the command and its output."""


@dataclass(frozen=True)
class CompileResult:
    library: Path
    ptxas_log: str
    command: tuple[str, ...]
    cached: bool
    seconds: float


def build_dir() -> Path:
    return Path(os.environ.get("HOPATTN_BUILD_DIR", REPO_ROOT / "build" / "kernels")).resolve()


def nvcc() -> str:
    """The nvcc to use (see hopattn.cuda_tools.find: $NVCC, PATH, $CUDA_HOME/bin, pip's nvidia-cuda-nvcc)."""
    try:
        return cuda_tools.require("nvcc")
    except cuda_tools.ToolError as err:
        raise BuildError(str(err)) from None


@lru_cache(maxsize=1)
def nvcc_version() -> str:
    out = subprocess.run([nvcc(), "--version"], capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


TRACE_FLAG = "-DHOPATTN_TRACE"  # the trace points of common/trace.cuh record (python -m bench.trace)
# The recorder behind them: force-included by the traced build only, so it is outside every stage's
# sources (and hash); the traced library's cache key and the trace records carry its own hash.
# $HOPATTN_TRACE_RECORDER may name another (lineage.trace_recorder), for an experiment.
TRACE_RECORDER = lineage.TRACE_RECORDER
# The backward's (Act V): its own events on top of the forward's recorder, which it includes and
# leaves as it is (so no forward trace record goes stale). Read from the stage's own lineage folder,
# so that a lineage assembled elsewhere (the drafts' tests) records with its own copy.
BACKWARD_TRACE_RECORDER = lineage.BACKWARD_DIR / "common" / "trace_recorder_backward.cuh"


def trace_recorder_of(stage: lineage.Stage) -> Path:
    """The recorder the stage's traced build force-includes: the forward's (lineage.trace_recorder:
    common/trace_recorder.cuh, or the experiment $HOPATTN_TRACE_RECORDER names), or for a backward
    stage its lineage's common/trace_recorder_backward.cuh."""
    if stage.backward:
        return stage.dir.parent / "common" / BACKWARD_TRACE_RECORDER.name
    return lineage.trace_recorder()


def trace_recorder_files(stage: lineage.Stage) -> list[Path]:
    """The recorder of the stage's traced build and the files it builds on: what a trace record's
    recorder hash and the traced library's cache key are of."""
    if not stage.backward:
        chosen = lineage.trace_recorder()
        return [chosen] if chosen == lineage.TRACE_RECORDER else [chosen, lineage.TRACE_RECORDER]
    return [trace_recorder_of(stage), stage.dir.parent.parent / lineage.ATTENTION_DIR.name / "common" /
            lineage.TRACE_RECORDER.name]


def trace_recorder_bytes_hash(stage: lineage.Stage) -> str:
    """The bytes of trace_recorder_files: the traced library's cache key (the forward's is
    lineage.trace_recorder_bytes_hash, unchanged)."""
    if not stage.backward:
        return lineage.trace_recorder_bytes_hash()
    return hashlib.sha256(b"\0".join(p.read_bytes() for p in trace_recorder_files(stage))).hexdigest()[:16]


def nvcc_flags(stage: lineage.Stage, traced: bool = False) -> list[str]:
    recorder = trace_recorder_of(stage) if traced else None
    return COMMON_FLAGS + GENCODE[stage.arch] + ([TRACE_FLAG, "-include", str(recorder)] if traced else [])


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def library_path(stage: lineage.Stage, traced: bool = False) -> Path:
    # Keyed on the sources' bytes, not on the token hash the records carry: the library holds
    # -lineinfo, the lines (and columns) of the sources it was compiled from, which the compiler
    # facts show. A comment edit then recompiles (nvcc only, no GPU), and a cached library never
    # describes lines that have since moved; the records stay current all the same.
    key = _key(stage.source_bytes_hash(), " ".join(nvcc_flags(stage, traced)), nvcc_version(),
               trace_recorder_bytes_hash(stage) if traced else "")
    lineage_prefix = "" if stage.lineage == lineage.ATTENTION_DIR.name else f"{stage.lineage}-"
    return build_dir() / f"{lineage_prefix}stage{stage.id}-{stage.slug}{'-traced' if traced else ''}-{key}.so"


def compile_stage(stage: lineage.Stage, out_dir: Path | None = None, traced: bool = False) -> CompileResult:
    """Compile one stage into a shared library (reusing the cache when nothing changed); traced:
    with its trace points recording (a separate library)."""
    target = library_path(stage, traced)
    target = target if out_dir is None else Path(out_dir) / target.name
    log_path = target.with_suffix(".ptxas.log")
    cmd = [nvcc(), *nvcc_flags(stage, traced), "-o", str(target), str(stage.kernel_path)]
    if target.is_file() and log_path.is_file():
        return CompileResult(target, log_path.read_text(), tuple(cmd), True, 0.0)
    target.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    # Compile to a temporary name and rename, so an interrupted build never leaves a broken library.
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        tmp_target = Path(tmp) / target.name
        cmd[cmd.index("-o") + 1] = str(tmp_target)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"stage {stage.name}: nvcc failed ({' '.join(cmd)})\n{proc.stdout}{proc.stderr}")
        tmp_log = tmp_target.with_suffix(".ptxas.log")
        tmp_log.write_text(proc.stdout + proc.stderr)
        os.replace(tmp_log, log_path)  # the log first: a library without its log is rebuilt
        os.replace(tmp_target, target)
    cmd[cmd.index("-o") + 1] = str(target)
    return CompileResult(target, log_path.read_text(), tuple(cmd), False, time.perf_counter() - start)


def build_stages(stages: list[lineage.Stage] | None = None, jobs: int | None = None,
                 verbose: bool = False, traced: bool = False) -> dict[int, CompileResult]:
    """Compile the given stages (default: all) in parallel; returns {stage number: result}.
    traced: their traced builds (-DHOPATTN_TRACE) instead."""
    stages = lineage.discover() if stages is None else stages
    jobs = jobs or min(len(stages), os.cpu_count() or 1) or 1
    results: dict[int, CompileResult] = {}
    errors: list[str] = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {s.number: pool.submit(compile_stage, s, None, traced) for s in stages}
        for number, fut in sorted(futures.items()):
            try:
                results[number] = fut.result()
                if verbose:
                    r = results[number]
                    print(f"  stage {number:02d}: {'cached' if r.cached else f'{r.seconds:.1f} s'}  {r.library.name}",
                          flush=True)
            except BuildError as err:
                errors.append(str(err))
    if errors:
        raise BuildError("\n\n".join(errors))
    return results


# --- the pybind11 binding -------------------------------------------------------------------------

def native_path() -> Path:
    import pybind11

    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    key = _key(NATIVE_SOURCE.read_text(), (lineage.ATTENTION_DIR / "common" / "abi.h").read_text(),
               (lineage.BACKWARD_DIR / "common" / "abi_backward.h").read_text(),
               pybind11.__version__, sys.version, nvcc_version())
    return build_dir() / f"_native-{key}{suffix}"


def build_native() -> Path:
    """Compile kernels/hopattn/native.cpp (host code only) into a Python extension module."""
    import pybind11

    target = native_path()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    includes = [pybind11.get_include(), sysconfig.get_paths()["include"], str(lineage.ATTENTION_DIR / "common"),
                str(lineage.BACKWARD_DIR / "common")]
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        tmp_target = Path(tmp) / target.name
        cmd = [nvcc(), "-O2", "-std=c++17", "-shared", "-Xcompiler=-fPIC,-fvisibility=hidden",
               *[f"-I{i}" for i in includes], "-o", str(tmp_target), str(NATIVE_SOURCE), "-ldl"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"binding: build failed ({' '.join(cmd)})\n{proc.stdout}{proc.stderr}")
        os.replace(tmp_target, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hopattn.build", description=__doc__.splitlines()[0])
    parser.add_argument("stages", nargs="*", help="stage numbers or ranges (1 3-5); default: all")
    parser.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes")
    parser.add_argument("--no-native", action="store_true", help="skip the pybind11 binding")
    parser.add_argument("--traced", action="store_true",
                        help="the traced builds (trace points on, for python -m bench.trace) instead")
    args = parser.parse_args(argv)
    try:
        stages = lineage.select(lineage.discover(), args.stages)
    except ValueError as err:
        parser.error(str(err))
    start = time.perf_counter()
    print(f"building {len(stages)} stage(s) into {build_dir()} with {nvcc_version()}", flush=True)
    try:
        build_stages(stages, args.jobs, verbose=True, traced=args.traced)
        if not args.no_native:
            print(f"  binding: {build_native().name}", flush=True)
    except BuildError as err:
        print(err, file=sys.stderr)
        return 1
    print(f"done in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
