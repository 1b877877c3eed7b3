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


def _computing(role):
    """A warp that computes: "compute*" (stages 03-05), "consumer0" and "consumer1" (06 on)."""
    return role.startswith("compute") or role.startswith("consumer")


def per_step(record):
    stats = record["stats"]
    roles = record["roles"]
    compute_warps = sum(1 for r in roles if _computing(r))
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



def consumer_leads(record):
    """The first warp of each computing warpgroup (stages 03-05: warps 0 and 4; 06 on: 4 and 8)."""
    computing = [i for i, r in enumerate(record["roles"]) if _computing(r)]
    return tuple(sorted({i // 4 * 4 for i in computing}))


def _spans(record, warps=None):
    """Per consumer warpgroup (its first warp stands for it) and step: [the issue of Sᵀ and dPᵀ (qk),
    dPᵀ retired (wait_dp)] and [the issue of dV and dK (dvdk), dQ retired (wait_dq)], matched by step
    (stage 07 issues step i + 1's Sᵀ before step i's dQ retires), as (start, end, warpgroup, op, step)."""
    leads = warps or consumer_leads(record)
    marks = {}
    for _slot, w, name, _tile, kv, t0, t1 in (e for e in record["events"] if e[0] == 0 and e[4] >= 0):
        if w in leads and name in ("qk", "dvdk"):
            marks.setdefault((w, kv, name), [t0, None])[0] = t0
        if w in leads and name in ("wait_dp", "wait_dq"):
            marks.setdefault((w, kv, "qk" if name == "wait_dp" else "dvdk"), [None, t1])[1] = t1
    return sorted((t0, t1, leads.index(w), op, kv) for (w, kv, op), (t0, t1) in marks.items()
                  if t0 is not None and t1 is not None)


def tensor_idle(record, warps=None):
    """Within slot 0's part of the record's window: the share of time in which neither consumer
    warpgroup has a wgmma in flight (_spans). The tensor cores are idle at least that long: in
    flight is not executing."""
    spans = _spans(record, warps)
    if not spans:
        return None
    lo, hi = spans[0][0], max(sp[1] for sp in spans)
    busy, cur_s, cur_e = 0.0, spans[0][0], spans[0][1]
    for sp in spans[1:]:
        if sp[0] > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = sp[0], sp[1]
        else:
            cur_e = max(cur_e, sp[1])
    busy += cur_e - cur_s
    return (hi - lo - busy) / (hi - lo), hi - lo


def gaps(record, warps=None, least_ns=20.0):
    """The windows in which neither consumer has a wgmma in flight, as (ns, the span that ends it:
    warpgroup, op, step)."""
    spans = _spans(record, warps)
    out, end = [], spans[0][1] if spans else 0.0
    for sp in spans[1:]:
        if sp[0] > end + least_ns:
            out.append((sp[0] - end, sp[2], sp[3], sp[4]))
        end = max(end, sp[1])
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
