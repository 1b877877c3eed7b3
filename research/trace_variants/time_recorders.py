"""Times the trace recorder variants on a GPU (H200): plain vs traced-recording vs traced-idle.

    PYTHONPATH=$PWD/kernels:$PWD python3 research/trace_variants/time_recorders.py \
        --stages 12,14,19,20 --variants current,flat,cursor,kind

For each stage: builds it plain and traced with each recorder (`current`: the committed
kernels/attention/common/trace_recorder.cuh; NAME: research/trace_variants/recorder_NAME.cuh),
cached in $HOPATTN_BUILD_DIR like hopattn.build does; checks the traced output equals the plain
output bit for bit and that the records of one traced launch decode sensibly (against the current
recorder's records where it ran too); then times plain / traced (kind masks of bench.trace.kind_masks)
/ traced recording nothing, interleaved over ROUNDS rounds of LAUNCHES launches (medians), in one
process. One line per stage x variant. Each case runs under a watchdog (--limit seconds).
Non-causal, bench.trace's shape (8k), MAX_CTAS and records per warp.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import signal
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hopattn import build, lineage
from hopattn.records import runs, traces

from bench import trace as bt

HERE = Path(__file__).resolve().parent
ROUNDS, LAUNCHES = 5, 10


def recorder_path(variant: str) -> Path:
    return lineage.TRACE_RECORDER if variant == "current" else HERE / f"recorder_{variant}.cuh"


def recorder_hash(path: Path) -> str:
    h = hashlib.sha256(path.read_bytes())
    if path.parent == HERE:  # the variants include recorder_impl.cuh
        h.update((HERE / "recorder_impl.cuh").read_bytes())
    return h.hexdigest()[:16]


def compile_traced(stage: lineage.Stage, variant: str) -> Path:
    """hopattn.build.compile_stage(traced=True) with the -include swapped (same flags otherwise)."""
    if variant == "current":
        return build.compile_stage(stage, traced=True).library
    rec = recorder_path(variant)
    flags = build.nvcc_flags(stage, traced=True)
    flags[flags.index("-include") + 1] = str(rec)
    key = build._key(stage.source_hash(), " ".join(flags), build.nvcc_version(), recorder_hash(rec))
    target = build.build_dir() / f"stage{stage.id}-{stage.slug}-traced-{variant}-{key}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    import subprocess
    proc = subprocess.run([build.nvcc(), *flags, "-o", str(tmp), str(stage.kernel_path)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise build.BuildError(f"stage {stage.id} / {variant}: nvcc failed\n{proc.stdout}{proc.stderr}")
    spill = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines()
             if "spill" in ln and not ln.strip().startswith("0 bytes stack frame, 0 bytes spill stores")]
    if spill:
        print(f"  note: stage {stage.id} / {variant}: ptxas: {'; '.join(spill)}", flush=True)
    os.replace(tmp, target)
    return target


class Watchdog(Exception):
    case = ""


def _alarm(signum, frame):
    raise Watchdog(Watchdog.case)


def _hard_stop(case: str) -> None:
    """A hung kernel blocks the CUDA call, where no Python signal handler runs: name the case, exit."""
    print(f"WATCHDOG: {case} (hung in a CUDA call, exiting)", file=sys.stderr, flush=True)
    os._exit(3)


def check_records(stage, records, bases, infos, warps, per_warp, masks, gaps_ok=False) -> str:
    """records: [slots][warps][capacity][4] int32. 'ok' or the problems found. Walks each warp's rows
    as the decoder does: an event record is one row, a step record (0xff) three."""
    import numpy as np
    if len(records) == 0:
        return "no CTA recorded"
    r = records.astype(np.int64) & 0xFFFFFFFF
    problems = []
    for slot in range(len(records)):
        for w in range(warps):
            rows = r[slot, w]
            k = 0
            while k < len(rows) and rows[k, 0] & 0xFF:
                kind = int(rows[k, 0] & 0xFF)
                if kind == traces.STAMP_MARK:
                    k += 3
                    continue
                if kind > len(traces.EVENTS):
                    problems.append(f"slot {slot} warp {w} row {k}: unknown event {kind}")
                elif ((int(rows[k, 3]) - int(rows[k, 2])) & 0xFFFFFFFF) > 0x7FFFFFFF:  # modulo 2^32
                    problems.append(f"slot {slot} warp {w} row {k}: start > end")
                k += 1
            if k > per_warp:
                problems.append(f"slot {slot} warp {w}: {k} rows > {per_warp} per warp")
            if not gaps_ok and np.count_nonzero(rows[k:, 0] & 0xFF):
                problems.append(f"slot {slot} warp {w}: records after the first empty row")
            if not masks[w] and k:
                problems.append(f"warp {w} records nothing but wrote {k} rows")
    if not np.count_nonzero(r[0, :, :, 0] & 0xFF):
        problems.append("slot 0: no warp wrote a record")
    try:
        events, _ = traces.decode(records, bases, infos, 1000.0)
        if not events:
            problems.append("nothing decoded")
        elif any(e[5] > e[6] for e in events):
            problems.append("decoded start > end")
    except Exception as err:  # noqa: BLE001
        problems.append(f"decode failed: {err}")
    return "ok" if not problems else "; ".join(problems[:3])


def is_diagnostic(variant: str) -> bool:
    """A recorder that keeps no trace, only some of its cost (its file says so on its first line):
    timed, its records not compared."""
    return variant != "current" and recorder_path(variant).read_text().startswith("// Diagnostic")


def decoded_keys(records, bases) -> dict[int, list]:
    """Slot 0's decoded events per warp, (event, tile, kv) in order, for output tiles 0 and 1."""
    if len(records) == 0:
        return {}
    base = int(bases[0][0])
    return {w: sorted((e[0], e[1], e[2]) for e in traces._warp_events(rows, base, base) if 0 <= e[1] <= 1)
            for w, rows in enumerate(records[0])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stages", default="12,14,19,20")
    p.add_argument("--variants", default="current,flat,cursor,kind")
    p.add_argument("--limit", type=int, default=40, help="seconds per stage x variant (watchdog)")
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--launches", type=int, default=LAUNCHES)
    p.add_argument("--build-only", action="store_true", help="compile everything, no GPU")
    a = p.parse_args(argv)
    all_stages = {s.number: s for s in lineage.discover()}
    stages = [all_stages[int(n)] for n in a.stages.split(",")]
    variants = a.variants.split(",")
    for v in variants:
        if not recorder_path(v).is_file():
            p.error(f"no recorder for variant {v!r}: {recorder_path(v)}")
    t0 = time.perf_counter()

    # Builds first, in parallel (cached): plain and every traced variant.
    jobs = [(s, None) for s in stages] + [(s, v) for s in stages for v in variants]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as pool:
        futs = {(s.number, v): pool.submit(lambda s=s, v=v: build.compile_stage(s).library if v is None
                                           else compile_traced(s, v)) for s, v in jobs}
        libs = {k: f.result() for k, f in futs.items()}
    print(f"[{time.perf_counter() - t0:5.1f}s] built {len(libs)} libraries in {build.build_dir()}", flush=True)
    if a.build_only:
        return 0

    import torch
    from hopattn import api
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    native = api._native()
    signal.signal(signal.SIGALRM, _alarm)
    failures = 0
    print(f"{'stage':>5} {'variant':>8} {'plain ms':>9} {'traced ms':>9} {'idle ms':>9} {'traced %':>8} "
          f"{'idle %':>7}  output records", flush=True)
    for stage in stages:
        warps = stage.threads // 32
        shape = bt.SHAPE
        gen = torch.Generator(device="cuda").manual_seed(stage.number)
        q, k, v = ((torch.randn(shape.batch, shape.heads, shape.len_q, 128, generator=gen, device="cuda") * 2)
                   .to(torch.bfloat16) for _ in range(3))
        out = torch.empty_like(q)
        plain = native.StageLibrary(str(libs[(stage.number, None)]))
        run_plain = bt._launcher(torch, plain, q, k, v, out, False)
        run_plain()
        torch.cuda.synchronize()
        expected = out.clone()
        reference_keys = None
        for variant in variants:
            case = f"stage {stage.id} / {variant}"
            Watchdog.case = f"{case}: over the {a.limit} s limit"
            signal.alarm(a.limit)
            hard = threading.Timer(a.limit + 15, _hard_stop, (Watchdog.case,))
            hard.daemon = True
            hard.start()
            try:
                traced = native.StageLibrary(str(libs[(stage.number, variant)]))
                capacity = traced.trace_capacity()
                per_warp = bt.records_per_warp(stage, capacity)
                masks = bt.kind_masks(stage)
                events = torch.zeros(bt.MAX_CTAS * warps * capacity * 4, dtype=torch.int32, device="cuda")
                base = torch.zeros(2 * bt.MAX_CTAS * 2, dtype=torch.int64, device="cuda")  # starts, last epilogues
                info = torch.zeros(bt.MAX_CTAS * 2, dtype=torch.int32, device="cuda")
                control = torch.tensor([0, per_warp, *masks], dtype=torch.int64).to(torch.int32).cuda()
                slots = control[:1]
                traced.trace_setup(events.data_ptr(), base.data_ptr(), info.data_ptr(), control.data_ptr(),
                                   bt.MAX_CTAS, warps, bt.TARGET_SM)
                run_traced = bt._launcher(torch, traced, q, k, v, out, False)
                out.zero_()
                run_traced()
                torch.cuda.synchronize()
                same = torch.equal(out, expected)
                # one launch's records
                for buf in (events, base, info, slots):
                    buf.zero_()
                run_traced()
                torch.cuda.synchronize()
                used = min(int(slots.item()), bt.MAX_CTAS)
                records = events.view(bt.MAX_CTAS, warps, capacity, 4)[:used].cpu().numpy()
                bases = base.view(2, bt.MAX_CTAS, 2)[0, :used].cpu().tolist()
                infos = info.view(bt.MAX_CTAS, 2)[:used].cpu().tolist()
                verdict = check_records(stage, records, bases, infos, warps, per_warp, masks,
                                              gaps_ok=variant == "direct")
                # the same decoded events (event, tile, K/V step) per warp as the current recorder in
                # the first two output tiles of slot 0 (a step record may sit before or after the event
                # records of its step: the decoder orders by time). Diagnostic variants record no
                # steps: their records are not compared, only their times count.
                if is_diagnostic(variant):
                    verdict = "diagnostic"
                elif variant == "current":
                    reference_keys = decoded_keys(records, bases)
                elif reference_keys is not None and verdict == "ok":
                    got = decoded_keys(records, bases)
                    diff = sum(1 for w in reference_keys if reference_keys[w] != got.get(w))
                    if diff:
                        verdict = f"decoded events differ from current in {diff} of {len(reference_keys)} warps"
                full = control[2:].clone()
                idle = torch.zeros_like(full)

                def run_idle(control=control, idle=idle, full=full, run_traced=run_traced):  # this case's
                    control[2:] = idle
                    run_traced()
                    control[2:] = full

                plain_ms, traced_ms, idle_ms = [], [], []
                for _ in range(a.rounds):
                    plain_ms.append(bt._median_ms(torch, run_plain, n=a.launches))
                    traced_ms.append(bt._median_ms(torch, run_traced, before=slots.zero_, n=a.launches))
                    idle_ms.append(bt._median_ms(torch, run_idle, before=slots.zero_, n=a.launches))
                pm, tm, im = (statistics.median(x) for x in (plain_ms, traced_ms, idle_ms))
                ok = same and verdict in ("ok", "diagnostic")
                failures += not ok
                print(f"{stage.number:5d} {variant:>8} {pm:9.3f} {tm:9.3f} {im:9.3f} {100 * (tm / pm - 1):+8.1f} "
                      f"{100 * (im / pm - 1):+7.1f}  {'same' if same else 'DIFFERS'} {verdict}"
                      f"  [{time.perf_counter() - t0:.0f}s]", flush=True)
            except Watchdog as err:
                failures += 1
                print(f"{stage.number:5d} {variant:>8} WATCHDOG: {err}", flush=True)
                torch.cuda.synchronize()  # if the kernel hangs here, the hard timer ends the process
            except Exception as err:  # noqa: BLE001
                failures += 1
                print(f"{stage.number:5d} {variant:>8} FAILED: {type(err).__name__}: {err}", flush=True)
            finally:
                signal.alarm(0)
                hard.cancel()
    print(f"done in {time.perf_counter() - t0:.1f} s, {failures} case(s) failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    print(runs.log_header(runs.script_command()), flush=True)  # first: a log kept under bench/logs says what made it
    sys.exit(main())
