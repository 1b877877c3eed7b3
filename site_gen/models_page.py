"""The "In real models" page: how to switch a model to hopattn, what the model benchmark measured
(tables and an inline SVG chart of the speedups over SDPA), the routing reports, and what is not
supported.

``render(records)`` takes what ``hopattn.records.models.load_all`` returns ({gpu slug: record}, or a
single record) and returns Markdown. Pure function of its input: same records, same characters.
Colours are CSS variables with light-theme fallbacks, so the chart follows the site's theme.
"""

from __future__ import annotations

import re
from html import escape

from hopattn.records.models import BACKENDS, LABELS, REFERENCE

from site_gen.commands import reader_command

from .html import figure

PRIMARY = "var(--md-primary-fg-color, #3f51b5)"
PEER = {"cudnn": "var(--hd-k, #d9822b)", "fa3": "var(--hd-v, #2e9e6a)", "fa4": "var(--hd-s, #8a5cd1)",
        "sdpa": "var(--hd-stroke, #9aa3b2)"}
FG, MUTED, GRID = "var(--hd-fg, #1f2430)", "var(--hd-muted, #5b6372)", "var(--hd-grid, #d9dee7)"
FONT = "Roboto, 'Helvetica Neue', Arial, sans-serif"

USAGE = '''## Switch a model to hopattn

transformers (5.x): register once, then ask for the implementation by name, in the config or when loading.

```python
from hopattn.integrations import transformers as hopattn_transformers

hopattn_transformers.register()  # attn_implementation="hopattn" now exists
model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16, attn_implementation="hopattn")
# a model already built: model.set_attn_implementation("hopattn")
```

diffusers (0.42): register once, then switch the transformer's attention backend.

```python
from hopattn.integrations import diffusers as hopattn_diffusers

hopattn_diffusers.register()  # "hopattn" joins diffusers' attention backends
pipe.transformer.set_attention_backend("hopattn")  # or: with attention_backend("hopattn"): pipe(...)
```

What the kernel cannot serve goes to SDPA and is counted; `register(strict=True)` refuses it instead,
with an error naming the reason. A routing report counts the calls of any block of code:

```python
from hopattn.integrations import routing

with routing.track(strict=True) as report:  # strict: fails if any call fell back
    pipe(prompt)
print(report.summary())  # "80 attention calls: 80 served by hopattn"
```
'''

UNSUPPORTED = '''## What is not supported

hopattn serves bf16 CUDA tensors with head dim 128, without a mask, with the causal mask (bottom-right
aligned; a causal mask passed as a tensor is recognized), or with a mask that masks nothing (LTX-2's
text mask). Grouped-query attention reaches the kernel without copies where the stage reads it, and
with its K/V heads repeated where it does not (counted as served after a repeat). Everything else is
sent to PyTorch's SDPA, exactly as the library would have run it, and counted with its reason:

- padding masks and any other mask pattern (packed sequences, block masks, additive biases);
- head dims other than 128 (LTX-2's audio attention has 64);
- dtypes other than bf16 (fp16, fp32) and tensors not on a CUDA GPU;
- dropout, logit softcapping, sliding windows, attention sinks, position biases;
- in diffusers: context parallelism and requests for the log-sum-exp (`return_lse`).
'''


def _fmt(x, digits: int = 1) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def _pct(x: float) -> str:
    return f"{x:.1f}" if x >= 0.1 else f"{x:.2f}"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _records(records: dict) -> list[tuple[str, dict]]:
    if "schema_version" in records:  # one record rather than {slug: record}
        return [("", records)]
    return sorted(records.items())


def _models(record: dict) -> list[tuple[str, dict]]:
    """Models by id, numbers compared as numbers (the 8k prefill before the 32k one)."""
    key = lambda item: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", item[0])]  # noqa: E731
    return sorted(record["models"].items(), key=key)


