"""Benchmark numbers as Markdown: the lineage tables of the overview and each stage's #benchmark.

Input is the validated results (hopattn.records.results.GpuResults, one per GPU) and the stages;
output is plain Markdown tables. A stage entry whose source_hash differs from the stage's current
sources is marked stale, because the kernel it measured no longer exists.
"""

from __future__ import annotations

from hopattn.records import results
from hopattn.records.results import GpuResults
from hopattn.records.shapes import ALL_SHAPES, HEAD_DIM_SHAPES

from site_gen.commands import reader_command

from .headline import PEER_NAMES, best_peer

REFERENCES = (("fa3", "FA3"), ("fa4", "FA4"), ("cudnn", "cuDNN"))  # the reference peers (results.REFERENCES)
CORE = ("4k", "8k", "16k")  # the climb's shapes; the others are the users' shapes (users_tables)
STALE = '<span class="hd-stale" title="measured on older sources of this stage">stale</span>'
CROSS_RUN = '<span class="hd-cross-run" title="the two stages were timed in different runs">†</span>'


def _ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


def _ok(entry: dict | None) -> bool:
    return entry is not None and entry.get("status") == "ok"


def _cell(entry: dict | None, stale: bool, nums: GpuResults | None = None) -> str:
    """Overview cell: TFLOP/s in bold, below it the ratio to the fastest peer timed in the same run."""
    if entry is None:
        return ""
    if not _ok(entry):
        return f'<span class="hd-status" title="{_attr(entry.get("reason") or "")}">{entry["status"]}</span>'
    best = best_peer(entry, nums)
    ref = f"{best[1]:.2f}× {dict(REFERENCES)[best[0]]}" if best else "no peer"
    mark = f" {STALE}" if stale else ""
    return f'**{entry["tflops"]:.0f}**{mark}<br><small>{ref}</small>'


def _attr(text: str) -> str:
    return text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace("|", "&#124;")


def md_cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def overview_tables(stages, hashes: dict[str, str], nums: GpuResults) -> str:
    """The lineage table: every stage at 4k, 8k and 16k, non-causal and causal, each number with its ratio to
    the fastest reference peer of its own run; the peers' own numbers below."""
    shapes = [sh for sh in CORE if sh in nums.shapes()] or nums.shapes()[:3]
    cols = [(sh, False) for sh in shapes] + [(sh, True) for sh in shapes]
    cols = [(sh, cz) for sh, cz in cols if any(_ok(nums.stage(s.id, sh, cz)) for s in stages)
            or any(_ok(nums.peer(k, sh, cz)) for k, _ in REFERENCES)]
    out = ["TFLOP/s; below each: the ratio to the fastest reference peer timed **in the same run** as that entry "
           "(> 1 is faster; FA3 = FlashAttention-3, FA4 = FlashAttention-4). A dash: not measured.\n"]
    out.append("| Stage | " + " | ".join(f"{sh}{' causal' if cz else ''}" for sh, cz in cols) + " |")
    out.append("|---|" + "---:|" * len(cols))
    for s in stages:
        link = f"[{s.id} · {md_cell(s.title.split(':')[0])}](stages/{s.name}.md)"
        cells = []
        for sh, cz in cols:
            e = nums.stage(s.id, sh, cz)
            if e is not None and e.get("status") == "skipped" and cz and not s.causal:
                cells.append("–")
                continue
            cells.append(_cell(e, e is not None and results.is_stale(e, hashes[s.id]), nums) or "–")
        out.append(f"| {link} | " + " | ".join(cells) + " |")
    for key in [k for k in results.PEERS]:
        peers = [nums.peer(key, sh, cz) for sh, cz in cols]
        if any(_ok(p) for p in peers):
            title = next(p["label"] for p in peers if _ok(p))
            out.append(f"| *{md_cell(title)}* | " + " | ".join(f"*{p['tflops']:.0f}*" if _ok(p) else "–" for p in peers)
                       + " |")
    out.append("")
    missing = [PEER_NAMES.get(k, k) for k, _ in REFERENCES
               if not any(_ok(nums.peer(k, sh, cz)) for sh, cz in cols)
               and any(nums.peer(k, sh, cz) is not None for sh, cz in cols)]
    if missing:
        out.append(f"{' and '.join(missing)} did not run on the measuring machine "
                   "(see [Where the numbers come from](#environment)); no ratio to it is shown.\n")
    without = [s for s in stages if not s.causal]
    if without and any(cz for _, cz in cols):
        ids = _id_ranges([s.id for s in without])
        out.append(f"Stage {ids} has no causal path.\n" if len(without) == 1 else f"Stages {ids} have no causal path.\n")
    return "\n".join(out)


