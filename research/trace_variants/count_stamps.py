"""Static cost of boundary stamps (no GPU): stage 21's unmasked consumer loop, plain, traced with the
first recorder (research/trace_variants/recorder_events.cuh: a record per event), and traced with
common/trace_recorder.cuh (the same trace points, recorded as boundary stamps, the recorder since
2026-12-01). Counts the instructions one iteration executes on the common path: a
warp recording every event, no O rescale, no slow path of the deferred maximum (the branch after
each vote and the branch around the rescale's FMULs are taken; every other forward branch falls
through, so the current recorder's records all run). Also ptxas's spills.

    PYTHONPATH=$PWD/kernels:$PWD python3 research/trace_variants/count_stamps.py
"""
from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from hopattn import build, lineage
from hopattn.compiler import sass

HERE = Path(__file__).resolve().parent


def compile_cubin(kernel: Path, recorder: Path | None, out: Path) -> str:
    stage = lineage.load_stage(lineage.ATTENTION_DIR / "21_deferred-max")
    flags = build.nvcc_flags(stage, traced=recorder is not None)
    if recorder is not None:
        flags[flags.index("-include") + 1] = str(recorder)
    proc = subprocess.run([build.nvcc(), *flags, "-o", str(out), str(kernel)], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stdout + proc.stderr)
    return proc.stdout + proc.stderr


def common_path(body: list) -> int:
    at = {ins.addr: k for k, ins in enumerate(body)}
    k = executed = 0
    while k < len(body):
        ins = body[k]
        executed += 1
        target = at.get(int(ins.operands.split(",")[-1].strip(), 16)) if ins.opcode == "BRA" and ins.pred else None
        if target is not None and target > k:
            after_vote = k > 0 and body[k - 1].opcode.startswith("VOTE")
            fmuls = sum(1 for i in body[k + 1:target] if i.opcode == "FMUL")
            if after_vote or fmuls >= 32:
                k = target
                continue
        k += 1
    return executed


def main() -> int:
    work = Path(tempfile.mkdtemp())
    stage21 = lineage.ATTENTION_DIR / "21_deferred-max" / "kernel.cu"
    builds = {"plain": None, "a record per event": HERE / "recorder_events.cuh", "boundary stamps": lineage.TRACE_RECORDER}
    base = None
    for name, recorder in builds.items():
        cubin = work / f"{name.replace(' ', '_')}.so"
        log = compile_cubin(stage21, recorder, cubin)
        spills = re.findall(r"(\d+) bytes spill stores", log)
        fn_name, ins = next(iter(sass.parse_sass(sass.dump_sass(cubin)).items()))  # the non-causal kernel
        # The K/V loops: a loop with the QK's and PV's 16 HGMMA and a vote; the outer tile loop holds them all.
        kv_loops = [lp.body for lp in sass.loops(ins)
                    if sum(i.opcode.startswith("HGMMA") for i in lp.body) == 16 and any(i.opcode.startswith("VOTE") for i in lp.body)]
        body = kv_loops[0]  # the unmasked loop comes first in the kernel
        n = common_path(body)
        base = base or n
        print(f"{name:18s} unmasked K/V loop {len(body):5d} static, {n:4d} executed per iteration "
              f"({(n - base) / base * 100:+5.1f} %), spill stores {'/'.join(spills)} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
