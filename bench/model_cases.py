"""The models the benchmark runs: how each is built (once, from its configuration, random weights,
on the GPU in bf16), the inputs of each workload, the forward that is timed, the outputs compared
with the SDPA run, and how a backend is switched on through the library's own extension point.

A Group is one model build; its Workloads share the weights (Llama at 8k and at 32k tokens).

Training groups (``training=True``, ``python -m bench.models --training``): a step is a forward, the
model's loss and its backward (the gradients of every weight, in bf16 as the weights; no optimizer
step), compared with the SDPA run by the loss and the gradients. When the published layer count does
not fit in the GPU's memory, the runner builds fewer layers (``layers_key``) and says so.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable

from bench import model_configs as cfgs

# Registered names of the routed backends (the library's own SDPA needs no registration).
ROUTED = {"hopattn": "hopattn", "fa3": "bench_fa3", "fa4": "bench_fa4", "capture": "bench_capture"}
TRAINING_BACKENDS = ("sdpa", "cudnn", "hopattn")


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
    forward: Callable  # (torch, model, inputs) -> {name: tensor}; training: {"loss": a scalar to differentiate}
    workloads: tuple[Workload, ...] = field(default_factory=tuple)
    training: bool = False  # a step: forward, loss, backward
    layers_key: str | None = None  # the config's layer count (training: lowered until a step fits)
    backends: tuple[str, ...] | None = None  # the backends it runs (None: all)
    # the FlashAttention peers refuse what they cannot serve (True), or, where the group's fallbacks are
    # the glue's and not the kernel's (Gemma 3's sliding windows go to SDPA whichever kernel is routed
    # to), send it to SDPA counted, as hopattn does
    peers_strict: bool = True

    def runs(self, backend: str) -> bool:
        return self.backends is None or backend in self.backends

    def layers(self, config: dict) -> int | None:
        return config.get(self.layers_key) if self.layers_key else None


@contextmanager
def default_dtype(torch, dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def run_step(torch, group: Group, model, inputs) -> dict:
    """One step of ``group`` (as timed): a forward without gradients, or for a training group the
    forward, the loss and its backward (the gradients of the previous step dropped first, so the
    memory is that of one step). Returns the outputs compared with SDPA's (training: the loss)."""
    if not group.training:
        with torch.no_grad():
            return group.forward(torch, model, inputs)
    model.zero_grad(set_to_none=True)
    loss = group.forward(torch, model, inputs)["loss"]
    loss.backward()
    return {"loss": loss.detach()}


def training(build: Callable) -> Callable:
    """``build``, with the model in train mode and every weight requiring grad."""

    def build_for_training(torch, config, device, dtype):
        return build(torch, config, device, dtype).train().requires_grad_(True)

    return build_for_training


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


def forward_llama_training(torch, model, inputs):
    # The causal-LM loss over every position (transformers shifts the labels), all logits kept.
    return {"loss": model(**inputs, labels=inputs["input_ids"], use_cache=False).loss}


def llama_training_workload(length: int, tiny_length: int) -> Workload:
    base = llama_workload(length, tiny_length)
    k = length // 1024
    return Workload(id=f"llama-3.1-8b-training-{k}k", label=f"Llama-3.1-8B training step, {k}k tokens",
                    workload=f"one training step: forward, cross-entropy loss over {length:,} tokens and backward "
                             f"(bf16 gradients of every weight; no optimizer step), batch 1 (32 query heads, 8 K/V "
                             f"heads, causal)",
                    tokens=lambda tiny: {"sequence": tiny_length if tiny else length}, inputs=base.inputs,
                    est_step_s=1.0)


# --- transformers: Gemma 3 ------------------------------------------------------------------------


def build_gemma3(torch, config, device, dtype):
    import copy

    import transformers

    cfg = transformers.Gemma3TextConfig(**copy.deepcopy(config))  # the config edits its rope_parameters
    cfg._attn_implementation = "sdpa"
    with torch.device(device), default_dtype(torch, dtype):
        model = transformers.Gemma3ForCausalLM(cfg)
    return model.eval().requires_grad_(False)


def gemma3_workload(length: int, tiny_length: int) -> Workload:
    def inputs(torch, device, dtype, tiny, gen):
        vocab = (cfgs.TINY_GEMMA_3 if tiny else cfgs.GEMMA_3_12B)["vocab_size"]
        n = tiny_length if tiny else length
        return {"input_ids": torch.randint(0, vocab, (1, n), generator=gen).to(device)}

    k = length // 1024
    return Workload(id=f"gemma-3-12b-prefill-{k}k", label=f"Gemma-3-12B prefill, {k}k tokens",
                    workload=f"time to first token: one forward of {length:,} tokens, batch 1 (16 query heads, "
                             f"8 K/V heads, head dim 256, causal; 40 of the 48 layers a sliding window of 1,024, "
                             f"which the transformers glue sends to SDPA, counted)",
                    tokens=lambda tiny: {"prompt": tiny_length if tiny else length}, inputs=inputs,
                    est_step_s=0.6)


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


