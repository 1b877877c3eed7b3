"""The published configurations the model benchmark builds (random weights: nothing downloads),
and tiny ones of the same classes for the dry run and the CPU tests.

Sources, as published:
- Llama-3.1-8B: config.json of meta-llama/Llama-3.1-8B on the Hugging Face Hub.
- Wan2.1-T2V-14B and -1.3B: wan/configs/wan_t2v_14B.py and wan_t2v_1_3B.py of Wan-Video/Wan2.1 (dim, ffn_dim,
  num_heads, num_layers, text_len 512, vae_stride (4, 8, 8)), which are the transformer/config.json of
  Wan-AI/Wan2.1-T2V-14B-Diffusers and -1.3B-Diffusers in diffusers' parameter names.
- LTX-2: get_ltx2_transformer_config("2.0") in diffusers' scripts/convert_ltx2_to_diffusers.py (the
  transformer/config.json of Lightricks/LTX-2); sizes from diffusers' LTX2Pipeline defaults (512 x 768,
  121 frames at 24 fps, 1,024 text tokens) and its VAE (8x temporal, 32x32 spatial compression; audio at
  16 kHz, hop 160, 4x compression: 25 latent frames a second).
- Stable Diffusion 3 (medium): transformer/config.json of stabilityai/stable-diffusion-3-medium-diffusers
  (SD3Transformer2DModel); sizes from diffusers' StableDiffusion3Pipeline defaults (1024 x 1024, VAE 8x ->
  a 128 x 128 latent, patch 2 -> 4,096 image tokens; 77 CLIP + 256 T5 tokens = 333 text tokens).
- Gemma 3 12B: text_config of google/gemma-3-12b-pt's config.json (Gemma3TextConfig, Gemma3ForCausalLM).
"""

from __future__ import annotations

LLAMA_3_1_8B = {
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "mlp_bias": False, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256,
}

WAN_2_1_T2V_14B = {
    "added_kv_proj_dim": None, "attention_head_dim": 128, "cross_attn_norm": True, "eps": 1e-06, "ffn_dim": 13824,
    "freq_dim": 256, "image_dim": None, "in_channels": 16, "num_attention_heads": 40, "num_layers": 40,
    "out_channels": 16, "patch_size": [1, 2, 2], "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 1024,
    "text_dim": 4096,
}

WAN_2_1_T2V_1_3B = {**WAN_2_1_T2V_14B, "ffn_dim": 8960, "num_attention_heads": 12, "num_layers": 30}

LTX_2 = {
    "in_channels": 128, "out_channels": 128, "patch_size": 1, "patch_size_t": 1, "num_attention_heads": 32,
    "attention_head_dim": 128, "cross_attention_dim": 4096, "vae_scale_factors": [8, 32, 32], "pos_embed_max_pos": 20,
    "base_height": 2048, "base_width": 2048, "audio_in_channels": 128, "audio_out_channels": 128,
    "audio_patch_size": 1, "audio_patch_size_t": 1, "audio_num_attention_heads": 32, "audio_attention_head_dim": 64,
    "audio_cross_attention_dim": 2048, "audio_scale_factor": 4, "audio_pos_embed_max_pos": 20,
    "audio_sampling_rate": 16000, "audio_hop_length": 160, "num_layers": 48, "activation_fn": "gelu-approximate",
    "qk_norm": "rms_norm_across_heads", "norm_elementwise_affine": False, "norm_eps": 1e-06, "caption_channels": 3840,
    "attention_bias": True, "attention_out_bias": True, "rope_theta": 10000.0, "causal_offset": 1,
}

# Tiny configurations of the same classes: same head dims (128; LTX-2's audio 64), few heads and layers.
TINY_LLAMA = {**LLAMA_3_1_8B, "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 128, "num_hidden_layers": 2, "vocab_size": 512,
              "max_position_embeddings": 4096}
TINY_WAN = {**WAN_2_1_T2V_14B, "num_attention_heads": 2, "num_layers": 2, "ffn_dim": 256, "text_dim": 64,
            "freq_dim": 32, "in_channels": 4, "out_channels": 4, "rope_max_seq_len": 64}
TINY_LTX_2 = {**LTX_2, "in_channels": 4, "out_channels": 4, "num_attention_heads": 2, "cross_attention_dim": 256,
              "audio_in_channels": 4, "audio_out_channels": 4, "audio_num_attention_heads": 2,
              "audio_cross_attention_dim": 128, "num_layers": 2, "caption_channels": 16}

# Stable Diffusion 3 (medium): transformer/config.json of stabilityai/stable-diffusion-3-medium-diffusers
# (24 joint-attention layers of 24 heads of dim 64; SD3.0: no qk norm, no dual-attention layers).
SD3_MEDIUM = {
    "sample_size": 128, "patch_size": 2, "in_channels": 16, "num_layers": 24, "attention_head_dim": 64,
    "num_attention_heads": 24, "joint_attention_dim": 4096, "caption_projection_dim": 1536,
    "pooled_projection_dim": 2048, "out_channels": 16, "pos_embed_max_size": 192,
}

# Gemma 3 12B, text only: text_config of google/gemma-3-12b-pt's config.json, in transformers 5's names
# (rope_scaling linear x8 on the global layers, rope_local_base_freq 10,000 on the sliding ones ->
# rope_parameters; sliding_window_pattern 6 -> layer_types: 5 sliding layers, then 1 global, 8 times).
GEMMA_3_12B = {
    "hidden_size": 3840, "intermediate_size": 15360, "num_hidden_layers": 48, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-06, "vocab_size": 262208, "query_pre_attn_scalar": 256,
    "sliding_window": 1024, "attn_logit_softcapping": None, "final_logit_softcapping": None,
    "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": True,
    "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
}

# Tiny ones: SD3's head dim 64 and Gemma 3's 256, a sliding window shorter than the tiny prompt (so the
# five sliding layers of six fall back as at 8k).
TINY_SD3 = {**SD3_MEDIUM, "sample_size": 16, "in_channels": 4, "out_channels": 4, "num_layers": 2,
            "num_attention_heads": 2, "joint_attention_dim": 64, "caption_projection_dim": 128,
            "pooled_projection_dim": 32, "pos_embed_max_size": 32}
TINY_GEMMA_3 = {**GEMMA_3_12B, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 6,
                "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 512,
                "max_position_embeddings": 4096, "sliding_window": 16}
