"""Checks the SM clock a trace record converts with (GPU): for each given stage, the traced build's
launch as bench.trace records it, timed with CUDA events, against what its traced CTAs' clock64 and
%globaltimer say (their start and their last epilogue's end): the launch's own time, the CTAs' span
in global-timer nanoseconds and in cycles, and the clock those give. Run after bench.trace's timing
rounds' worth of launches, like the recorded launch.

    PYTHONPATH=$PWD/kernels:$PWD python3 research/trace_variants/clock_check.py 14 22
"""
import math
import sys

import torch
from hopattn import api, build, lineage
from hopattn.records import runs

from bench import trace as bt


def main(argv):
    native = api._native()
    for number in [int(a) for a in argv]:
        stage = lineage.get_stage(number)
        traced = native.StageLibrary(str(build.compile_stage(stage, traced=True).library))
        warps, cap = stage.threads // 32, traced.trace_capacity()
        s = bt.SHAPE
        q, k, v = (torch.randn(s.batch, s.heads, s.len_q, 128, device="cuda").to(torch.bfloat16) for _ in range(3))
        out = torch.empty_like(q)
        events = torch.zeros(bt.MAX_CTAS * warps * cap * 4, dtype=torch.int32, device="cuda")
        base = torch.zeros(2 * bt.MAX_CTAS * 2, dtype=torch.int64, device="cuda")
        info = torch.zeros(bt.MAX_CTAS * 2, dtype=torch.int32, device="cuda")
        control = torch.tensor([0, bt.records_per_warp(stage, cap), *bt.kind_masks(stage)],
                               dtype=torch.int64).to(torch.int32).cuda()
        traced.trace_setup(events.data_ptr(), base.data_ptr(), info.data_ptr(), control.data_ptr(), bt.MAX_CTAS,
                           warps, bt.TARGET_SM)
        run = bt._launcher(torch, traced, q, k, v, out, False)
        for _ in range(270):  # bench.trace's timing rounds: 9 x 3 x 10 launches
            control[:1].zero_()
            run()
        for trial in range(3):
            for b in (events, base, control[:1]):
                b.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            torch.cuda.synchronize()
            pairs = base.view(2, bt.MAX_CTAS, 2).cpu().tolist()
            (c0, n0), (c1, n1) = pairs[0][0], pairs[1][0]
            mhz = (c1 - c0) / (n1 - n0) * 1000 if n1 > n0 else math.nan
            print(f"stage {stage.id} launch {trial}: {start.elapsed_time(end):.3f} ms by CUDA events; slot 0 from "
                  f"its start to its last epilogue {(n1 - n0) / 1e6:.3f} ms by %globaltimer, {c1 - c0} cycles: "
                  f"{mhz:.0f} MHz; nvidia clock_rate now {torch.cuda.clock_rate()} MHz", flush=True)


if __name__ == "__main__":
    print(runs.log_header(runs.script_command()), flush=True)  # first: a log kept under bench/logs says what made it
    main(sys.argv[1:])
