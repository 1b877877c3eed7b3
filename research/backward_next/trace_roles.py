"""Sums a backward trace's events by warp role, per query-block step (CPU only; reads the JSON that
`python -m bench.trace --lineage backward` wrote):

    python3 research/backward_next/trace_roles.py bench/results/traces/nvidia-h200/backward/04-causal.json ...

Two views of the same record:
  - every event recorded (the record's `stats`: every traced CTA of the SM, every step): an event
    that a warp of a role records once per step, its total over (warps of the role x steps), i.e.
    the mean time one warp spends in it per step;
  - the window of the steady state the record keeps (`events`), per warp and step, as a check.
"""
import json
import sys
from collections import defaultdict

# Which events a warp of each role records (stages 03-06; a stage without a role's events has none).
CONSUMER = ["wait_qdo", "qk", "wait_qk", "softmax", "wait_dp", "ds", "dvdk", "wait_ds_free", "store_ds", "wait_ds",
            "dq", "wait_dq", "wait_dvdk", "wait_dq_read", "store_dq", "wait_turn", "add_dq", "wait_dq_done",
            "wait_step"]
LOADER = ["wait_empty", "load_q", "load_do"]
DQ_WARP = ["wait_dq_tile", "wait_turn", "add_dq", "wait_dq_done", "wait_dq_read"]
# What a consumer's step is made of: waiting on someone else, issuing/doing its own work.
WAITS = {"wait_qdo", "wait_qk", "wait_dp", "wait_ds_free", "wait_ds", "wait_dq", "wait_dvdk", "wait_dq_read",
         "wait_turn", "wait_dq_done", "wait_step"}


def per_step(record):
    stats = record["stats"]
    roles = record["roles"]
    compute_warps = sum(1 for r in roles if r.startswith("compute") or r == "consumer")
    steps = stats["qk"]["count"] / max(1, compute_warps)  # steps of all traced CTAs
    out = {"per_step_ns": record["per_step_ns"], "steps": steps, "consumer": {}, "producer": {}}
    for name in CONSUMER:
        if name in stats and stats[name]["count"] >= stats["qk"]["count"] * 0.9:
            out["consumer"][name] = stats[name]["total_ns"] / stats[name]["count"]
    for name in LOADER + DQ_WARP:
        if name in stats and name not in out["consumer"]:
            out["producer"][name] = stats[name]["total_ns"] / steps  # per step, all warps recording it
    return out


def window_per_warp(record):
    by = defaultdict(lambda: defaultdict(float))
    steps = defaultdict(set)
    for slot, warp, event, _tile, kv, t0, t1 in record["events"]:
        by[warp][event] += t1 - t0
        if kv >= 0:
            steps[warp].add((slot, kv))
    return {w: ({e: round(v / max(1, len(steps[w])), 1) for e, v in sorted(by[w].items())}, len(steps[w]))
            for w in sorted(by)}


def main(paths):
    for path in paths:
        record = json.load(open(path))
        r = per_step(record)
        print(f"{path}: stage {record['stage']} causal={record['causal']}, {r['per_step_ns']} ns per step, "
              f"{r['steps']:.0f} steps traced; roles {record['roles']}")
        total = sum(r["consumer"].values())
        waits = sum(v for k, v in r["consumer"].items() if k in WAITS)
        print(f"  consumer warp, mean per step: sum {total:.0f} ns, of it waiting {waits:.0f} ns "
              f"({100 * waits / total:.0f} %), working {total - waits:.0f} ns")
        for k, v in sorted(r["consumer"].items(), key=lambda kv: -kv[1]):
            print(f"    {k:14s} {v:7.1f} ns {'(wait)' if k in WAITS else ''}")
        if r["producer"]:
            print("  producer warps, per step:")
            for k, v in r["producer"].items():
                print(f"    {k:14s} {v:7.1f} ns")
        print("  window, per warp and step:")
        for w, (ev, n) in window_per_warp(record).items():
            print(f"    warp {w:2d} ({record['roles'][w]}, {n} steps): "
                  + ", ".join(f"{k} {v:.0f}" for k, v in ev.items()))



def tensor_idle(record, warps=(0, 4)):
    """Within the record's window: the share of time in which neither consumer warpgroup (its first
    warp stands for it) has a wgmma in flight — from the issue of Sᵀ and dPᵀ (qk) to dPᵀ retired
    (wait_dp), and from the issue of dV and dK (dvdk) to dQ retired (wait_dq; stage 07: to the next
    step's Sᵀ issue and dQ retired, the same end). A bubble of the tensor cores at least that long:
    in flight is not executing."""
    spans = []
    for w in warps:
        ev = sorted((e for e in record["events"] if e[0] == 0 and e[1] == w and e[4] >= 0), key=lambda e: e[5])
        open_at = None
        for _slot, _warp, name, _tile, _kv, t0, t1 in ev:
            if name in ("qk", "dvdk") and open_at is None:
                open_at = t0
            if name in ("wait_dp", "wait_dq") and open_at is not None:
                spans.append((open_at, t1))
                open_at = None
    if not spans:
        return None
    spans.sort()
    lo, hi = spans[0][0], max(s[1] for s in spans)
    busy, cur_s, cur_e = 0.0, *spans[0]
    for s, e in spans[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    return (hi - lo - busy) / (hi - lo), hi - lo


def gaps(record, warps=(0, 4), least_ns=20.0):
    """The windows (of slot 0, in the record's window) in which neither consumer has a wgmma in
    flight, as (ns, the span that opens it: warpgroup, op, step)."""
    spans = []
    for w in warps:
        ev = sorted((e for e in record["events"] if e[0] == 0 and e[1] == w and e[4] >= 0), key=lambda e: e[5])
        open_at = None
        for _slot, _warp, name, _tile, kv, t0, t1 in ev:
            if name in ("qk", "dvdk") and open_at is None:
                open_at = (t0, name, kv)
            if name in ("wait_dp", "wait_dq") and open_at is not None:
                spans.append((open_at[0], t1, w // 4, open_at[1], open_at[2]))
                open_at = None
    spans.sort()
    out, end = [], spans[0][1] if spans else 0.0
    for s in spans[1:]:
        if s[0] > end + least_ns:
            out.append((s[0] - end, s[2], s[3], s[4]))
        end = max(end, s[1])
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
    for path in sys.argv[1:]:
        record = json.load(open(path))
        got = tensor_idle(record)
        if got:
            print(f"{path}: no wgmma in flight in either consumer {100 * got[0]:.0f} % of {got[1]:.0f} ns (slot 0)")
            for ns, wg, op, kv in gaps(record):
                print(f"    {ns:5.0f} ns before consumer {wg}'s {op} of step {kv}")
