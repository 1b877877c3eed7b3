"""Finds and runs the CUDA binary tools the compiler facts need besides nvcc: cuobjdump (SASS of a
stage library), nvdisasm (source lines of that SASS) and c++filt (readable kernel signatures).

cuobjdump and nvdisasm come with a CUDA toolkit or from pip (``nvidia-cuda-cuobjdump``,
``nvidia-cuda-nvdisasm``; CUDA 13 wheels put them in ``nvidia/cu13/bin``); neither needs a GPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache
from pathlib import Path


class ToolError(RuntimeError):
    """A tool is missing or failed; the message says which and how to get it."""


def _pip_cuda_bin() -> list[Path]:
    try:
        import nvidia.cu13  # type: ignore  # namespace package of the CUDA 13 pip wheels
    except ImportError:
        return []
    return [Path(p) / "bin" for p in nvidia.cu13.__path__]


@cache
def find_tool(name: str) -> str | None:
    """$<NAME> (e.g. $CUOBJDUMP), PATH, next to nvcc, $CUDA_HOME/bin, then the pip wheels."""
    candidates = [os.environ.get(name.upper().replace("+", "X")), shutil.which(name)]
    from hopattn import build

    try:
        candidates.append(str(Path(build.nvcc()).resolve().parent / name))
    except build.BuildError:  # no nvcc: the other places may still have the tool
        pass
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(str(Path(home) / "bin" / name))
    candidates += [str(d / name) for d in _pip_cuda_bin()]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


def cuobjdump() -> str:
    path = find_tool("cuobjdump")
    if path is None:
        raise ToolError("cuobjdump not found: `pip install nvidia-cuda-cuobjdump` (or install the CUDA "
                        "toolkit, or point $CUOBJDUMP at it)")
    return path


def nvdisasm() -> str:
    path = find_tool("nvdisasm")
    if path is None:
        raise ToolError("nvdisasm not found: `pip install nvidia-cuda-nvdisasm` (or install the CUDA "
                        "toolkit, or point $NVDISASM at it)")
    return path


@cache
def tool_version(path: str) -> str:
    """The 'V13.0.88'-style release of a CUDA tool."""
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout
    for word in reversed(out.split()):
        if word.startswith("V") and word[1:2].isdigit():
            return word.rstrip(",")
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def dump_sass(library: Path, arch: str = "sm_90a") -> str:
    """``cuobjdump -sass`` of one architecture's code in a library (other archs are not disassembled)."""
    proc = subprocess.run([cuobjdump(), "-sass", "-arch", arch, str(library)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ToolError(f"cuobjdump failed on {library}: {proc.stderr.strip()}")
    return proc.stdout


def demangle(names: list[str]) -> dict[str, str]:
    """Mangled -> readable names; names stay as they are where c++filt is missing."""
    path = find_tool("c++filt")
    if not names or path is None:
        return {n: n for n in names}
    out = subprocess.run([path, *names], capture_output=True, text=True, check=False).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}