def users_tables(stages, hashes: dict[str, str], nums: GpuResults) -> str:
    """The shapes users run beyond 4k, 8k and 16k, for the stages that ran them and the reference peers."""
    return _shape_tables(stages, hashes, nums, [sh for sh in nums.shapes() if sh not in CORE and sh not in HEAD_DIM_SHAPES])


def head_dim_tables(stages, hashes: dict[str, str], nums: GpuResults) -> str:
    """The head-dim points (4k/8k/16k at H·D = 2048, head dims 64 to 256), for the stages that ran them
    and the reference peers: the overview's head-dim view."""
    return _shape_tables(stages, hashes, nums, [sh for sh in nums.shapes() if sh in HEAD_DIM_SHAPES])


def _shape_tables(stages, hashes: dict[str, str], nums: GpuResults, shapes: list[str]) -> str:
    """A table per mask of ``shapes``: each stage that ran any of them and each reference peer."""
    ran = [s for s in stages if any(_ok(nums.stage(s.id, sh, cz)) for sh in shapes for cz in (False, True))]
    if not shapes or not ran:
        return ""
    peers = [(k, label) for k, label in REFERENCES
             if any(_ok(nums.peer(k, sh, cz)) for sh in shapes for cz in (False, True))]
    absent = [k for k, _ in REFERENCES if (k, dict(REFERENCES)[k]) not in peers
              and any(nums.peer(k, sh, cz) is not None for sh in shapes for cz in (False, True))]
    skipped: dict[str, set[str]] = {}
    out = []
    for causal in (False, True):
        out.append(f"**{'Causal' if causal else 'Non-causal'}**: TFLOP/s; below each stage's: the ratio to the "
                   "fastest reference peer of the same run.\n")
        head = ["Shape", "What it is"] + [f"[{s.id}](stages/{s.name}.md)" for s in ran] + [lbl for _, lbl in peers]
        out.append("| " + " | ".join(head) + " |")
        out.append("|---|---|" + "---:|" * (len(ran) + len(peers)))
        for sh in shapes:
            any_entry = next((e for e in [nums.stage(s.id, sh, causal) for s in ran] +
                              [nums.peer(k, sh, causal) for k, _ in peers] if e is not None), None)
            cells = [f"`{sh}`", md_cell(_what(sh, any_entry))]
            for s in ran:
                e = nums.stage(s.id, sh, causal)
                if e is not None and e["status"] == "skipped":
                    skipped.setdefault(e.get("reason") or "skipped", set()).add(s.id)
                    cells.append("–")
                    continue
                cells.append(_cell(e, e is not None and results.is_stale(e, hashes[s.id]), nums) or "–")
            for k, _ in peers:
                p = nums.peer(k, sh, causal)
                cells.append(f"*{p['tflops']:.0f}*" if _ok(p) else (p["status"] if p else "–"))
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    for reason, ids in skipped.items():
        out.append(f"–: not run, stage{'s' if len(ids) > 1 else ''} {', '.join(sorted(ids))}: {md_cell(reason)}.\n")
    if absent:
        out.append(f"{' and '.join(PEER_NAMES.get(k, k) for k in absent)} did not run for these shapes "
                   "(not importable on the measuring machine); the ratios are to the peers that did.\n")
    return "\n".join(out)


def _what(shape: str, entry: dict | None) -> str:
    """The shape's reason for being in the set (hopattn.records.shapes) and its dimensions."""
    known = ALL_SHAPES.get(shape) or HEAD_DIM_SHAPES.get(shape)
    if known is not None:
        return f"{known.what}: {known.describe()}" if known.what else known.describe()
    if entry is None:
        return ""
    return f"B{entry['batch']} H{entry['heads']} Lq{entry['len_q']} Lk{entry['len_k']}"


def _id_ranges(ids: list[str]) -> str:
    """'01–16' for consecutive stage ids, else comma-separated runs: '01–03, 07'."""
    runs: list[list[str]] = []
    for i in ids:
        if runs and int(i) == int(runs[-1][-1]) + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}–{r[-1]}" for r in runs)


