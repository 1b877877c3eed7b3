"""One model group in its own process: build it once, then run the requested (workload, backend)
cases on the same weights, reporting each as a JSON line to a progress file the parent watches.

    python -m bench.model_runner --group wan2.1-t2v-14b --cases wan2.1-t2v-14b-480p:sdpa,... \\
        --progress run/progress.jsonl --workdir run/ [--dry-run] [--reps 3] [--warmup 1]

Started by bench.models, which kills it when a case runs past its deadline (a hang) and starts a new
one for the cases left. Events: environment, built, workload, case_start, case_done.

A training group's model is fitted first: one step (through SDPA, under the capture backend) at the
published layer count; if it runs out of memory, or peaks above FIT_SHARE of the GPU's memory, the
model is built again with a quarter fewer layers, until a step fits (each build is a "built" event,
with the layers it has and why the larger counts were dropped). Its cases compare the loss with the
SDPA run's (through the file every case reads) and the gradients with those of the SDPA run in this
process (kept in host memory: they do not go through a file, which at 8B would be 16 GB); and each
backend's last timed step with its first (``_rerun``: run-to-run differences, 0 when deterministic).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

from bench import model_cases, model_peers, model_timing

PLANT_HANG = "HOPATTN_MODELS_PLANT_HANG"  # "<workload>:<backend>": that case sleeps forever (watchdog tests)
PLANT_OOM = "HOPATTN_MODELS_PLANT_OOM"  # "<layers>": a training fit above that many layers runs out of memory (tests)
FIT_SHARE = 0.93  # a training step fits when its peak is at most this share of the GPU's memory
_GRAD_REFERENCE: dict = {}  # workload -> the reference step's gradients in this process, on the host


class Progress:
    def __init__(self, path: Path):
        self.path = path

    def emit(self, event: str, **data) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"event": event, "t": time.time(), **data}) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _version(dist: str, module: str | None = None) -> str | None:
    from importlib import import_module, metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        pass
    if module is None:
        return None
    try:
        mod = import_module(module)
    except Exception:
        return None
    return str(getattr(mod, "__version__", "present"))


def environment(torch, device) -> dict:
    env = {"transformers": _version("transformers"), "diffusers": _version("diffusers"),
           "flash_attn_3": _version("flash-attn-3", "flash_attn_interface"),
           "flash_attn_4": _version("flash-attn-4", "flash_attn.cute"), "torch": torch.__version__,
           "cuda": torch.version.cuda}
    if device.type == "cuda":
        from bench.env import driver_version

        props = torch.cuda.get_device_properties(device)
        major, minor = torch.cuda.get_device_capability(device)
        env.update(gpu_name=props.name, compute_capability=f"{major}.{minor}", sm_count=props.multi_processor_count,
                   driver=driver_version(), cudnn=str(torch.backends.cudnn.version()))
    else:
        env.update(gpu_name="cpu", compute_capability=None, sm_count=None, driver=None, cudnn=None)
    return env


def hopattn_kernel(torch, device, dry_run: bool):
    """The real kernel on a GPU; on the dry run its limits with the float64 reference doing the work."""
    from hopattn.integrations import kernels

    kern = kernels.hopattn_kernel()
    if dry_run:
        ref = kernels.reference_kernel(gqa=kern.gqa)
        kern = replace(kern, call=ref.call, devices=(device.type,))
    return kern


def peer_kernel(name: str):
    return model_peers.fa3_kernel() if name == "fa3" else model_peers.fa4_kernel()


def launcher_for(torch, device, kernel, backend: str, training: bool = False):
    """For the attention replay: how ``backend`` runs one captured call (kernel None: SDPA);
    training: its forward and its backward (the gradients of q, k and v for a random dout)."""
    from hopattn.integrations import routing

    def make(shape, reason):
        gen = torch.Generator(device="cpu").manual_seed(0)
        dtype = getattr(torch, shape.dtype)

        def rand(length, heads, dim=shape.head_dim):
            x = torch.randn(shape.batch, length, heads, dim, generator=gen).to(device, dtype)
            return x.requires_grad_(training)

        dv = getattr(shape, "head_dim_v", 0) or shape.head_dim  # v's own head dim (MLA: q/k 192, v 128)
        q, k, v = (rand(shape.q_len, shape.q_heads), rand(shape.k_len, shape.kv_heads),
                   rand(shape.k_len, shape.kv_heads, dv))
        scale = 1.0 / math.sqrt(shape.head_dim)
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        window = sliding_window(reason)  # the glue sends it to SDPA, with the model's mask, whatever the kernel
        use_kernel = window is None and kernel is not None and (
            reason is None if backend == "hopattn" else
            kernel.unsupported(qh, kh, vh, shape.causal, grad=training) is None)
        dout = torch.randn((*q.shape[:-1], dv), generator=gen).to(device, dtype) if training else None
        if use_kernel:
            def forward():
                return routing.serve(kernel, q, k, v, causal=shape.causal, scale=scale, layout="bshd")[0]

            return _with_backward(torch, forward, (q, k, v), dout), None
        sdpa = torch.nn.functional.scaled_dot_product_attention
        gqa = shape.kv_heads != shape.q_heads

        mask = None if window is None else window_mask(torch, shape.q_len, shape.k_len, window, device)

        def sdpa_forward():  # BHSD out, BSHD as the kernel's (dout's layout)
            if mask is not None:  # as transformers' SDPA function gets it: the mask, no is_causal
                return sdpa(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=gqa).transpose(1, 2)
            return sdpa(qh, kh, vh, is_causal=shape.causal, scale=scale, enable_gqa=gqa).transpose(1, 2)

        fn = _with_backward(torch, sdpa_forward, (q, k, v), dout)
        context = None
        if backend == "cudnn":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            context = lambda: sdpa_kernel([SDPBackend.CUDNN_ATTENTION])  # noqa: E731
        return fn, context

    return make


def sliding_window(reason: str | None) -> int | None:
    """The window of a call the transformers glue sent to SDPA for its sliding window (its reason
    reads "sliding window W over N keys"), else None."""
    match = re.fullmatch(r"sliding window (\d+) over \d+ keys", reason or "")
    return int(match.group(1)) if match else None


def window_mask(torch, q_len: int, k_len: int, window: int, device):
    """transformers' sliding-window causal mask (True: attend), [1, 1, q_len, k_len], queries at the
    end of the keys: a query sees itself and the window - 1 keys before it."""
    q = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    kv = torch.arange(k_len, device=device)[None, :]
    return ((kv <= q) & (kv > q - window))[None, None]


def _with_backward(torch, forward, inputs, dout):
    """forward alone (dout None), or forward and the gradients of ``inputs`` for ``dout``."""
    if dout is None:
        return forward
    return lambda: torch.autograd.grad(forward(), inputs, dout)


def reference_gradients(torch, group, model, inputs) -> dict:
    """A training workload's gradient reference: one step through SDPA pinned to its flash backend
    (FlashAttention-2; math where flash cannot run the call), on the host. Not SDPA's default: on
    torch 2.11 that is cuDNN, whose backward can be 1.4 (relative) from float64 on strided inputs
    (research/accuracy/README.md), and a reference must not be a suspect. Every backend's gradients,
    SDPA's default included, are compared with this one."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with model_cases.backend(torch, group.library, model, "sdpa"), \
            sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]):
        model_cases.run_step(torch, group, model, inputs)
    grads = model_cases.host_grads(model)
    model.zero_grad(set_to_none=True)
    return grads