def _ordered_cases(model: dict) -> list[tuple[str, dict]]:
    return [(b, model["cases"][b]) for b in BACKENDS if b in model["cases"]]


def _case_cell(case: dict, value, speedup) -> str:
    if case["status"] != "ok":
        return case["status"]
    text = f"{_fmt(value)} ms" if value is not None else "–"
    return text + (f" ({speedup:.2f}×)" if speedup is not None else "")


def _tables(record: dict) -> str:
    models = _models(record)
    backends = [b for b in BACKENDS if any(b in m["cases"] for _, m in models)]
    head = "| model | " + " | ".join(LABELS[b] for b in backends) + " |\n|---|" + "---|" * len(backends) + "\n"
    step = attn = ""
    for _, m in models:
        label = _cell(m["label"])
        step += f"| {label} | " + " | ".join(
            _case_cell(m["cases"][b], m["cases"][b]["step_ms"]["median"] if m["cases"][b].get("step_ms") else None,
                       m["cases"][b].get("speedup_step")) if b in m["cases"] else "" for b in backends) + " |\n"
        attn += f"| {label} | " + " | ".join(
            _case_cell(m["cases"][b], m["cases"][b].get("attention_ms"), m["cases"][b].get("speedup_attention"))
            if b in m["cases"] else "" for b in backends) + " |\n"
    quality = "| model | backend | output error vs SDPA | memory (GiB) | step spread |\n|---|---|---|---|---|\n"
    for _, m in models:
        for b, case in _ordered_cases(m):
            if case["status"] != "ok" or b == REFERENCE:
                continue
            errors = ", ".join(f"{k.removeprefix('rel_err_')} {v:.2e}" if k.startswith("rel_err") else
                               f"{k.replace('_', ' ')} {v:.3f}" for k, v in sorted(case["errors"].items())
                               if v is not None) or "–"
            quality += (f"| {_cell(m['label'])} | {LABELS[b]} | {errors} | {_fmt(case.get('memory_gib'), 1)} | "
                        f"{_fmt(case['step_ms']['spread_pct'], 1)} % |\n")
    return ("Whole step (median ms; speedup over SDPA's default backend in brackets):\n\n" + head + step +
            "\nAttention alone (the step's attention calls replayed one by one, each timed on its own with the "
            "GPU waiting for it, so the host time before each launch counts here in full; in the whole step the CPU runs "
            "ahead and hides most of it; ms per step):\n\n" + head + attn +
            "\nOutputs and memory (relative error of the final output against the SDPA run; logits: also the "
            "share of positions whose argmax agrees):\n\n" + quality)


