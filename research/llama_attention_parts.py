"""Where Llama-3.1-8B's attention call spends its time in training, hopattn against SDPA (issue #28).

The training bench (run 20261203T090329Z) replayed the step's attention calls at 0.933x SDPA, while
the backward kernel alone is level with cuDNN at this shape (research/backward_devtime.py
8192:1x32x8). This script times one attention call as transformers makes it (q, k, v BHSD views of
BSHD memory, 32 query and 8 K/V heads, 8k causal, batch 1, head dim 128; the output gradient laid
out like o_proj's input gradient), forward alone and forward + backward, for each arm in one
process, then lists every CUDA kernel one forward + backward launches, with its time (torch.profiler).

    python3 research/llama_attention_parts.py [LENGTH] [BATCH]
"""
import sys
from types import SimpleNamespace

import torch
import triton
from hopattn.integrations import transformers as hop_tf
from hopattn.records import runs
from torch.autograd import DeviceType
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

print(runs.log_header(runs.script_command()), flush=True)
LENGTH = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
BATCH = int(sys.argv[2]) if len(sys.argv) > 2 else 1
HEADS, KV_HEADS, D = 32, 8, 128
torch.manual_seed(0)
dev = "cuda"


def projections():
    """q, k, v as LlamaAttention makes them: [B, L, H, D] memory, transposed to BHSD views."""
    q = torch.randn(BATCH, LENGTH, HEADS, D, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(BATCH, LENGTH, KV_HEADS, D, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    v = torch.randn(BATCH, LENGTH, KV_HEADS, D, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    return [t.detach().requires_grad_() for t in (q, k, v)]


module = SimpleNamespace(is_causal=True, num_key_value_groups=HEADS // KV_HEADS, training=True)
hop_tf.register()
hop_fn = AttentionInterface()["hopattn"]


def arm_hopattn(q, k, v):
    return hop_fn(module, q, k, v, None, dropout=0.0, scaling=D ** -0.5)[0]


def arm_sdpa(q, k, v):  # transformers' own SDPA path, torch's backend choice
    return sdpa_attention_forward(module, q, k, v, None, dropout=0.0, scaling=D ** -0.5)[0]


def arm_cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return sdpa_attention_forward(module, q, k, v, None, dropout=0.0, scaling=D ** -0.5)[0]


def arm_flash(q, k, v):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return sdpa_attention_forward(module, q, k, v, None, dropout=0.0, scaling=D ** -0.5)[0]


ARMS = {"hopattn": arm_hopattn, "sdpa": arm_sdpa, "cudnn": arm_cudnn, "flash": arm_flash}
q, k, v = projections()
grad_out = torch.randn(BATCH, LENGTH, HEADS * D, device=dev, dtype=torch.bfloat16)


def step(fn):
    out = fn(q, k, v)  # BSHD [B, L, H, D], as the attention functions return it
    out.reshape(BATCH, LENGTH, HEADS * D).backward(grad_out)


def forward_only(fn):
    with torch.no_grad():
        fn(q, k, v)


flops = 4 * BATCH * HEADS * LENGTH * LENGTH * D / 2  # causal
times = {}
for name, fn in ARMS.items():
    try:
        step(fn)
        f = triton.testing.do_bench(lambda fn=fn: forward_only(fn), warmup=20, rep=200, return_mode="median")
        fb = triton.testing.do_bench(lambda fn=fn: step(fn), warmup=20, rep=300, return_mode="median")
    except Exception as e:  # a backend torch cannot run here: say so, keep the others
        print(f"{name:8s} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        continue
    times[name] = (f, fb)
    print(f"{name:8s} forward {f:7.3f} ms ({flops / f * 1e-9:6.1f} TFLOP/s)   forward+backward {fb:7.3f} ms   "
          f"backward by difference {fb - f:7.3f} ms ({2.5 * flops / (fb - f) * 1e-9:6.1f} TFLOP/s)", flush=True)
for name, (f, fb) in times.items():
    if "sdpa" in times:
        print(f"{name:8s} vs sdpa: forward {times['sdpa'][0] / f:.3f}x  forward+backward {times['sdpa'][1] / fb:.3f}x")

for name, fn in ARMS.items():
    if name not in times:
        continue
    for _ in range(3):
        step(fn)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step(fn)
        torch.cuda.synchronize()
    print(f"\n== {name}: CUDA kernels of one forward + backward (mean of 5)")
    per_kernel = {}  # name -> [µs, launches]
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            entry = per_kernel.setdefault(e.name, [0.0, 0])
            entry[0] += e.time_range.elapsed_us()
            entry[1] += 1
    for kernel, (us, count) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:14]:
        print(f"  {us / 5 / 1000:8.3f} ms  x{count // 5:<3d} {kernel[:110]}")
    print(f"  {sum(us for us, _ in per_kernel.values()) / 5 / 1000:8.3f} ms  in all")
