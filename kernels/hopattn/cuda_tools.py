"""Finds the CUDA command-line tools: nvcc (the build), cuobjdump and nvdisasm (the SASS of the
compiler facts) and c++filt (readable kernel signatures). None of them needs a GPU.

Each comes with a CUDA toolkit or from pip (``nvidia-cuda-nvcc``, ``nvidia-cuda-cuobjdump``,
``nvidia-cuda-nvdisasm``; CUDA 13 wheels put them in ``nvidia/cu13/bin``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

PIP_PACKAGES = {"nvcc": "nvidia-cuda-nvcc", "cuobjdump": "nvidia-cuda-cuobjdump", "nvdisasm": "nvidia-cuda-nvdisasm"}


class ToolError(RuntimeError):
    """A tool is missing or failed; the message says which and how to get it."""


def _pip_cuda_bins() -> list[Path]:
    try:
        import nvidia.cu13  # type: ignore  # namespace package of the CUDA 13 pip wheels
    except ImportError:
        return []
    return [Path(p) / "bin" for p in nvidia.cu13.__path__]


@cache
def find(name: str) -> str | None:
    """$<NAME> (e.g. $NVCC, $CUOBJDUMP, $CXXFILT), PATH, next to nvcc, $CUDA_HOME/bin, $CUDA_PATH/bin,
    /usr/local/cuda/bin, then the pip wheels; None when it is nowhere."""
    candidates = [os.environ.get(name.upper().replace("+", "X")), shutil.which(name)]
    if name != "nvcc" and (nvcc := find("nvcc")):
        candidates.append(str(Path(nvcc).resolve().parent / name))
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(str(Path(home) / "bin" / name))
    candidates += [str(d / name) for d in _pip_cuda_bins()]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


def require(name: str) -> str:
    """The tool's path, or ToolError saying how to install it."""
    path = find(name)
    if path is None:
        pip = f"`pip install {PIP_PACKAGES[name]}`, or " if name in PIP_PACKAGES else ""
        raise ToolError(f"{name} not found: {pip}install the CUDA toolkit, or point "
                        f"${name.upper().replace('+', 'X')} at it")
    return path


@cache
def version(path: str) -> str:
    """The 'V13.0.88'-style release of a CUDA tool."""
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout
    for word in reversed(out.split()):
        if word.startswith("V") and word[1:2].isdigit():
            return word.rstrip(",")
    return out.strip().splitlines()[-1] if out.strip() else "unknown"
