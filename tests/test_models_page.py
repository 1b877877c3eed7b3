"""The "In real models" page draft (site_gen.models_page) rendered from a fixture record."""

from __future__ import annotations

import copy
import re

import pytest
from hopattn.records import models as mr

from site_gen import models_page

RUN = "20261201T101500Z"


def _case(median, attention, speedup=None, speedup_attention=None, errors=None, routing=None, memory=40.0):
    return {"status": "ok", "message": None,
            "step_ms": {"median": median, "min": median * 0.99, "max": median * 1.01, "spread_pct": 2.0, "samples": 3},
            "attention_ms": attention, "memory_gib": memory, "speedup_step": speedup,
            "speedup_attention": speedup_attention, "errors": errors or {}, "routing": routing}


def _call(q_len, k_len, count, head_dim=128, reason=None, causal=False, q_heads=40, kv_heads=40):
    return {"library": "diffusers", "batch": 1, "q_heads": q_heads, "kv_heads": kv_heads, "q_len": q_len,
            "k_len": k_len, "head_dim": head_dim, "causal": causal, "layout": "bshd", "dtype": "bfloat16",
            "count": count, "reason": reason}


def fixture() -> dict:
    env = {k: None for k in mr.ENV_FIELDS}
    env.update(gpu_name="NVIDIA H200", compute_capability="9.0", sm_count=132, torch="2.11.0+cu130",
               transformers="5.17.0", diffusers="0.42.1")
    run = {"date": "2026-12-01T10:15:00Z", "git_commit": "0123456789abcdef0123456789abcdef01234567", "dirty": False,
           "dry_run": False, "command": "python -m bench.models", "environment": env}
    served = {"strict": True, "kernel": "hopattn", "calls": 80, "served": 80, "modes": {"direct": 80}, "fallbacks": {}}
    wan = {"run": RUN, "label": "Wan2.1-T2V-14B, 480p x 81 frames", "library": "diffusers",
           "config_source": "wan_t2v_14B.py", "workload": "one denoising step", "tokens": {"video": 32760, "text": 512},
           "params": 14288901184, "build_s": 9.5, "strict": True,
           "attention_calls": [_call(32760, 32760, 40), _call(32760, 512, 40)],
           "cases": {"sdpa": _case(3200.0, 1700.0, 1.0, 1.0),
                     "cudnn": _case(3050.0, 1560.0, 1.049, 1.09, {"rel_err_latents": 0.004}),
                     "hopattn": _case(2900.0, 1420.0, 1.103, 1.197, {"rel_err_latents": 0.0041}, served),
                     "fa3": _case(2880.0, 1400.0, 1.111, 1.214, {"rel_err_latents": 0.004}),
                     "fa4": {**_case(1.0, None), "status": "missing", "step_ms": None, "attention_ms": None,
                             "memory_gib": None, "message": "flash_attn.cute is not importable"}}}
    fallback = {"strict": False, "kernel": "hopattn", "calls": 288, "served": 96, "modes": {"direct": 96},
                "fallbacks": {"head dim 64 (hopattn serves 128)": 192}}
    ltx = {"run": RUN, "label": "LTX-2, 512 x 768 x 121 frames, with audio", "library": "diffusers",
           "config_source": "convert_ltx2_to_diffusers.py", "workload": "one denoising step",
           "tokens": {"video": 6144, "audio": 126, "text": 1024}, "params": 19000000000, "build_s": 14.0,
           "strict": False,
           "attention_calls": [_call(6144, 6144, 48, q_heads=32, kv_heads=32),
                               _call(126, 126, 48, head_dim=64, reason="head dim 64 (hopattn serves 128)", q_heads=32,
                                     kv_heads=32)],
           "cases": {"sdpa": _case(640.0, 200.0, 1.0, 1.0),
                     "hopattn": _case(620.0, 180.0, 1.032, 1.111, {"rel_err_video": 0.005, "rel_err_audio": 0.004},
                                      fallback),
                     "fa3": {**_case(1.0, None), "status": "hang", "step_ms": None, "attention_ms": None,
                             "memory_gib": None, "message": "no result within 300 s (watchdog)"}}}
    llama_routing = {"strict": True, "kernel": "hopattn", "calls": 32, "served": 32, "modes": {"repeat_kv": 32},
                     "fallbacks": {}}
    llama = {"run": RUN, "label": "Llama-3.1-8B prefill, 32k tokens", "library": "transformers",
             "config_source": "config.json", "workload": "time to first token", "tokens": {"prompt": 32768},
             "params": 8030261248, "build_s": 6.0, "strict": True,
             "attention_calls": [{**_call(32768, 32768, 32, causal=True, q_heads=32, kv_heads=8),
                                  "library": "transformers", "layout": "bshd"}],
             "cases": {"sdpa": _case(1700.0, 700.0, 1.0, 1.0),
                       "hopattn": _case(1600.0, 610.0, 1.062, 1.148,
                                        {"rel_err_logits": 0.012, "argmax_agreement": 0.984}, llama_routing)}}
    return mr.validate({"schema_version": 1, "runs": {RUN: run},
                        "models": {"wan2.1-t2v-14b-480p": wan, "ltx-2-512x768x121": ltx,
                                   "llama-3.1-8b-prefill-32k": llama}})


