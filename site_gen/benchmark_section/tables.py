"""Benchmark numbers as Markdown: the lineage tables of the overview and each stage's #benchmark.

Input is the validated results (hopattn.records.results.GpuResults, one per GPU) and the stages;
output is plain Markdown tables. A stage entry whose source_hash differs from the stage's current
sources is marked stale, because the kernel it measured no longer exists.
"""

from __future__ import annotations

from hopattn.records import results
from hopattn.records.results import GpuResults

REFERENCES = (("fa4", "FA4"), ("cudnn", "cuDNN"))  # the reference peers (results.REFERENCES) and their labels
STALE = '<span class="hd-stale" title="measured on older sources of this stage">stale</span>'
CROSS_RUN = '<span class="hd-cross-run" title="the two stages were timed in different runs">†</span>'


def _ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


def _ok(entry: dict | None) -> bool:
    return entry is not None and entry.get("status") == "ok"


def _cell(entry: dict | None, stale: bool) -> str:
    """Overview cell: TFLOP/s in bold, ratios to the references below."""
    if entry is None:
        return ""
    if not _ok(entry):
        return f'<span class="hd-status" title="{_attr(entry.get("reason") or "")}">{entry["status"]}</span>'
    ratios = entry.get("ratios") or {}
    refs = " · ".join(_ratio(ratios.get(key)) for key, _ in REFERENCES)
    mark = f" {STALE}" if stale else ""
    return f'**{entry["tflops"]:.0f}**{mark}<br><small>{refs}</small>'


def _attr(text: str) -> str:
    return text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace("|", "&#124;")


def md_cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def overview_tables(stages, hashes: dict[str, str], nums: GpuResults) -> str:
    """The lineage table (non-causal numbers next to each change) and the causal table."""
    shapes = nums.shapes()
    refs = " · ".join(label for _, label in REFERENCES)
    out = []
    for causal in (False, True):
        rows = [s for s in stages if any(nums.stage(s.id, sh, causal) for sh in shapes)]
        if causal and not rows:
            continue
        if causal and not any(_ok(nums.stage(s.id, sh, True)) for s in rows for sh in shapes):
            # A table of "skipped" cells says less than one sentence.
            peers = []
            for key, label in REFERENCES:
                vals = [nums.peer(key, sh, True) for sh in shapes]
                if any(_ok(p) for p in vals):
                    peers.append(f"{label} " + " / ".join(f"{p['tflops']:.0f}" if _ok(p) else "–" for p in vals))
            ref = f" For reference, causal TFLOP/s ({' / '.join(shapes)}): {'; '.join(peers)}." if peers else ""
            out.append(f"**Causal**: no stage has a measured causal number yet.{ref}\n")
            continue
        skipped = []
        if causal:  # stages that only ever skipped causal (no causal path) become one sentence below
            skipped = [s for s in rows if all((nums.stage(s.id, sh, True) or {}).get("status") in (None, "skipped")
                                              for sh in shapes)]
            rows = [s for s in rows if s not in skipped]
        head = ["Stage", "The one change"] if not causal else ["Stage"]
        out.append(f"**{'Causal' if causal else 'Non-causal'}** — TFLOP/s; below: ratio to {refs} "
                   "measured in the same run (> 1 is faster).\n")
        out.append("| " + " | ".join(head + shapes) + " |")
        out.append("|" + "---|" * len(head) + "---:|" * len(shapes))
        for s in (stages if not causal else rows):
            link = f"[{s.id} · {md_cell(s.title)}](stages/{s.name}.md)"
            cells = [link] + ([md_cell(s.change)] if not causal else [])
            for sh in shapes:
                e = nums.stage(s.id, sh, causal)
                cells.append(_cell(e, e is not None and results.is_stale(e, hashes[s.id])))
            out.append("| " + " | ".join(cells) + " |")
        for key, label in REFERENCES:
            peers = [nums.peer(key, sh, causal) for sh in shapes]
            if any(_ok(p) for p in peers):
                title = (peers[0] or {}).get("label") or label
                cells = [f"*{md_cell(title)}*"] + ([""] if not causal else [])
                cells += [f"*{p['tflops']:.0f}*" if _ok(p) else "" for p in peers]
                out.append("| " + " | ".join(cells) + " |")
        out.append("")
        if skipped:
            ids = _id_ranges([s.id for s in skipped])
            out.append(f"Stage {ids} has no causal path; the benchmark skips it.\n" if len(skipped) == 1 else
                       f"Stages {ids} have no causal path; the benchmark skips them.\n")
    return "\n".join(out)


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
    stale_seen = cross_run_seen = False
    for causal in (False, True):
        for sh in nums.shapes():
            e = nums.stage(stage.id, sh, causal)
            if e is None:
                continue
            label = f"{sh}{' causal' if causal else ''}"
            if not _ok(e):
                reason = md_cell(e.get("reason") or "")
                rows.append(f"| {label} | {e['status']} | | | | | | {reason} |")
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
            err = f"{e['rel_err']:.2g}" if e.get("rel_err") is not None else ""
            mark = f" {STALE}" if stale else ""
            rows.append(f"| {label} | **{e['tflops']:.1f}**{mark} | {e['median_ms']:.4f} | {spread} | "
                        + " | ".join(_ratio(ratios.get(k)) for k, _ in REFERENCES)
                        + f" | {vs_prev} | {err} |")
    if not rows:
        return ""
    prev_head = f"vs {prev.id}" if prev is not None else "vs previous"
    head = ("| Shape | TFLOP/s | Median ms | Spread | "
            + " | ".join(f"vs {label}" for _, label in REFERENCES)
            + f" | {prev_head} | Rel. error |\n|---|---:|---:|---:|" + "---:|" * len(REFERENCES) + "---:|---:|")
    out = [head, *rows, ""]
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
            head += f" (`{run['command']}`)"
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