def stage_table(stage, prev, hashes: dict[str, str], nums: GpuResults) -> str:
    """#benchmark body for one stage on one GPU; empty string if this GPU never measured it."""
    rows = []
    skipped: dict[str, list[str]] = {}
    stale_seen = cross_run_seen = False
    for causal in (False, True):
        for sh in nums.shapes():
            e = nums.stage(stage.id, sh, causal)
            if e is None:
                continue
            label = f"{sh}{' causal' if causal else ''}"
            if e["status"] == "skipped":
                skipped.setdefault(e.get("reason") or "skipped", []).append(label)
                continue
            if not _ok(e):
                reason = md_cell(e.get("reason") or "")
                cells = [label, e["status"], "", ""] + [""] * len(REFERENCES) + ["", reason]
                rows.append("| " + " | ".join(cells) + " |")
                continue
            stale = results.is_stale(e, hashes[stage.id])
            stale_seen |= stale
            ratios = e.get("ratios") or {}
            p = nums.stage(prev.id, sh, causal) if prev is not None else None
            vs_prev = _ratio(e["tflops"] / p["tflops"]) if _ok(p) and p["tflops"] else "–"
            if _ok(p) and p["run_id"] != e["run_id"]:
                vs_prev += f" {CROSS_RUN}"  # the two stages were timed in different runs
                cross_run_seen = True
            spread = f"{e['spread_pct']:.1f} %" if e.get("spread_pct") is not None else ""
            err = f"{e['rel_err']:.1e}" if e.get("rel_err") is not None else ""
            mark = f" {STALE}" if stale else ""
            rows.append(f"| {label} | **{e['tflops']:.1f}**{mark} | {e['median_ms']:.4f} | {spread} | "
                        + " | ".join(_ratio(ratios.get(k)) for k, _ in REFERENCES)
                        + f" | {vs_prev} | {err} |")
    if not rows and not skipped:
        return ""
    prev_head = f"vs {prev.id}" if prev is not None else "vs previous"
    head = ("| Shape | TFLOP/s | Median ms | Spread | "
            + " | ".join(f"vs {label}" for _, label in REFERENCES)
            + f" | {prev_head} | Rel. error |\n|---|---:|---:|---:|" + "---:|" * len(REFERENCES) + "---:|---:|")
    out = [head, *rows, ""] if rows else []
    for reason, labels in skipped.items():
        out.append(f"Not run ({md_cell(reason)}): {', '.join(labels)}.\n")
    if cross_run_seen:
        out.append(f"{CROSS_RUN}: this stage and the previous one were timed in different runs, so that ratio "
                   "carries the run-to-run noise the same-run ratios avoid.\n")
    if stale_seen:
        out.append(f"{STALE}: measured on an older version of this stage's sources (the current hash is "
                   f"`{hashes[stage.id]}`); rerun the benchmark to refresh.\n")
    return "\n".join(out)


def environment(nums: GpuResults, hashes: dict[str, str] | None = None) -> str:
    """The GPU and software of each run that produced the shown numbers, as a Markdown list.

    With the stages' current source hashes, each run also says how many of the stages it timed were
    timed on exactly today's sources: the commit a run records can be wrong (a GPU machine's copy
    of the tree may carry a stale .git), the hashes of what was compiled cannot."""
    out = []
    for run_id in sorted({e["run_id"] for e in nums.data["results"]}):
        run = nums.data["runs"][run_id]
        env = run.get("environment", {})
        commit = run.get("git_commit")
        head = f"- **Run {run_id}**, {run.get('date', '')}"
        if commit:
            head += f", commit `{commit[:10]}`" + (" with local changes" if run.get("git_dirty") else "")
        if run.get("command"):
            head += f" (`{reader_command(run['command'])}`)"
        gpu = [f"compute capability {env.get('compute_capability', '?')}"]
        if env.get("sm_count"):
            gpu.append(f"{env['sm_count']} SMs")
        if env.get("max_sm_mhz"):
            gpu.append(f"max SM clock {env['max_sm_mhz']} MHz")
        clocks = (env.get("clocks_before") or {}).get("sm_mhz"), (env.get("clocks_after") or {}).get("sm_mhz")
        if all(clocks):
            gpu.append(f"SM clock before / after the run {clocks[0]} / {clocks[1]} MHz")
        if isinstance(env.get("power_limit_w"), (int, float)):
            gpu.append(f"power limit {env['power_limit_w']:.0f} W")
        soft = " · ".join(f"{label} {env[key]}" for key, label in
                          (("driver", "driver"), ("cuda", "CUDA"), ("torch", "torch"), ("cudnn", "cuDNN")) if env.get(key))
        out += [head, f"    - GPU: {env.get('gpu_name', nums.gpu)} ({', '.join(gpu)})",
                f"    - Software: {soft}" if soft else ""]
        if hashes:
            timed = {e["name"]: e.get("source_hash") for e in nums.data["results"]
                     if e["run_id"] == run_id and e.get("kind") == "stage" and e.get("source_hash")}
            same = sum(1 for sid, h in timed.items() if hashes.get(sid) == h)
            if timed:
                out.append(f"    - Sources: {same} of the {len(timed)} stages it timed match today's sources "
                           "(by the hash of kernel.cu and its headers)")
    return "\n".join(line for line in out if line) + "\n"
