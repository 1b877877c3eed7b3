"""torch SDPA's backward against float64 at a Llama-8B attention shape (1 x 32 query heads over 8 K/V
heads, 8k, head dim 128, causal, bf16), each backend and both ways of giving it the grouped heads,
with the output's gradient given contiguous (BHSD) and laid out like SDPA's output.

llama_attention_fp64.py found SDPA's gradients 1.4–1.7 (relative L2) from float64 on the inputs a
Llama step gave its attention, where hopattn's were 2.4e-3: this says which backend and which call.

    PYTHONPATH=$PWD/kernels:$PWD python3 research/accuracy/sdpa_gqa_backward_check.py
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from llama_attention_fp64 import errors, reference  # noqa: E402  (same folder)
from torch.nn.attention import SDPBackend, sdpa_kernel

B, H, KVH, L, D = 1, 32, 8, 8192, 128
gen = torch.Generator(device="cuda").manual_seed(1)
q = torch.randn(B, H, L, D, generator=gen, device="cuda").to(torch.bfloat16)
k = torch.randn(B, KVH, L, D, generator=gen, device="cuda").to(torch.bfloat16)
v = torch.randn(B, KVH, L, D, generator=gen, device="cuda").to(torch.bfloat16)
dout = torch.randn(B, H, L, D, generator=gen, device="cuda").to(torch.bfloat16)
scale = D ** -0.5
ref = reference(q, k, v, dout, scale)
print(f"# {torch.__version__}, {torch.cuda.get_device_name()}; q {tuple(q.shape)}, k {tuple(k.shape)}, causal, bf16")
print(f"{'layout':>11} {'backend':>10} {'gqa':>14} {'dout':>10} {'out strides':>28} {'O':>10} {'dQ':>10} {'dK':>10} {'dV':>10}")
# "bshd views": q, k, v as transformers gives them, BHSD views of BSHD memory (strides (L·H·D, D, H·D, 1))
as_views = lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)  # noqa: E731
for layout in ("contiguous", "bshd views"):
  for backend in (None, SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
    for gqa in ("enable_gqa", "repeat_kv"):
        for like_out in (False, True):
            qq, kk, vv = (t.detach().clone() for t in (q, k, v))
            if layout == "bshd views":
                qq, kk, vv = (as_views(t) for t in (qq, kk, vv))
            qq, kk, vv = (t.requires_grad_(True) for t in (qq, kk, vv))
            try:
                ctx = sdpa_kernel([backend]) if backend is not None else torch.enable_grad()
                with ctx:
                    if gqa == "enable_gqa":
                        out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=scale, enable_gqa=True)
                    else:
                        out = F.scaled_dot_product_attention(qq, kk.repeat_interleave(H // KVH, 1),
                                                             vv.repeat_interleave(H // KVH, 1), is_causal=True, scale=scale)
                    g = torch.empty_like(out).copy_(dout) if like_out else dout
                    grads = torch.autograd.grad(out, (qq, kk, vv), g)
            except Exception as err:  # a backend that does not take this call
                print(f"{layout:>11} {str(backend).split('.')[-1]:>10} {gqa:>14} {'like out' if like_out else 'contig':>10}  not served: {str(err)[:80]}")
                continue
            e = [errors(x, r)[0] for x, r in zip((out.detach(), *grads), ref)]
            print(f"{layout:>11} {str(backend).split('.')[-1]:>10} {gqa:>14} {'like out' if like_out else 'contig':>10} "
                  f"{str(tuple(out.stride())):>28} " + " ".join(f"{x:10.3e}" for x in e), flush=True)
