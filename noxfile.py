"""Sessions: tests (default), docs, serve, facts, bench (GPU), bench_models (GPU), lint.

    nox                   # = nox -s tests
    nox -s serve          # generate and serve the site at http://127.0.0.1:8000
    nox -s bench -- --quick
"""

import os
import shutil

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

PYTHONPATH = {"PYTHONPATH": os.pathsep.join(["kernels", "."])}
# The CPU build of torch is enough for the tests (they skip GPU work without CUDA); pinning the
# version lets pip take the wheel a machine already has instead of downloading a CUDA build.
TORCH_FOR_TESTS = os.environ.get("HOPATTN_TEST_TORCH", "torch==2.13.0")


@nox.session(python=False if os.environ.get("HOPATTN_NOX_NO_VENV") else None)
def tests(session):
    """CPU tests everywhere; GPU tests run where CUDA is present and skip (with the reason) elsewhere."""
    session.install("-e", ".[test,docs]", TORCH_FOR_TESTS)
    if not shutil.which("nvcc"):
        # CI compiles every stage for sm_90a; pip's CUDA compiler stands in for a system toolkit.
        session.install("nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cuda-cccl")
    session.run("pytest", *(session.posargs or ["-q"]), env=PYTHONPATH)


@nox.session
def docs(session):
    """Build the static site into site/ with zero warnings allowed."""
    session.install("-e", ".[docs]")
    session.run("mkdocs", "build", "--strict", env=PYTHONPATH)


@nox.session
def serve(session):
    """Generate and serve the site; edits to stages, notes and results rebuild the affected pages."""
    session.install("-e", ".[docs]")
    session.run("mkdocs", "serve", "--livereload", *session.posargs, env=PYTHONPATH)


@nox.session
def facts(session):
    """Recompile the stages and refresh the committed compiler facts (site_gen/data/compiler)."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "site_gen.compiler", *session.posargs, env=PYTHONPATH)


@nox.session(python=False)
def bench(session):
    """Check and time every stage and the peers on this machine's GPU; writes bench/results/<gpu>.json.

    Runs in the current Python environment, which must already have torch with CUDA (and, for the
    FlashAttention-4 peer, flash_attn.cute): GPU machines often cannot install packages.
    """
    session.run("python", "-m", "bench", *session.posargs, env=PYTHONPATH)


@nox.session(python=False)
def bench_models(session):
    """Time real models (Llama-3.1-8B, Wan2.1 14B and 1.3B, LTX-2) with SDPA, cuDNN, hopattn and the
    FlashAttention peers on the same weights; writes bench/results/models-<gpu>.json.

    Runs in the current Python environment, which must have torch with CUDA, transformers and diffusers
    (README: "Use it in a model"). `nox -s bench_models -- --dry-run` runs tiny models on CPU.
    """
    session.run("python", "-m", "bench.models", *session.posargs, env=PYTHONPATH)


@nox.session
def lint(session):
    session.install("ruff")
    session.run("ruff", "check", "kernels/hopattn", "site_gen", "bench", "tests", "noxfile.py")
