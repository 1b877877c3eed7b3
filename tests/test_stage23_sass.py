"""Stage 23 is stage 22 organised by role: the same machine code. Both stages compile (nvcc, no GPU)
with the project's flags, and the SASS of their kernels, every instruction and its encoding, is the
same, and so are the kernels' names."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
from hopattn import build, cuda_tools, lineage

pytestmark = pytest.mark.nvcc

STAGES = {s.number: s for s in lineage.discover()}


def _tool_or_skip(name: str) -> str:
    try:
        return cuda_tools.require(name)
    except cuda_tools.ToolError as err:
        pytest.skip(str(err))


def _sass(stage: lineage.Stage, out_dir, nvcc: str, cuobjdump: str) -> list[str]:
    """The kernels' names and their instructions with encodings: `cuobjdump -sass` less its header,
    whose `identifier` is the source's path (the one thing that must differ)."""
    fatbin = out_dir / f"{stage.dir.name}.fatbin"
    # A fatbin of the stage's own flags, less the shared library's (the device code is the same).
    flags = [f for f in build.nvcc_flags(stage) if f not in ("-shared", "-Xcompiler=-fPIC,-fvisibility=hidden")]
    subprocess.run([nvcc, *flags, "-fatbin", "-o", str(fatbin), str(stage.kernel_path)],
                   check=True, capture_output=True, text=True)
    dump = subprocess.run([cuobjdump, "-sass", str(fatbin)], check=True, capture_output=True, text=True).stdout
    return [line.strip() for line in dump.splitlines() if "/*" in line or "Function :" in line]


def test_stage_23_compiles_to_the_sass_of_stage_22(tmp_path):
    nvcc, cuobjdump = _tool_or_skip("nvcc"), _tool_or_skip("cuobjdump")
    before, after = STAGES[22], STAGES[23]
    assert after.dir.name.startswith("23_") and before.dir.name.startswith("22_")
    with ThreadPoolExecutor(max_workers=2) as pool:
        old, new = pool.map(lambda s: _sass(s, tmp_path, nvcc, cuobjdump), (before, after))
    kernels = [line for line in old if "Function :" in line]
    assert len(kernels) == 2 and len(old) > 10_000  # attention_kernel<true> and <false>, whole
    if new != old:
        first = next(i for i, (a, b) in enumerate(zip(old, new)) if a != b) if len(old) == len(new) else None
        where = f"first at line {first}: {old[first]!r} / {new[first]!r}" if first is not None else (
            f"{len(old)} lines against {len(new)}")
        pytest.fail(f"stage 23's SASS differs from stage 22's ({sum(a != b for a, b in zip(old, new))} lines; {where})")
