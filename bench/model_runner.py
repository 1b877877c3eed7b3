"""One model group in its own process: build it once, then run the requested (workload, backend)
cases on the same weights, reporting each as a JSON line to a progress file the parent watches.

    python -m bench.model_runner --group wan2.1-t2v-14b --cases wan2.1-t2v-14b-480p:sdpa,... \\
        --progress run/progress.jsonl --workdir run/ [--dry-run] [--reps 3] [--warmup 1]

Started by bench.models, which kills it when a case runs past its deadline (a hang) and starts a new
one for the cases left. Events: environment, built, workload, case_start, case_done.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

from bench import model_cases, model_peers, model_timing

PLANT_HANG = "HOPATTN_MODELS_PLANT_HANG"  # "<workload>:<backend>": that case sleeps forever (watchdog tests)


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


def launcher_for(torch, device, kernel, backend: str):
    """For the attention replay: how ``backend`` runs one captured call (kernel None: SDPA)."""
    from hopattn.integrations import routing

    def make(shape, reason):
        gen = torch.Generator(device="cpu").manual_seed(0)
        dtype = getattr(torch, shape.dtype)

        def rand(length, heads):
            return torch.randn(shape.batch, length, heads, shape.head_dim, generator=gen).to(device, dtype)

        q, k, v = rand(shape.q_len, shape.q_heads), rand(shape.k_len, shape.kv_heads), rand(shape.k_len,
                                                                                             shape.kv_heads)
        scale = 1.0 / math.sqrt(shape.head_dim)
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        use_kernel = kernel is not None and (reason is None if backend == "hopattn" else
                                             kernel.unsupported(qh, kh, vh, shape.causal) is None)
        if use_kernel:
            return (lambda: routing.serve(kernel, q, k, v, causal=shape.causal, scale=scale, layout="bshd")), None
        sdpa = torch.nn.functional.scaled_dot_product_attention
        gqa = shape.kv_heads != shape.q_heads
        fn = lambda: sdpa(qh, kh, vh, is_causal=shape.causal, scale=scale, enable_gqa=gqa)  # noqa: E731
        context = None
        if backend == "cudnn":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            context = lambda: sdpa_kernel([SDPBackend.CUDNN_ATTENTION])  # noqa: E731
        return fn, context

    return make


def run_case(torch, device, group, wl, model, inputs, backend, kernels, args, workdir: Path) -> dict:
    from hopattn.integrations import routing

    clock = model_timing.Clock(torch, device)
    strict = group.strict or backend in ("fa3", "fa4")
    report = None

    def step():
        with torch.no_grad():
            return group.forward(torch, model, inputs)

    with model_cases.backend(torch, group.library, model, backend):
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        if backend in kernels:  # one forward under a report: what this backend served, and why not the rest
            with routing.track(strict=strict, kernel=kernels[backend].name) as report:
                outputs = step()
        else:
            outputs = step()
        ms = model_timing.time_step(clock, step, warmup=max(0, args.warmup - 1), reps=args.reps)
        memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    outputs = {k: v.detach().float().cpu() for k, v in outputs.items()}
    ref_path = workdir / f"{wl.id}.sdpa.pt"
    if backend == "sdpa":
        torch.save(outputs, ref_path)
    errors, message = {}, None
    if ref_path.exists():
        errors = model_cases.compare(torch, outputs, torch.load(ref_path))
    else:
        message = "no SDPA run of this workload to compare the outputs with"
    calls = json.loads((workdir / f"{wl.id}.calls.json").read_text())
    shapes = [(_shape(c), c["reason"], c["count"]) for c in calls]
    attention_ms = model_timing.replay_attention(clock, shapes,
                                                 launcher_for(torch, device, kernels.get(backend), backend))
    return {"status": "ok", "message": message, "step_ms": model_timing.summarize(ms),
            "attention_ms": attention_ms, "memory_gib": memory, "errors": errors,
            "routing": report.to_dict() if report is not None else None}


def _shape(call: dict):
    from hopattn.integrations.routing import CallShape

    return CallShape(**{k: call[k] for k in CallShape.__dataclass_fields__})


def capture(torch, group, model, inputs, device) -> list[dict]:
    """The attention calls of one step, with the reason hopattn would not serve each (None: served)."""
    from hopattn.integrations import routing

    with model_cases.backend(torch, group.library, model, "capture"), torch.no_grad():
        with routing.track() as report:
            group.forward(torch, model, inputs)
    return [{**shape.to_dict(), "reason": reason, "count": n} for (shape, reason), n in report.shapes.items()]


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

    import torch

    progress = Progress(args.progress)
    group = model_cases.GROUPS[args.group]
    wanted = [tuple(c.split(":", 1)) for c in args.cases.split(",") if c]
    device = torch.device("cpu" if args.dry_run else "cuda")
    dtype = torch.bfloat16
    progress.emit("environment", environment=environment(torch, device))

    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    model = group.build(torch, group.tiny_config if args.dry_run else group.config, device, dtype)
    params = sum(p.numel() for p in model.parameters())
    progress.emit("built", build_s=time.perf_counter() - t0, params=params)

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
                model_cases.register(group.library, name, kern, strict=True)

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
