"""Speed check of the site: a lineage of N stages, full generation + `mkdocs build`, then one edit.

    python -m site_gen.speed [--stages 19] [--keep DIR]

Builds a throwaway repository-shaped tree: the real stages copied round-robin and renumbered to
01..N (each copy's kernel.cu gets a small distinct edit so every diff is real), a synthetic results
file, the real hand-written docs and mkdocs.yml. Reports seconds for: a cold generation (no cache;
`python -m site_gen` renders without MkDocs), a cold `mkdocs build --strict`, and after editing one
stage's kernel.cu, the regeneration alone and the whole rebuild. Targets: < 60 s for the full
build, < 3 s for the regeneration.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hopattn import lineage
from hopattn.records import results

REPO = Path(__file__).resolve().parent.parent
SHAPES = {"4k": (8, 16, 4096), "8k": (4, 16, 8192), "16k": (2, 16, 16384)}


def make_lineage(dest: Path, count: int) -> list[str]:
    """Copy the real stages round-robin into dest as 01..count; return the new folder names."""
    src = REPO / "kernels" / "attention"
    real = sorted(p for p in src.iterdir() if p.is_dir() and re.match(r"^\d\d_", p.name))
    shutil.copytree(src / "common", dest / "common")
    names = []
    for i in range(count):
        origin = real[i % len(real)]
        name = f"{i + 1:02d}_{origin.name[3:]}" + (f"-r{i // len(real)}" if i >= len(real) else "")
        shutil.copytree(origin, dest / name)
        kernel = dest / name / "kernel.cu"
        kernel.write_text(kernel.read_text() + f"\n// site_gen.speed copy {i + 1} of {origin.name}\n")
        names.append(name)
    return names


def make_results(dest: Path, root: Path) -> None:
    stages = lineage.discover(root / "kernels" / "attention")
    run = "20261129T153000Z"
    env = {"gpu_name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132, "driver": "580.159.04",
           "cuda": "13.0", "torch": "2.11.0+cu130", "cudnn": "91900", "clocks_before": None, "clocks_after": None,
           "max_sm_mhz": 1980, "power_limit_w": 700.0}
    entries = []
    for shape, (b, h, n) in SHAPES.items():
        for causal in (False, True):
            flops = 4 * b * h * n * n * 128 / (2 if causal else 1)
            rows = [("peer", "fa4", "FlashAttention-4", 640.0, None), ("peer", "cudnn", "cuDNN", 600.0, None)]
            rows += [("stage", s.id, s.title, 30.0 * s.number, s.source_hash()) for s in stages]
            for kind, name, label, tflops, src_hash in rows:
                ms = round(flops / tflops / 1e9, 4)
                entries.append({
                    "kind": kind, "name": name, "label": label, "run_id": run, "shape": shape, "batch": b,
                    "heads": h, "len_q": n, "len_k": n, "head_dim": 128, "causal": causal, "status": "ok",
                    "reason": None, "source_hash": src_hash, "median_ms": ms, "min_ms": ms, "max_ms": ms,
                    "spread_pct": 0.0, "samples": 5, "tflops": tflops, "rel_err": 0.002,
                    "ratios": {"fa4": round(tflops / 640, 3), "cudnn": round(tflops / 600, 3)}})
    data = {"schema_version": 1, "gpu": "nvidia-h200", "results": entries,
            "runs": {run: {"date": "2026-11-29T15:30:00Z", "git_commit": None, "git_dirty": None,
                           "command": "python -m site_gen.speed", "environment": env}}}
    results.dump_results(data, dest / "nvidia-h200.json")


def copy_backward(dest: Path) -> None:
    """The backward lineage as it is (Act V: the hand-written pages link its pages), its stages that
    are complete."""
    src = lineage.BACKWARD_DIR
    if not src.is_dir():
        return
    for folder in sorted(src.iterdir()):
        if folder.name == "common" or (folder / "notes.md").is_file():
            shutil.copytree(folder, dest / folder.name)


def make_tree(root: Path, count: int) -> list[str]:
    names = make_lineage(root / "kernels" / "attention", count)
    copy_backward(root / "kernels" / lineage.BACKWARD_DIR.name)
    make_results(root / "bench" / "results", root)
    shutil.copytree(REPO / "docs", root / "docs")
    config = (REPO / "mkdocs.yml").read_text().replace("  - site_gen/hook.py", f"  - {REPO / 'site_gen' / 'hook.py'}")
    (root / "mkdocs.yml").write_text(config)
    return names


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", type=int, default=18)
    ap.add_argument("--keep", type=Path, help="build in this folder and keep it")
    args = ap.parse_args(argv)
    root = args.keep or Path(tempfile.mkdtemp(prefix="site-speed-"))
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    try:
        names = make_tree(root, args.stages)
        gen = [sys.executable, "-m", "site_gen", "--root", str(root)]
        build = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q"]

        def run(cmd):
            subprocess.run(cmd, cwd=root, env=env, check=True, stdout=subprocess.DEVNULL)

        shutil.rmtree(root / ".cache", ignore_errors=True)
        t_gen_cold = timed(lambda: run(gen))
        shutil.rmtree(root / ".cache", ignore_errors=True)
        t_build_cold = timed(lambda: run(build))  # the hook generates again, from cold, then builds
        kernel = root / "kernels" / "attention" / names[len(names) // 2] / "kernel.cu"
        kernel.write_text(kernel.read_text() + "// one more line\n")
        t_regen = timed(lambda: run(gen))
        kernel.write_text(kernel.read_text() + "// and another\n")
        t_rebuild = timed(lambda: run(build))
        notes = root / "kernels" / "attention" / names[0] / "notes.md"
        notes.write_text(notes.read_text() + "\nOne more sentence.\n")
        t_regen_notes = timed(lambda: run(gen))
        print(f"stages: {len(names)} (tree: {root})")
        print(f"cold generation (python -m site_gen, no cache):      {t_gen_cold:6.2f} s")
        print(f"cold full build (mkdocs build --strict, hook + site): {t_build_cold:6.2f} s   target < 60 s")
        print(f"regeneration after one kernel.cu edit:               {t_regen:6.2f} s   target < 3 s")
        print(f"regeneration after one notes.md edit:                {t_regen_notes:6.2f} s")
        print(f"full rebuild after one kernel.cu edit:               {t_rebuild:6.2f} s")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
