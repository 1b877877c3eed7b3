"""The models the benchmark runs: how each is built (once, from its configuration, random weights,
on the GPU in bf16), the inputs of each workload, the forward that is timed, the outputs compared
with the SDPA run, and how a backend is switched on through the library's own extension point.

A Group is one model build; its Workloads share the weights (Llama at 8k and at 32k tokens).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable

from bench import model_configs as cfgs

# Registered names of the routed backends (the library's own SDPA needs no registration).
ROUTED = {"hopattn": "hopattn", "fa3": "bench_fa3", "fa4": "bench_fa4", "capture": "bench_capture"}


@dataclass(frozen=True)
class Workload:
    id: str  # the record's model id
    label: str
    workload: str  # what one timed step is, in words
    tokens: Callable[[bool], dict]  # tiny -> {"video": n, ...}
    inputs: Callable  # (torch, device, dtype, tiny, generator) -> kwargs of the forward
    est_step_s: float  # one step with SDPA on an H200, for the plan printed before the run


@dataclass(frozen=True)
class Group:
    id: str
    library: str
    config: dict
    tiny_config: dict
    config_source: str
    strict: bool  # hopattn must serve every attention call of the step
    build: Callable  # (torch, config, device, dtype) -> model
    forward: Callable  # (torch, model, inputs) -> {name: tensor}
    workloads: tuple[Workload, ...] = field(default_factory=tuple)


@contextmanager
def default_dtype(torch, dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


# --- transformers: Llama --------------------------------------------------------------------------

KEEP_LOGITS = 64  # positions whose logits are compared (the last one is the first generated token)


def build_llama(torch, config, device, dtype):
    import transformers

    cfg = transformers.LlamaConfig(**config)
    cfg._attn_implementation = "sdpa"
    with torch.device(device), default_dtype(torch, dtype):
        model = transformers.LlamaForCausalLM(cfg)
    return model.eval().requires_grad_(False)


def forward_llama(torch, model, inputs):
    # One prefill, no cache: the time to first token. Logits of the last KEEP_LOGITS positions only.
    return {"logits": model(**inputs, use_cache=False, logits_to_keep=KEEP_LOGITS).logits[0]}


def llama_workload(length: int, tiny_length: int) -> Workload:
    def inputs(torch, device, dtype, tiny, gen):
        vocab = (cfgs.TINY_LLAMA if tiny else cfgs.LLAMA_3_1_8B)["vocab_size"]
        n = tiny_length if tiny else length
        return {"input_ids": torch.randint(0, vocab, (1, n), generator=gen).to(device)}

    k = length // 1024
    return Workload(id=f"llama-3.1-8b-prefill-{k}k", label=f"Llama-3.1-8B prefill, {k}k tokens",
                    workload=f"time to first token: one forward of {length:,} tokens, batch 1 (32 query heads, "
                             f"8 K/V heads, causal)",
                    tokens=lambda tiny: {"prompt": tiny_length if tiny else length}, inputs=inputs,
                    est_step_s=0.3 if length <= 8192 else 1.8)


# --- diffusers: Wan2.1 and LTX-2 -------------------------------------------------------------------


def build_diffusers(class_name: str):
    def build(torch, config, device, dtype):
        import diffusers

        with torch.device(device), default_dtype(torch, dtype):
            model = getattr(diffusers, class_name)(**config)
        return model.to(dtype).eval().requires_grad_(False)

    return build


def forward_wan(torch, model, inputs):
    return {"latents": model(**inputs, return_dict=False)[0]}


# 480p x 81 frames: latent 21 x 60 x 104 (VAE stride 4, 8, 8), patchified 1x2x2 -> 32,760 tokens.
WAN_LATENT, WAN_TINY_LATENT = (21, 60, 104), (3, 8, 8)
WAN_TEXT, WAN_TINY_TEXT = 512, 12


def wan_workload(model_id: str, label: str, est_step_s: float, tiny_config: dict, config: dict) -> Workload:
    def inputs(torch, device, dtype, tiny, gen):
        c = tiny_config if tiny else config
        f, h, w = WAN_TINY_LATENT if tiny else WAN_LATENT
        text = WAN_TINY_TEXT if tiny else WAN_TEXT
        return {"hidden_states": torch.randn(1, c["in_channels"], f, h, w, generator=gen).to(device, dtype),
                "timestep": torch.tensor([500.0], device=device),
                "encoder_hidden_states": torch.randn(1, text, c["text_dim"], generator=gen).to(device, dtype)}

    def tokens(tiny):
        f, h, w = WAN_TINY_LATENT if tiny else WAN_LATENT
        return {"video": f * (h // 2) * (w // 2), "text": WAN_TINY_TEXT if tiny else WAN_TEXT}

    return Workload(id=model_id, label=label, tokens=tokens, inputs=inputs, est_step_s=est_step_s,
                    workload="one denoising step (one transformer forward) at 480p x 81 frames: 32,760 video "
                             "tokens, cross-attention to 512 text tokens of dim 4096")


def forward_ltx2(torch, model, inputs):
    video, audio = model(**inputs, return_dict=False)
    return {"video": video, "audio": audio}


# 512 x 768, 121 frames: 16 latent frames of 16 x 24 (VAE 8x temporal, 32x32 spatial) = 6,144 video
# tokens; 121/24 s of audio at 25 latent frames a second = 126 audio tokens; 1,024 text tokens.
LTX2_VIDEO, LTX2_TINY_VIDEO = (16, 16, 24), (2, 4, 4)
LTX2_AUDIO, LTX2_TINY_AUDIO = 126, 5
LTX2_TEXT, LTX2_TINY_TEXT = 1024, 8


def ltx2_inputs(torch, device, dtype, tiny, gen):
    c = cfgs.TINY_LTX_2 if tiny else cfgs.LTX_2
    f, h, w = LTX2_TINY_VIDEO if tiny else LTX2_VIDEO
    audio, text = (LTX2_TINY_AUDIO, LTX2_TINY_TEXT) if tiny else (LTX2_AUDIO, LTX2_TEXT)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device, dtype)

    return {"hidden_states": randn(1, f * h * w, c["in_channels"]),
            "audio_hidden_states": randn(1, audio, c["audio_in_channels"]),
            "encoder_hidden_states": randn(1, text, c["caption_channels"]),
            "audio_encoder_hidden_states": randn(1, text, c["caption_channels"]),
            "timestep": torch.tensor([500.0], device=device), "sigma": torch.tensor([0.5], device=device),
            # all ones, as LTX-2's text connectors leave it (padding replaced by registers)
            "encoder_attention_mask": torch.ones(1, text, device=device),
            "audio_encoder_attention_mask": torch.ones(1, text, device=device),
            "num_frames": f, "height": h, "width": w, "fps": 24.0, "audio_num_frames": audio}


def ltx2_tokens(tiny):
    f, h, w = LTX2_TINY_VIDEO if tiny else LTX2_VIDEO
    return {"video": f * h * w, "audio": LTX2_TINY_AUDIO if tiny else LTX2_AUDIO,
            "text": LTX2_TINY_TEXT if tiny else LTX2_TEXT}


GROUPS = {g.id: g for g in (
    Group(id="llama-3.1-8b", library="transformers", config=cfgs.LLAMA_3_1_8B, tiny_config=cfgs.TINY_LLAMA,
          config_source="meta-llama/Llama-3.1-8B config.json (Hugging Face Hub)", strict=True,
          build=build_llama, forward=forward_llama,
          workloads=(llama_workload(8192, 64), llama_workload(32768, 128))),
    Group(id="wan2.1-t2v-14b", library="diffusers", config=cfgs.WAN_2_1_T2V_14B, tiny_config=cfgs.TINY_WAN,
          config_source="Wan-Video/Wan2.1 wan/configs/wan_t2v_14B.py (= Wan-AI/Wan2.1-T2V-14B-Diffusers "
                        "transformer/config.json)", strict=True,
          build=build_diffusers("WanTransformer3DModel"), forward=forward_wan,
          workloads=(wan_workload("wan2.1-t2v-14b-480p", "Wan2.1-T2V-14B, 480p x 81 frames", 3.5,
                                  cfgs.TINY_WAN, cfgs.WAN_2_1_T2V_14B),)),
    Group(id="wan2.1-t2v-1.3b", library="diffusers", config=cfgs.WAN_2_1_T2V_1_3B, tiny_config=cfgs.TINY_WAN,
          config_source="Wan-Video/Wan2.1 wan/configs/wan_t2v_1_3B.py (= Wan-AI/Wan2.1-T2V-1.3B-Diffusers "
                        "transformer/config.json)", strict=True,
          build=build_diffusers("WanTransformer3DModel"), forward=forward_wan,
          workloads=(wan_workload("wan2.1-t2v-1.3b-480p", "Wan2.1-T2V-1.3B, 480p x 81 frames", 0.7,
                                  cfgs.TINY_WAN, cfgs.WAN_2_1_T2V_1_3B),)),
    # Not strict: the audio attention has head dim 64 and is counted as fallbacks, by design.
    Group(id="ltx-2", library="diffusers", config=cfgs.LTX_2, tiny_config=cfgs.TINY_LTX_2,
          config_source="diffusers scripts/convert_ltx2_to_diffusers.py, version 2.0 (= Lightricks/LTX-2 "
                        "transformer/config.json)", strict=False,
          build=build_diffusers("LTX2VideoTransformer3DModel"), forward=forward_ltx2,
          workloads=(Workload(id="ltx-2-512x768x121", label="LTX-2, 512 x 768 x 121 frames, with audio",
                              workload="one denoising step (one transformer forward) at 512 x 768, 121 frames: "
                                       "6,144 video tokens, 126 audio tokens, 1,024 text tokens",
                              tokens=ltx2_tokens, inputs=ltx2_inputs, est_step_s=0.6),)),
)}

# --- switching a built model between backends ----------------------------------------------------


@contextmanager
def backend(torch, library: str, model, name: str):
    """Run the body with ``model`` switched to backend ``name`` (sdpa, cudnn, or a ROUTED one)."""
    cudnn = name == "cudnn"
    if library == "transformers":
        model.set_attn_implementation("sdpa" if name in ("sdpa", "cudnn") else ROUTED[name])
    else:
        model.set_attention_backend("native" if name in ("sdpa", "cudnn") else ROUTED[name])
    if cudnn:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        context = sdpa_kernel([SDPBackend.CUDNN_ATTENTION])
    else:
        context = nullcontext()
    with context:
        yield


def register(library: str, name: str, kernel, strict: bool) -> None:
    """Register ``kernel`` under the routed name of backend ``name`` with the model's library."""
    if library == "transformers":
        from hopattn.integrations import transformers as integration
    else:
        from hopattn.integrations import diffusers as integration
    integration.register(strict=strict, kernel=kernel, name=ROUTED[name])


def compare(torch, outputs: dict, reference: dict) -> dict:
    """Relative errors (Frobenius) of each output against SDPA's; argmax agreement for logits."""
    errors = {}
    for key, ref in reference.items():
        out, ref = outputs[key].float().cpu(), ref.float().cpu()
        if not (torch.isfinite(out).all() and torch.isfinite(ref).all()):
            errors[f"rel_err_{key}"] = None
            continue
        errors[f"rel_err_{key}"] = float((out - ref).norm() / ref.norm().clamp_min(1e-30))
        if key == "logits":
            errors["argmax_agreement"] = float((out.argmax(-1) == ref.argmax(-1)).float().mean())
    return errors
