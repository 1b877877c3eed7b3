"""Static analysis of the trace recorder variants (no GPU needed).

    PYTHONPATH=$PWD/kernels:$PWD python3 research/trace_variants/static_counts.py --stages 12,14,15,19,21 --variants current,events,smem

For each stage: compiles plain, traced with the current recorder, and traced with each variant
(nvcc -cubin, the stage's own flags with the -include swapped), then reports for the consumer main
loop (hopattn.compiler.sass.main_loop) of every kernel function:
  static  instructions in the loop body;
  idle    instructions executed per iteration by a warp that records nothing: the body minus the
          spans a trace guard branch skips (a forward conditional BRA inside the body whose skipped
          span holds a STG: the record; the branch itself and BSSY/BSYNC count as executed);
  full    instructions executed by a warp recording everything: the whole body.
The stage's own branches in the loop (retry loops placed out of line, `if` blocks) are counted as
if their code ran, in the plain build too, so idle - plain and full - plain are what tracing adds.
Also registers per thread and spill bytes from ptxas -v, and the highest register the loop uses.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import re
import subprocess
import sys
from pathlib import Path

from hopattn import build, lineage
from hopattn.compiler import sass

HERE = Path(__file__).resolve().parent
CURRENT = lineage.TRACE_RECORDER
OUT = Path("/tmp/tv_static")


def recorder_path(variant: str) -> Path | None:
    if variant == "plain":
        return None
    return CURRENT if variant == "current" else HERE / f"recorder_{variant}.cuh"


def flags(stage, recorder: Path | None) -> list[str]:
    f = build.nvcc_flags(stage, traced=recorder is not None)
    f = [x for x in f if x not in ("-shared",) and not x.startswith("-Xcompiler")]
    if recorder is not None:
        f[f.index("-include") + 1] = str(recorder)
    return f + ["-cubin"]


def compile_cubin(stage, variant: str) -> tuple[Path, str]:
    OUT.mkdir(exist_ok=True)
    target = OUT / f"{stage.number:02d}-{variant}.cubin"
    cmd = [build.nvcc(), *flags(stage, recorder_path(variant)), "-o", str(target), str(stage.kernel_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    return target, proc.stdout + proc.stderr


def ptxas_facts(log: str) -> dict[str, dict]:
    facts, current = {}, None
    for line in log.splitlines():
        if m := re.search(r"Function properties for (\S+)", line):
            current = facts.setdefault(m.group(1), {})
        elif current is not None and (m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            current["spill"] = int(m.group(1)) + int(m.group(2))
        elif current is not None and (m := re.search(r"Used (\d+) registers", line)):
            current["regs"] = int(m.group(1))
    return facts


def skipped_spans(body) -> list[tuple[int, int]]:
    """(first, last) addresses a trace guard skips: forward conditional branch within the body over
    a span that holds a global store."""
    addrs = [i.addr for i in body]
    spans = []
    for k, ins in enumerate(body):
        target = sass.branch_target(ins)
        if target is None or not ins.pred or target <= ins.addr or target > addrs[-1]:
            continue
        span = [i for i in body[k + 1:] if i.addr < target]
        if any(i.key == "STG" for i in span):
            spans.append((span[0].addr, span[-1].addr))
    return spans


def loop_counts(instrs) -> dict:
    lp = sass.main_loop(instrs)
    if lp is None:
        return {}
    body = [i for i in lp.body if i.opcode != "NOP"]
    spans = skipped_spans(body)
    skipped = {i.addr for i in body for a, b in spans if a <= i.addr <= b}
    regs = [int(r) for i in body for r in re.findall(r"\bR(\d+)\b", i.operands)]
    return {"static": len(body), "idle": len(body) - len(skipped), "full": len(body),
            "guards": len(spans), "stg": sum(i.key == "STG" for i in body),
            "clock": sum("SR_CLOCKLO" in i.operands for i in body),
            "bssy": sum(i.key in ("BSSY", "BSYNC") for i in body), "max_reg": max(regs, default=-1) + 1}


def analyse(stage, variant: str) -> dict:
    cubin, log = compile_cubin(stage, variant)
    fns = sass.parse_sass("arch = sm_90a\n" + sass.dump_sass(cubin))
    facts = ptxas_facts(log)
    return {name: {**loop_counts(ins), **facts.get(name, {})} for name, ins in fns.items()}


def short(fn: str) -> str:
    m = re.search(r"I(L[^E]*)E", fn)  # the template arguments, e.g. Lb0 (non-causal) / Lb1
    return m.group(1)[:12] if m else fn[-12:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--stages", default="12,14,15,19,21")
    p.add_argument("--variants", default="current,events,smem")
    p.add_argument("--json", default=str(HERE / "static_counts.json"))
    p.add_argument("--jobs", type=int, default=2)
    a = p.parse_args(argv)
    stages = {s.number: s for s in lineage.discover()}
    wanted = [stages[int(n)] for n in a.stages.split(",")]
    variants = ["plain", *a.variants.split(",")]
    with cf.ThreadPoolExecutor(a.jobs) as pool:
        futs = {(s.number, v): pool.submit(analyse, s, v) for s in wanted for v in variants}
        results = {k: f.result() for k, f in futs.items()}
    out = {}
    print(f"{'stage':>5} {'variant':8} {'function':>12} {'static':>6} {'idle':>5} {'full':>5} "
          f"{'+idle':>5} {'+full':>5} {'guards':>6} {'bssy':>4} {'regs':>4} {'spill':>5} {'maxR':>4}")
    for s in wanted:
        for v in variants:
            for fn, c in sorted(results[(s.number, v)].items()):
                base = results[(s.number, "plain")].get(fn, {})
                if not c.get("static"):
                    continue
                di, df = c["idle"] - base.get("idle", 0), c["full"] - base.get("full", 0)
                print(f"{s.number:5d} {v:8} {short(fn):>12} {c['static']:6d} {c['idle']:5d} {c['full']:5d} "
                      f"{di:+5d} {df:+5d} {c['guards']:6d} {c['bssy']:4d} {c.get('regs', -1):4d} "
                      f"{c.get('spill', -1):5d} {c['max_reg']:4d}")
                out.setdefault(s.number, {}).setdefault(v, {})[fn] = c
    Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