def forward_wan_training(torch, model, inputs):
    # Flow matching, as Wan is trained: the squared error of the predicted velocity against a target.
    kwargs = {k: v for k, v in inputs.items() if k != "target"}
    pred = model(**kwargs, return_dict=False)[0]
    return {"loss": (pred.float() - inputs["target"].float()).square().mean()}


def wan_training_workload(model_id: str, label: str, est_step_s: float, tiny_config: dict, config: dict) -> Workload:
    base = wan_workload(model_id, label, est_step_s, tiny_config, config)

    def inputs(torch, device, dtype, tiny, gen):
        kwargs = base.inputs(torch, device, dtype, tiny, gen)
        kwargs["target"] = torch.randn(kwargs["hidden_states"].shape, generator=gen).to(device, dtype)
        return kwargs

    return Workload(id=model_id, label=label, tokens=base.tokens, inputs=inputs, est_step_s=est_step_s,
                    workload="one training step at 480p x 81 frames: forward (32,760 video tokens, cross-attention "
                             "to 512 text tokens of dim 4096), the flow-matching loss (squared error of the "
                             "predicted velocity) and backward (bf16 gradients of every weight; no optimizer step)")


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


# --- diffusers: Stable Diffusion 3 ----------------------------------------------------------------


class DispatchJointAttnProcessor:
    """SD3's joint attention (diffusers' JointAttnProcessor2_0, the same projections, norms and
    concatenation, image tokens first) through ``dispatch_attention_fn``, so that the backend the
    model is switched to serves it. diffusers 0.42.1's JointAttnProcessor2_0 calls
    F.scaled_dot_product_attention itself: under it every backend would be SDPA. The native backend
    runs the same SDPA call (tests/test_bench_models.py compares the two)."""

    _attention_backend = None  # set by ModelMixin.set_attention_backend
    _parallel_config = None

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, *args, **kwargs):
        import torch
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        residual, batch = hidden_states, hidden_states.shape[0]

        def heads(x):  # [B, L, H * D] -> BSHD
            return x.view(batch, -1, attn.heads, x.shape[-1] // attn.heads)

        query, key, value = heads(attn.to_q(hidden_states)), heads(attn.to_k(hidden_states)), \
            heads(attn.to_v(hidden_states))
        head_dim = key.shape[-1]
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        if encoder_hidden_states is not None:
            eq, ek, ev = (heads(attn.add_q_proj(encoder_hidden_states)), heads(attn.add_k_proj(encoder_hidden_states)),
                          heads(attn.add_v_proj(encoder_hidden_states)))
            if attn.norm_added_q is not None:
                eq = attn.norm_added_q(eq)
            if attn.norm_added_k is not None:
                ek = attn.norm_added_k(ek)
            query, key, value = torch.cat([query, eq], dim=1), torch.cat([key, ek], dim=1), torch.cat([value, ev], dim=1)

        out = dispatch_attention_fn(query, key, value, dropout_p=0.0, is_causal=False, backend=self._attention_backend,
                                    parallel_config=self._parallel_config)
        hidden_states = out.reshape(batch, -1, attn.heads * head_dim).to(query.dtype)
        if encoder_hidden_states is not None:
            hidden_states, encoder_hidden_states = hidden_states[:, : residual.shape[1]], \
                hidden_states[:, residual.shape[1]:]
            if not attn.context_pre_only:
                encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        if encoder_hidden_states is not None:
            return hidden_states, encoder_hidden_states
        return hidden_states


def build_sd3(torch, config, device, dtype):
    model = build_diffusers("SD3Transformer2DModel")(torch, config, device, dtype)
    model.set_attn_processor(DispatchJointAttnProcessor())
    return model


# 1024 x 1024: latent 128 x 128 (VAE 8x), patch 2 -> 4,096 image tokens; text 77 (CLIP) + 256 (T5) = 333.
SD3_LATENT, SD3_TINY_LATENT = 128, 16
SD3_TEXT, SD3_TINY_TEXT = 77 + 256, 12


def sd3_inputs(torch, device, dtype, tiny, gen):
    c = cfgs.TINY_SD3 if tiny else cfgs.SD3_MEDIUM
    side, text = (SD3_TINY_LATENT, SD3_TINY_TEXT) if tiny else (SD3_LATENT, SD3_TEXT)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device, dtype)

    return {"hidden_states": randn(1, c["in_channels"], side, side),
            "encoder_hidden_states": randn(1, text, c["joint_attention_dim"]),
            "pooled_projections": randn(1, c["pooled_projection_dim"]),
            "timestep": torch.tensor([500.0], device=device)}


