"""Which attention is closer to float64 inside a Llama-3.1-8B training step: hopattn's or SDPA's?

The training bench (`python -m bench.models --training`) measures hopattn's gradients 7.6 % from
SDPA's at 8k, where SDPA run to run differs by 1.9 %; every kernel test passes against float64 on
random inputs. This script takes the inputs the model itself gives its attention: a Llama-3.1-8B-shaped
model (random weights, the 8B config, LAYERS of its 32 layers, bf16, 8k tokens, batch 1) runs one
forward and backward with SDPA; a capturing attention function records, for every layer, q, k, v (BHSD,
32 query heads, 8 K/V heads, causal) and the gradient its output received. For each layer it then
computes the attention and its gradients three ways on those same bf16 inputs — float64 (the
reference, chunked over heads), torch SDPA in bf16 (what the model used) and hopattn in bf16 — and
prints each one's error against float64: relative L2 (‖x − ref‖ / ‖ref‖) and the largest error over
the largest |ref|, for O, dQ, dK and dV.

    PYTHONPATH=$PWD/kernels:$PWD python3 research/accuracy/llama_attention_fp64.py [LAYERS] [LENGTH]
"""
from __future__ import annotations

import sys

import hopattn
import torch
import torch.nn.functional as F

LAYERS = int(sys.argv[1]) if len(sys.argv) > 1 else 4
LENGTH = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run of the capture and the reference (--tiny)
TINY = "--tiny" in sys.argv  # hidden 256, 4 heads of 64 over 2 K/V heads, vocab 1000


def capture_step(layers: int, length: int) -> list[dict]:
    from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    seen: list[dict] = []

    def capturing(module, query, key, value, attention_mask, **kwargs):
        entry = {"q": query.detach().clone(), "k": key.detach().clone(), "v": value.detach().clone(),
                 "scale": kwargs.get("scaling") or module.scaling}
        out, weights = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        if out.requires_grad:
            out.register_hook(lambda g: entry.__setitem__("dout", g.detach().transpose(1, 2).contiguous()))
        seen.append(entry)
        return out, weights

    AttentionInterface.register("capture_fp64_study", capturing)
    dims = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, vocab_size=1000) if TINY \
        else dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)
    cfg = LlamaConfig(**dims, num_hidden_layers=layers, max_position_embeddings=131072, rope_theta=500000.0,
                      rms_norm_eps=1e-5, torch_dtype=torch.bfloat16)
    cfg._attn_implementation = "capture_fp64_study"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(DEVICE, torch.bfloat16).train()
    ids = torch.randint(0, cfg.vocab_size, (1, length), device=DEVICE)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    del model
    torch.cuda.empty_cache()
    return seen


def reference(q, k, v, dout, scale, heads_per_chunk=4):
    """float64 attention, causal, GQA (query head h reads K/V head h // group), and its gradients."""
    B, H, L, D = q.shape
    group = H // k.shape[1]
    o = torch.empty(B, H, L, v.shape[-1], dtype=torch.float64, device=q.device)
    dq = torch.empty_like(o[..., :D])
    dk = torch.zeros(B, k.shape[1], L, D, dtype=torch.float64, device=q.device)
    dv = torch.zeros_like(dk)
    mask = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    for h0 in range(0, H, heads_per_chunk):
        hs = slice(h0, h0 + heads_per_chunk)
        kv = torch.arange(h0, h0 + heads_per_chunk, device=q.device) // group
        qq = q[:, hs].double().requires_grad_(True)
        kk = k[:, kv].double().requires_grad_(True)
        vv = v[:, kv].double().requires_grad_(True)
        s = (qq @ kk.transpose(-1, -2)) * scale
        s = s.masked_fill(~mask, float("-inf"))
        out = torch.softmax(s, -1) @ vv
        gq, gk, gv = torch.autograd.grad(out, (qq, kk, vv), dout[:, hs].double())
        o[:, hs] = out.detach()
        dq[:, hs] = gq
        dk.index_add_(1, kv, gk)
        dv.index_add_(1, kv, gv)
        del s, out, gq, gk, gv
    return o, dq, dk, dv


def bf16_grads(fn, q, k, v, dout):
    qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(qq, kk, vv)
    return (out.detach(), *torch.autograd.grad(out, (qq, kk, vv), dout))


def errors(x, ref):
    x, ref = x.double(), ref.double()
    return (torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref)).item(), \
           ((x - ref).abs().amax() / ref.abs().amax()).item()


def main() -> None:
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    print(f"# llama_attention_fp64.py: Llama-3.1-8B shape{' (tiny)' if TINY else ''}, {LAYERS} layers, {LENGTH} tokens, "
          f"random weights; torch {torch.__version__}, {gpu}", flush=True)
    seen = capture_step(LAYERS, LENGTH)
    print(f"captured {len(seen)} attention calls: q {tuple(seen[0]['q'].shape)}, k {tuple(seen[0]['k'].shape)}", flush=True)
    sdpa = lambda q, k, v, scale: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)  # noqa: E731
    hop = (lambda q, k, v, scale: hopattn.attention(q, k, v, causal=True, scale=scale)) if DEVICE == "cuda" else sdpa  # noqa: E731
    names = ("O", "dQ", "dK", "dV")
    print(f"{'layer':>5} {'tensor':>6} {'sdpa rel L2':>12} {'hopattn rel L2':>15} {'ratio':>6} {'sdpa max/max':>13} {'hopattn max/max':>16}")
    totals = {n: [0.0, 0.0] for n in names}
    for i, e in enumerate(seen):
        q, k, v, dout, scale = e["q"], e["k"], e["v"], e["dout"], e["scale"]
        ref = reference(q, k, v, dout, scale)
        a = bf16_grads(lambda q_, k_, v_, scale=scale: sdpa(q_, k_, v_, scale), q, k, v, dout)
        b = bf16_grads(lambda q_, k_, v_, scale=scale: hop(q_, k_, v_, scale), q, k, v, dout)
        for n, r, x, y in zip(names, ref, a, b):
            ea, eb = errors(x, r), errors(y, r)
            totals[n][0] += ea[0] / len(seen)
            totals[n][1] += eb[0] / len(seen)
            print(f"{i:>5} {n:>6} {ea[0]:12.3e} {eb[0]:15.3e} {eb[0] / ea[0]:6.2f} {ea[1]:13.3e} {eb[1]:16.3e}", flush=True)
        del ref, a, b
        torch.cuda.empty_cache()
    print("mean over layers (rel L2): " + ", ".join(f"{n} sdpa {t[0]:.3e} hopattn {t[1]:.3e} ({t[1] / t[0]:.2f}x)" for n, t in totals.items()))


if __name__ == "__main__":
    main()
