"""Stage 24 is stage 23 with the head dim a template parameter: one kernel per head dim (64, 96,
128, 192 with V 128, 256), each within its register budget. Both stages compile (nvcc, no GPU)
with the project's flags; the head-dim-128 kernels of stage 24 are stage 23's kernels, every
instruction and its encoding (only their names differ: the head dim is a template argument), and
ptxas spills nothing in any of the ten."""

from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
from hopattn import build, cuda_tools, lineage
from hopattn.compiler.ptxas import parse_ptxas

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]  # stage 24's ten kernels: about 15 s of ptxas on two cores

ARCH = "sm_90a"
_KERNEL_RE = re.compile(r"^_Z16attention_kernelI(?:Li(\d+)E)?Lb([01])E")


def _tool_or_skip(name: str) -> str:
    try:
        return cuda_tools.require(name)
    except cuda_tools.ToolError as err:
        pytest.skip(str(err))


def _compile(s, out_dir, nvcc: str, cuobjdump: str) -> tuple[dict[str, list[str]], str]:
    """({function: its SASS lines, instruction and encoding}, the ptxas report) of a fatbin of the
    stage's own flags, less the shared library's (the device code is the same)."""
    fatbin = out_dir / f"{s.dir.name}.fatbin"
    flags = [f for f in build.nvcc_flags(s) if f not in ("-shared", "-Xcompiler=-fPIC,-fvisibility=hidden")]
    proc = subprocess.run([nvcc, *flags, "-fatbin", "-o", str(fatbin), str(s.kernel_path)],
                          check=True, capture_output=True, text=True)
    dump = subprocess.run([cuobjdump, "-sass", str(fatbin)], check=True, capture_output=True, text=True).stdout
    functions, current = {}, None
    for line in dump.splitlines():
        if m := re.search(r"Function : (\S+)", line):
            current = functions.setdefault(m.group(1), [])
        elif current is not None and "/*" in line:
            current.append(line.strip())
    return functions, proc.stdout + proc.stderr


def _by_head_dim(functions: dict) -> dict[tuple[int | None, str], str]:
    """(head dim or None for stage 23's, '0'/'1' the bool COMPUTED_ORDER) -> mangled name."""
    out = {}
    for name in functions:
        m = _KERNEL_RE.match(name)
        assert m, f"an entry function that is not attention_kernel: {name}"
        out[(int(m.group(1)) if m.group(1) else None, m.group(2))] = name
    return out


def test_stage_24_is_stage_23_at_head_dim_128_and_spills_nowhere(tmp_path):
    nvcc, cuobjdump = _tool_or_skip("nvcc"), _tool_or_skip("cuobjdump")
    s23, s24 = lineage.get_stage(23), lineage.get_stage(24)
    with ThreadPoolExecutor(max_workers=2) as pool:
        (old, _), (new, report) = pool.map(lambda s: _compile(s, tmp_path, nvcc, cuobjdump), (s23, s24))
    before, after = _by_head_dim(old), _by_head_dim(new)
    head_dims = sorted(d for d, _ in s24.head_dims)
    assert set(before) == {(None, "0"), (None, "1")}
    assert set(after) == {(d, b) for d in head_dims for b in "01"}, sorted(after)
    for order in "01":
        a, b = old[before[(None, order)]], new[after[(128, order)]]
        assert len(a) > 5000
        if a != b:
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            pytest.fail(f"attention_kernel<128, {order == '1'}> differs from stage 23's attention_kernel<"
                        f"{order == '1'}> ({len(a)} lines against {len(b)}; first at line {first}: "
                        f"{a[first] if first < len(a) else '-'!r} / {b[first] if first < len(b) else '-'!r})")
    resources = {fn: r for (arch, fn), r in parse_ptxas(report).items() if arch == ARCH}
    assert set(resources) == set(new)
    for (d, order), name in sorted(after.items()):
        r = resources[name]
        c = s24.constants(d)
        assert (r.spill_stores, r.spill_loads, r.stack_frame) == (0, 0, 0), f"head dim {d}, order {order}: spills"
        # ptxas reports the count at entry, the launch bounds' 65536 / threads rounded down to 8; the
        # consumers then run with setmaxnreg's CONSUMER_REGS
        assert r.registers == min(255, 65536 // c["NUM_THREADS"] // 8 * 8), (d, r.registers)
        highest = max(int(x) for line in new[name] for x in re.findall(r"\bR(\d+)\b", line))
        assert highest < c["CONSUMER_REGS"], (d, highest)