def run_case(torch, device, group, wl, model, inputs, backend, kernels, args, workdir: Path) -> dict:
    from hopattn.integrations import routing

    clock = model_timing.Clock(torch, device)
    strict = group.strict or (backend in ("fa3", "fa4") and group.peers_strict)
    report = None
    grad_errors, message = {}, None

    def step():
        return model_cases.run_step(torch, group, model, inputs)

    if group.training and wl.id not in _GRAD_REFERENCE:  # once a workload: same weights, same inputs
        _GRAD_REFERENCE[wl.id] = reference_gradients(torch, group, model, inputs)
    with model_cases.backend(torch, group.library, model, backend):
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        if backend in kernels:  # one step under a report: what this backend served, and why not the rest
            with routing.track(strict=strict, kernel=kernels[backend].name) as report:
                outputs = step()
            if report.served == 0:  # not strict, and all of it SDPA's: no measurement of this backend
                raise routing.RoutingError(f"{kernels[backend].name} served none of the step's attention calls "
                                           f"({report.summary()})")
        else:
            outputs = step()
        if group.training:
            grad_errors = model_cases.grad_errors(torch, model, _GRAD_REFERENCE[wl.id], device)
            first = model_cases.host_grads(model)
        ms = model_timing.time_step(clock, step, warmup=max(0, args.warmup - 1), reps=args.reps)
        memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
        if group.training:  # the last timed step's gradients against the first's
            grad_errors["rel_err_grads_rerun"] = model_cases.grad_errors(torch, model, first, device)["rel_err_grads"]
            del first
            model.zero_grad(set_to_none=True)
    outputs = {k: v.detach().float().cpu() for k, v in outputs.items()}
    ref_path = workdir / f"{wl.id}.sdpa.pt"
    if backend == "sdpa":
        torch.save(outputs, ref_path)
    errors = {}
    if ref_path.exists():
        errors = model_cases.compare(torch, outputs, torch.load(ref_path))
    else:
        message = "no SDPA run of this workload to compare the outputs with"
    errors.update(grad_errors)
    calls = json.loads((workdir / f"{wl.id}.calls.json").read_text())
    shapes = [(_shape(c), c["reason"], c["count"]) for c in calls]
    attention_ms = model_timing.replay_attention(
        clock, shapes, launcher_for(torch, device, kernels.get(backend), backend, training=group.training))
    return {"status": "ok", "message": message, "step_ms": model_timing.summarize(ms),
            "attention_ms": attention_ms, "memory_gib": memory, "errors": errors,
            "routing": report.to_dict() if report is not None else None}


