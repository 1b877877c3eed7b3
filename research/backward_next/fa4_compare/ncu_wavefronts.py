"""Shared-memory wavefronts and stall samples per opcode, per CTA step, from Nsight Compute's source pages.

    python3 research/backward_next/fa4_compare/ncu_wavefronts.py

Reads research/backward_next/ncu-source-fa4-backward.csv.gz (FA4: section 0 non-causal, 1 causal) and
ncu-source-07-08-mask-select.csv.gz (section 1 = stage 08), all at B 4, H 16, 8k, d 128. Steps per
launch: FA4 non-causal 4096 CTAs x 103 query blocks of 80; FA4 causal 64 heads x 4160 blocks of 64;
stage 08 4096 x 128 blocks of 64. TMA traffic (UTMALDG, UBLKRED) is not in these counters.
"""
import collections
import csv
import gzip
import pathlib
import re

HERE = pathlib.Path(__file__).resolve().parent.parent
RUNS = [("ncu-source-fa4-backward.csv.gz", 0, "FA4 non-causal (80 x 128)", 4096 * 103),
        ("ncu-source-fa4-backward.csv.gz", 1, "FA4 causal (64 x 128)", 64 * 4160),
        ("ncu-source-07-08-mask-select.csv.gz", 1, "stage 08 non-causal (64 x 128)", 4096 * 128)]


def sections(path):
    secs, hdr = [], None
    with gzip.open(path, "rt") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                secs.append([])
                hdr = None
            elif row[0] == "Address":
                hdr = row
            else:
                secs[-1].append(dict(zip(hdr, row)))
    return secs


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


for name, sec, label, steps in RUNS:
    rows = sections(HERE / name)[sec]
    total = sum(num(r["Warp Stall Sampling (All Samples)"]) for r in rows)
    ops = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for r in rows:
        src = re.sub(r"^@!?U?P\w+\s+", "", r["Source"].strip())
        op = src.split()[0] if src else "?"
        o = ops[op]
        o[0] += num(r["Instructions Executed"])
        o[1] += num(r["L1 Wavefronts Shared"])
        o[2] += num(r["Warp Stall Sampling (All Samples)"])
        o[3] += num(r["stall_mio"])
    print(f"{label}: {steps} steps")
    for op, (inst, wf, smp, mio) in sorted(ops.items(), key=lambda kv: -kv[1][1]):
        if wf:
            print(f"  {op:26s} {inst / steps:7.1f} warp-instr/step  {wf / steps:7.1f} wavefronts/step  "
                  f"samples {smp / total * 100:4.1f} % (mio {mio / total * 100:3.1f} %)")
    print(f"  all instruction-issued shared wavefronts: {sum(o[1] for o in ops.values()) / steps:.0f} per step")
