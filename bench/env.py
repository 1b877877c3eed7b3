"""What the numbers were measured on: GPU, software versions, clocks and power limit (the git state and
the run header: hopattn.records.runs)."""

from __future__ import annotations

import os
import shutil
import subprocess

SMI_QUERY = "clocks.sm,clocks.mem,clocks.max.sm,power.limit"


def _number(text: str):
    """nvidia-smi prints '[N/A]', '[Not Supported]' or units-free numbers; unreadable values become None."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return None


def parse_smi(line: str) -> dict:
    """One csv,noheader,nounits line of SMI_QUERY -> clocks (MHz) and power limit (W); None when unknown."""
    parts = [p for p in line.strip().split(",")]
    if len(parts) != 4:
        return {"sm_mhz": None, "mem_mhz": None, "max_sm_mhz": None, "power_limit_w": None}
    sm, mem, max_sm, power = (_number(p) for p in parts)
    as_int = lambda v: None if v is None else int(round(v))  # noqa: E731
    return {"sm_mhz": as_int(sm), "mem_mhz": as_int(mem), "max_sm_mhz": as_int(max_sm),
            "power_limit_w": None if power is None or power <= 0 else power}


def _smi(args: list[str]) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _smi_line(out: str | None, index: int) -> str | None:
    lines = [ln for ln in (out or "").splitlines() if ln.strip()]
    if not lines:
        return None
    return lines[index] if index < len(lines) else lines[0]


def _device_index() -> int:
    # nvidia-smi numbers all GPUs; torch sees only CUDA_VISIBLE_DEVICES. Map the usual single-index case.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if visible.isdigit():
        return int(visible)
    try:
        import torch

        return torch.cuda.current_device()
    except Exception:
        return 0


def read_clocks() -> dict:
    """Clocks and power limit now (all None without nvidia-smi)."""
    line = _smi_line(_smi([f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"]), _device_index())
    return parse_smi(line or "")


def driver_version() -> str | None:
    line = _smi_line(_smi(["--query-gpu=driver_version", "--format=csv,noheader"]), _device_index())
    return line.strip() if line else None


def collect(torch, clocks_before: dict, clocks_after: dict) -> dict:
    """The results file's `environment` object for the current CUDA device."""
    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    major, minor = torch.cuda.get_device_capability(dev)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    clocks = lambda c: {"sm_mhz": c["sm_mhz"], "mem_mhz": c["mem_mhz"]}  # noqa: E731
    return {
        "gpu_name": props.name, "compute_capability": f"{major}.{minor}", "sm_count": props.multi_processor_count,
        "driver": driver_version(), "cuda": torch.version.cuda, "torch": torch.__version__,
        "cudnn": None if cudnn is None else str(cudnn),
        "clocks_before": clocks(clocks_before), "clocks_after": clocks(clocks_after),
        "max_sm_mhz": clocks_before["max_sm_mhz"] or clocks_after["max_sm_mhz"],
        "power_limit_w": clocks_before["power_limit_w"] or clocks_after["power_limit_w"],
    }