def _shape(call: dict):
    from hopattn.integrations.routing import CallShape

    return CallShape(**{k: call[k] for k in CallShape.__dataclass_fields__})


def capture(torch, group, model, inputs, device) -> list[dict]:
    """The attention calls of one step, with the reason hopattn would not serve each (None: served);
    a training step's with their gradients (so a reason of training shows)."""
    from hopattn.integrations import routing

    with model_cases.backend(torch, group.library, model, "capture"):
        with routing.track() as report:
            model_cases.run_step(torch, group, model, inputs)
    model.zero_grad(set_to_none=True)
    return [{**shape.to_dict(), "reason": reason, "count": n} for (shape, reason), n in report.shapes.items()]


class PlantedOOM(RuntimeError):
    """Stands in for torch.cuda.OutOfMemoryError in the tests of the fit (PLANT_OOM)."""


def fit_training(torch, group, model, config: dict, device, dtype, inputs, progress, seed: int):
    """A training group's model with as many of its layers as one step fits in the GPU's memory (see
    the module's docstring); returns (model, layers, [(layers dropped, why)])."""
    full = layers = group.layers(config)
    dropped = []
    plant = int(os.environ.get(PLANT_OOM) or 0)
    oom = (torch.cuda.OutOfMemoryError, PlantedOOM)
    while True:
        why = None
        if device.type == "cuda":
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        try:
            if plant and layers > plant:
                raise PlantedOOM(f"planted: more than {plant} layers")
            with model_cases.backend(torch, group.library, model, "capture"):
                model_cases.run_step(torch, group, model, inputs)
            if device.type == "cuda":
                peak, total = torch.cuda.max_memory_allocated(device), torch.cuda.get_device_properties(device).total_memory
                if peak > FIT_SHARE * total:
                    why = (f"its step peaked at {peak / 2**30:.1f} GiB, over {FIT_SHARE:.0%} of the GPU's "
                           f"{total / 2**30:.1f} GiB")
        except oom as err:
            why = f"out of memory ({str(err).strip().splitlines()[0][:120] if str(err).strip() else 'CUDA'})"
        model.zero_grad(set_to_none=True)
        if why is None:
            return model, layers, dropped
        dropped.append((layers, why))
        fewer = layers - max(1, layers // 4)
        print(f"[bench.models] {group.id}: {layers} of {full} layers do not fit ({why}); building {fewer}", flush=True)
        if fewer < 1:
            raise RuntimeError(f"{group.id}: not even one layer fits a training step: {why}")
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        layers = fewer
        t0 = time.perf_counter()
        torch.manual_seed(seed)
        model = group.build(torch, {**config, group.layers_key: layers}, device, dtype)
        progress.emit("built", build_s=time.perf_counter() - t0, params=sum(p.numel() for p in model.parameters()),
                      layers=layers, full_layers=full, dropped=dropped)


def cuda_healthy(torch, device) -> bool:
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
        return True
    except Exception:
        return False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.model_runner", description=__doc__.splitlines()[0])
    p.add_argument("--group", required=True, choices=sorted(model_cases.GROUPS))
    p.add_argument("--cases", required=True, help="comma-separated workload:backend pairs, run in this order")
    p.add_argument("--progress", type=Path, required=True)
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    group = model_cases.GROUPS[args.group]
    if group.training:  # fewer cached blocks of odd sizes: more of the memory left for the step (both backends);
        # read by the CUDA allocator when it starts, at the first allocation, which is still to come here
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    import torch

    progress = Progress(args.progress)
    wanted = [tuple(c.split(":", 1)) for c in args.cases.split(",") if c]
    device = torch.device("cpu" if args.dry_run else "cuda")
    dtype = torch.bfloat16
    progress.emit("environment", environment=environment(torch, device))

    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    config = group.tiny_config if args.dry_run else group.config
    model = group.build(torch, config, device, dtype)
    params = sum(p.numel() for p in model.parameters())
    layers = group.layers(config)
    progress.emit("built", build_s=time.perf_counter() - t0, params=params, layers=layers, full_layers=layers,
                  dropped=[])

    hop = hopattn_kernel(torch, device, args.dry_run)
    kernels, missing = {"hopattn": hop}, {}
    model_cases.register(group.library, "hopattn", hop, strict=group.strict)
    model_cases.register(group.library, "capture", model_peers.as_capture(hop, device.type), strict=False)
    for name in ("fa3", "fa4"):
        if any(b == name for _, b in wanted):
            kern, why = peer_kernel(name)
            if kern is None:
                missing[name] = why
            else:
                kernels[name] = kern
                model_cases.register(group.library, name, kern, strict=group.strict or group.peers_strict)

    if group.training:  # on the first workload's inputs (the workloads of a group are alike or smaller)
        first = group.workloads[0].inputs(torch, device, dtype, args.dry_run, torch.Generator().manual_seed(args.seed + 1))
        model, _, _ = fit_training(torch, group, model, config, device, dtype, first, progress, args.seed)
        del first

    plant = os.environ.get(PLANT_HANG, "")
    for wl in group.workloads:
        backends = [b for w, b in wanted if w == wl.id]
        if not backends:
            continue
        inputs = wl.inputs(torch, device, dtype, args.dry_run, torch.Generator().manual_seed(args.seed + 1))
        calls = capture(torch, group, model, inputs, device)
        (args.workdir / f"{wl.id}.calls.json").write_text(json.dumps(calls))
        progress.emit("workload", workload=wl.id, calls=calls, tokens=wl.tokens(args.dry_run))
        for b in backends:
            progress.emit("case_start", workload=wl.id, backend=b)
            print(f"[bench.models] {wl.id} / {b}: running", flush=True)
            if plant == f"{wl.id}:{b}":
                time.sleep(10**6)
            if b in missing or (b == "cudnn" and device.type != "cuda"):
                result = {"status": "missing", "message": missing.get(b, "cuDNN attention needs a CUDA GPU")}
            else:
                try:
                    result = run_case(torch, device, group, wl, model, inputs, b, kernels, args, args.workdir)
                except Exception as err:
                    from hopattn.integrations.routing import RoutingError

                    status = "refused" if isinstance(err, RoutingError) else "failed"
                    tail = "".join(traceback.format_exception_only(type(err), err)).strip()
                    result = {"status": status, "message": tail[-1500:]}
                    traceback.print_exc()
            progress.emit("case_done", workload=wl.id, backend=b, result=result)
            print(f"[bench.models] {wl.id} / {b}: {result['status']}", flush=True)
            if not cuda_healthy(torch, device):
                print("[bench.models] the CUDA context is broken; a new process takes the remaining cases",
                      flush=True)
                return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