def test_page_is_deterministic_and_has_every_part():
    records = {"nvidia-h200": fixture()}
    page = models_page.render(records)
    assert page == models_page.render(copy.deepcopy(records))
    assert page.startswith("# In real models\n")
    for part in ("## Switch a model to hopattn", "## Measured on nvidia-h200", "## Routing reports",
                 "## What is not supported"):
        assert part in page
    assert 'attn_implementation="hopattn"' in page and 'set_attention_backend("hopattn")' in page
    assert "routing.track(strict=True)" in page


def test_tables_show_times_speedups_errors_and_failures():
    page = models_page.render({"nvidia-h200": fixture()})
    wan_row = next(ln for ln in page.splitlines() if ln.startswith("| Wan2.1-T2V-14B") and "2,900.0 ms" in ln)
    assert "3,200.0 ms (1.00×)" in wan_row and "2,900.0 ms (1.10×)" in wan_row and wan_row.endswith("| missing |")
    assert "| FlashAttention-3 | FlashAttention-4 |" in page
    assert "1,420.0 ms (1.20×)" in page  # attention alone
    assert "argmax agreement 0.984" in page and "logits 1.20e-02" in page
    ltx_row = next(ln for ln in page.splitlines() if ln.startswith("| LTX-2") and "620.0 ms" in ln)
    assert ltx_row == "| LTX-2, 512 x 768 x 121 frames, with audio | 640.0 ms (1.00×) |  | 620.0 ms (1.03×) | hang |  |"


def test_chart_is_inline_svg_with_theme_colours_and_round_numbers():
    page = models_page.render({"nvidia-h200": fixture()})
    svgs = re.findall(r"<svg .*?</svg>", page, flags=re.S)
    assert len(svgs) == 2
    step = svgs[0]
    assert 'fill="var(--md-primary-fg-color, #3f51b5)"' in step  # hopattn's bars
    assert "var(--hd-v, #2e9e6a)" in step  # FlashAttention-3's
    assert step.count("<rect") == 2 + 4 + 2  # LTX-2 (sdpa, hopattn), Wan (4 ran), Llama (2)
    assert 'id="models-step-title"' in step and 'id="models-attention-title"' in svgs[1]
    assert "1.0 = SDPA" in step and "1.10×" in step
    assert not re.search(r'="[-\d.]*\d\.\d{2,}', step)  # coordinates rounded to 0.1
    assert "\n\n" not in step  # a blank line would end the HTML block in Markdown


def test_routing_reports_count_calls_and_name_fallbacks():
    page = models_page.render({"nvidia-h200": fixture()})
    assert "80 attention calls a step, 80 served by hopattn (every call served); strict routing on." in page
    assert "288 attention calls a step, 96 served by hopattn (192 sent to SDPA); strict routing off." in page
    assert "32 served by hopattn (every call served; 32 after repeating K/V heads)" in page
    assert "| 48 | 32/32 | 126 × 126 | 64 | none | head dim 64 (hopattn serves 128) |" in page
    assert "| 32 | 32/8 | 32,768 × 32,768 | 128 | causal | served |" in page


def test_page_without_records_and_for_a_dry_run():
    empty = models_page.render({})
    assert "No model runs are recorded yet" in empty and "## What is not supported" in empty
    dry = fixture()
    dry["runs"][RUN]["dry_run"] = True
    assert "dry run on CPU" in models_page.render(dry)  # a single record is accepted too


def test_page_renders_to_html_tables_and_svg():
    markdown = pytest.importorskip("markdown")
    html = markdown.markdown(models_page.render({"nvidia-h200": fixture()}), extensions=["tables", "fenced_code"])
    assert html.count("<table>") == 3 + 3  # whole step, attention, outputs; a calls table per model
    assert html.count("<svg") == 2


def test_models_are_listed_in_natural_order():
    data = fixture()
    eight = copy.deepcopy(data["models"]["llama-3.1-8b-prefill-32k"])
    eight["label"] = "Llama-3.1-8B prefill, 8k tokens"
    data["models"]["llama-3.1-8b-prefill-8k"] = eight
    page = models_page.render(mr.validate(data))
    assert page.index("| Llama-3.1-8B prefill, 8k tokens |") < page.index("| Llama-3.1-8B prefill, 32k tokens |")


def test_the_page_says_what_each_speedup_rests_on():
    """A step speedup is stated with its samples and spread; where the backends' step ranges overlap
    the page says there is no measured difference, and it gives the attention-alone replay."""
    data = fixture()
    page = models_page.render({"nvidia-h200": data})
    wan = next(ln for ln in page.splitlines() if ln.startswith("- **Wan2.1-T2V-14B") and "SDPA" in ln)
    assert "**1.103×** SDPA a step (faster): 3 steps of each backend, spread 2.0 % and 2.0 %" in wan
    assert "do not overlap" in wan and "attention calls alone, replayed: 1.197× SDPA" in wan
    close = copy.deepcopy(data)
    hop = close["models"]["llama-3.1-8b-prefill-32k"]["cases"]["hopattn"]
    hop["step_ms"].update(min=1650.0, median=1680.0, max=1760.0, spread_pct=6.5)
    hop["speedup_step"], hop["speedup_attention"] = 1.012, 0.889
    page = models_page.render({"nvidia-h200": mr.validate(close)})
    llama = next(ln for ln in page.splitlines() if ln.startswith("- **Llama-3.1-8B") and "SDPA" in ln)
    assert "**no measured difference**: 1.012× SDPA by the medians" in llama and "6.5 % (hopattn)" in llama
    assert "0.889× SDPA" in llama
    assert models_page.supported(close["models"]["llama-3.1-8b-prefill-32k"])["apart"] is False