def sd3_tokens(tiny):
    side = SD3_TINY_LATENT if tiny else SD3_LATENT
    return {"image": (side // 2) ** 2, "text": SD3_TINY_TEXT if tiny else SD3_TEXT}


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
    # Joint attention over image and text tokens at head dim 64, through DispatchJointAttnProcessor.
    Group(id="sd3-medium", library="diffusers", config=cfgs.SD3_MEDIUM, tiny_config=cfgs.TINY_SD3,
          config_source="stabilityai/stable-diffusion-3-medium-diffusers transformer/config.json", strict=True,
          build=build_sd3, forward=forward_wan,
          workloads=(Workload(id="sd3-medium-1024px", label="Stable Diffusion 3 Medium, 1024 x 1024",
                              workload="one denoising step (one transformer forward) at 1024 x 1024: joint "
                                       "attention over 4,096 image tokens and 333 text tokens (77 CLIP, 256 T5), "
                                       "24 heads of dim 64",
                              tokens=sd3_tokens, inputs=sd3_inputs, est_step_s=0.15),)),
    # Not strict: the sliding-window layers (40 of 48) go to SDPA, for hopattn and the peers alike, counted.
    Group(id="gemma-3-12b", library="transformers", config=cfgs.GEMMA_3_12B, tiny_config=cfgs.TINY_GEMMA_3,
          config_source="google/gemma-3-12b-pt config.json, text_config (Hugging Face Hub)", strict=False,
          build=build_gemma3, forward=forward_llama, workloads=(gemma3_workload(8192, 64),),
          layers_key="num_hidden_layers", peers_strict=False),
    # Training (python -m bench.models --training): hopattn against SDPA (and SDPA's cuDNN backend) only; the
    # FlashAttention peers are described without a backward (bench/model_peers.py).
    Group(id="llama-3.1-8b-training", library="transformers", config=cfgs.LLAMA_3_1_8B, tiny_config=cfgs.TINY_LLAMA,
          config_source="meta-llama/Llama-3.1-8B config.json (Hugging Face Hub)", strict=True,
          build=training(build_llama), forward=forward_llama_training,
          workloads=(llama_training_workload(8192, 64),), training=True, layers_key="num_hidden_layers",
          backends=TRAINING_BACKENDS),
    Group(id="wan2.1-t2v-1.3b-training", library="diffusers", config=cfgs.WAN_2_1_T2V_1_3B,
          tiny_config=cfgs.TINY_WAN,
          config_source="Wan-Video/Wan2.1 wan/configs/wan_t2v_1_3B.py (= Wan-AI/Wan2.1-T2V-1.3B-Diffusers "
                        "transformer/config.json)", strict=True,
          build=training(build_diffusers("WanTransformer3DModel")), forward=forward_wan_training,
          workloads=(wan_training_workload("wan2.1-t2v-1.3b-training-480p",
                                           "Wan2.1-T2V-1.3B training step, 480p x 81 frames", 2.5,
                                           cfgs.TINY_WAN, cfgs.WAN_2_1_T2V_1_3B),),
          training=True, layers_key="num_layers", backends=TRAINING_BACKENDS),
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


def attention_parameter(name: str) -> bool:
    """Whether a weight belongs to an attention module (Llama's self_attn, Wan's attn1 and attn2):
    the projections whose gradients come straight out of attention's dQ, dK and dV."""
    return "attn" in name


def grad_errors(torch, model, reference: dict, device) -> dict:
    """Relative errors (Frobenius, in float32) of the model's gradients against ``reference`` ({name:
    tensor}, on any device): all of them together, the attention modules' together, and the worst
    single tensor's."""
    sums = {"all": [0.0, 0.0], "attention": [0.0, 0.0]}
    worst = 0.0
    for name, p in model.named_parameters():
        ref = reference.get(name)
        if ref is None or p.grad is None:
            continue
        got, want = p.grad.float(), ref.to(device, non_blocking=True).float()
        diff, norm = float(torch.linalg.vector_norm(got - want)) ** 2, float(torch.linalg.vector_norm(want)) ** 2
        if not (diff == diff and norm == norm and diff != float("inf")):  # NaN or inf in either
            return {"rel_err_grads": None, "rel_err_grads_attention": None, "rel_err_grads_worst": None}
        for key in ("all", "attention") if attention_parameter(name) else ("all",):
            sums[key][0] += diff
            sums[key][1] += norm
        if norm > 0:
            worst = max(worst, (diff / norm) ** 0.5)
    rel = {k: (d / n) ** 0.5 if n > 0 else None for k, (d, n) in sums.items()}
    return {"rel_err_grads": rel["all"], "rel_err_grads_attention": rel["attention"], "rel_err_grads_worst": worst}


def host_grads(model) -> dict:
    """The model's gradients, copied to host memory (the next step's are compared with them)."""
    return {n: p.grad.detach().to("cpu") for n, p in model.named_parameters() if p.grad is not None}


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