def chart(record: dict, key: str = "speedup_step", did: str = "models-step",
          title: str = "Whole-step speedup over SDPA") -> str:
    """Horizontal bars: per model, one bar per backend that ran, length = speedup over SDPA."""
    rows = []
    for _, m in _models(record):
        bars = [(b, c[key]) for b, c in _ordered_cases(m) if c["status"] == "ok" and c.get(key) is not None]
        if bars:
            rows.append((m["label"], bars))
    if not rows:
        return ""
    top = max(1.2, max(v for _, bars in rows for _, v in bars) * 1.1)
    left, width, bar_h, gap, head_h = 250, 420, 14, 4, 20
    height = 30 + sum(head_h + len(bars) * (bar_h + gap) + 6 for _, bars in rows) + 24
    x_of = lambda v: round(left + width * v / top, 1)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {left + width + 60} {height}" width="100%" '
           f'role="img" aria-labelledby="{did}-title" font-family="{FONT}" font-size="12">',
           f'<title id="{did}-title">{escape(title)}</title>']
    y = 30
    out.append(f'<text x="{left}" y="16" fill="{FG}" font-weight="bold">{escape(title)}</text>')
    for label, bars in rows:
        out.append(f'<text x="0" y="{y + 13}" fill="{FG}" font-weight="bold">{escape(label)}</text>')
        y += head_h
        for b, v in bars:
            fill = PRIMARY if b == "hopattn" else PEER.get(b, MUTED)
            out.append(f'<text x="{left - 8}" y="{y + 11}" fill="{MUTED}" text-anchor="end">{escape(LABELS[b])}'
                       f'</text>')
            out.append(f'<rect x="{left}" y="{y}" width="{round(x_of(v) - left, 1)}" height="{bar_h}" '
                       f'fill="{fill}" rx="2"/>')
            out.append(f'<text x="{x_of(v) + 4}" y="{y + 11}" fill="{FG}">{v:.2f}×</text>')
            y += bar_h + gap
        y += 6
    one = x_of(1.0)
    out.append(f'<line x1="{one}" y1="24" x2="{one}" y2="{y}" stroke="{MUTED}" stroke-dasharray="4 3"/>')
    out.append(f'<text x="{one}" y="{y + 14}" fill="{MUTED}" text-anchor="middle">1.0 = SDPA</text>')
    out.append(f'<line x1="{left}" y1="{y}" x2="{left + width}" y2="{y}" stroke="{GRID}"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def supported(model: dict) -> dict | None:
    """What one model's record supports about hopattn against SDPA: the step speedup (the medians'),
    the samples and spreads behind it, whether the two backends' step ranges (fastest to slowest
    sample) are apart, and the attention-alone replay. None when either did not run."""
    hop, ref = model["cases"].get("hopattn"), model["cases"].get(REFERENCE)
    if not hop or not ref or hop["status"] != "ok" or ref["status"] != "ok" or not hop.get("step_ms") \
            or not ref.get("step_ms") or hop.get("speedup_step") is None:
        return None
    a, b = hop["step_ms"], ref["step_ms"]
    apart = a["max"] < b["min"] or b["max"] < a["min"]
    return {"speedup": hop["speedup_step"], "samples": (a["samples"], b["samples"]),
            "spread": (a["spread_pct"], b["spread_pct"]), "range": ((a["min"], a["max"]), (b["min"], b["max"])),
            "apart": apart, "attention": hop.get("speedup_attention")}


def _supported(record: dict) -> str:
    """Per model, in words: a speedup the steps' spread does not swamp, or that it does."""
    lines = []
    for _, m in _models(record):
        s = supported(m)
        if s is None:
            continue
        (na, nb), (sa, sb) = s["samples"], s["spread"]
        (a0, a1), (b0, b1) = s["range"]
        steps = (f"{na} steps of each backend" if na == nb else f"{na} steps of hopattn, {nb} of SDPA")
        ranges = f"{_fmt(a0)}–{_fmt(a1)} ms against {_fmt(b0)}–{_fmt(b1)} ms"
        if s["apart"]:
            verdict = (f"**{s['speedup']:.3f}×** SDPA a step ({'faster' if s['speedup'] > 1 else 'slower'}): "
                       f"{steps}, spread {_pct(sa)} % and {_pct(sb)} %; the two ranges do not overlap ({ranges})")
        else:
            verdict = (f"**no measured difference**: {s['speedup']:.3f}× SDPA by the medians, but {steps} spread "
                       f"{_pct(sa)} % (hopattn) and {_pct(sb)} % (SDPA) and their ranges overlap ({ranges})")
        attn = "" if s["attention"] is None else f". The attention calls alone, replayed: {s['attention']:.3f}× SDPA"
        lines.append(f"- **{_cell(m['label'])}**: {verdict}{attn}.\n")
    if not lines:
        return ""
    return ("What the record supports, model by model (hopattn against SDPA's default backend; a step's range is "
            "its fastest to its slowest sample):\n\n" + "".join(lines) + "\n")


def _figure(svg: str, did: str, title: str) -> str:
    """A chart as the site's figures are: with its full-screen view (docs/assets/javascripts/figures.js)."""
    if not svg:
        return ""
    return figure(did, svg, "", title, kind="chart", compact=False) + "\n"


def _routing(record: dict) -> str:
    out = "## Routing reports\n\nWhat each model's step asked of hopattn, call by call shape:\n\n"
    for _, m in _models(record):
        hop = m["cases"].get("hopattn", {})
        r = hop.get("routing")
        out += f"### {m['label']}\n\n"
        if r is None:
            out += f"hopattn did not run here ({hop.get('status', 'not run')}: {hop.get('message') or '–'}).\n\n"
        else:
            verdict = "every call served" if r["served"] == r["calls"] else \
                f"{r['calls'] - r['served']} sent to SDPA"
            repeated = r["modes"].get("repeat_kv", 0)
            out += (f"{r['calls']} attention calls a step, {r['served']} served by hopattn ({verdict}"
                    f"{f'; {repeated} after repeating K/V heads' if repeated else ''}); strict routing "
                    f"{'on' if r['strict'] else 'off'}.\n\n")
        if m["attention_calls"]:
            out += "| calls | heads (q/kv) | queries × keys | head dim | mask | hopattn |\n|---|---|---|---|---|---|\n"
            for c in m["attention_calls"]:
                out += (f"| {c['count']} | {c['q_heads']}/{c['kv_heads']} | {c['q_len']:,} × {c['k_len']:,} | "
                        f"{c['head_dim']} | {'causal' if c['causal'] else 'none'} | "
                        f"{_cell(c['reason']) if c['reason'] else 'served'} |\n")
            out += "\n"
    return out


def _provenance(record: dict) -> str:
    lines = []
    for run_id, run in sorted(record["runs"].items()):
        env = run["environment"]
        commit = (run["git_commit"] or "unknown")[:12] + (" (dirty)" if run["dirty"] else "")
        lines.append(f"- run {run_id}: {env.get('gpu_name') or 'unknown GPU'}, torch {env.get('torch') or '–'}, "
                     f"transformers {env.get('transformers') or '–'}, diffusers {env.get('diffusers') or '–'}, "
                     f"commit {commit}; `{_cell(reader_command(run['command']))}`"
                     + (" — **dry run on CPU: tiny models, the reference kernel; not measurements**"
                        if run["dry_run"] else ""))
    return "\n".join(lines) + "\n"


def render(records: dict) -> str:
    page = ("# In real models\n\nThe final stage, called by real models through the extension points of their "
            "libraries: transformers' `AttentionInterface` and diffusers' attention dispatch. The models are "
            "built from their published configurations with random weights, in bf16 on one GPU, and each runs "
            "with every backend on the same weights.\n\n" + USAGE + "\n")
    found = _records(records)
    if not found or not any(r["models"] for _, r in found):
        page += ("## Measured\n\n**Not measured yet.** No model runs are recorded yet: the model benchmark has not "
                 "run on a GPU. `nox -s bench_models` on an H200 (or `python -m bench.models`) writes the record, "
                 "`bench/results/models-<gpu>.json`; this page then shows, per model and backend, the time of a "
                 "whole step and of its attention calls, the outputs' error against SDPA, and which calls "
                 "hopattn served.\n\n")
    for slug, record in found:
        if not record["models"]:
            continue
        page += f"## Measured{f' on {slug}' if slug else ''}\n\n" + _provenance(record) + "\n"
        for _, m in _models(record):
            tokens = ", ".join(f"{n:,} {k}" for k, n in sorted(m["tokens"].items()))
            page += f"- **{_cell(m['label'])}** ({m['library']}): {_cell(m['workload'])}; tokens: {tokens}.\n"
        page += "\n" + _supported(record) + _tables(record) + "\n"
        page += _figure(chart(record), "models-step", "Whole-step speedup over SDPA") + "\n" + _figure(
            chart(record, "speedup_attention", "models-attention", "Attention-alone speedup over SDPA"),
            "models-attention", "Attention-alone speedup over SDPA") + "\n"
        page += _routing(record)
    return page + UNSUPPORTED
