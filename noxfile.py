"""Sessions: tests (default), quick, docs, serve, facts, bench (GPU), bench_models (GPU), lint.

    nox                                   # = nox -s tests: the whole suite
    nox -s quick                          # the quick tier: pytest -n auto -m "not slow and not browser"
    nox -s serve                          # build and serve the site at http://127.0.0.1:8000 (Ctrl-C stops it)
    nox -s serve -- -a 127.0.0.1:8001     # another address or port (arguments after -- go to mkdocs serve)
    nox -s tests -- -k site -x            # arguments after -- go to pytest
    nox -s lint                           # ruff over the whole repository
    nox -s bench -- --quick

The test tiers (markers defined in pyproject.toml): `tests` runs everything this machine can run
(GPU tests skip without CUDA, browser tests without chromium and chromedriver, both saying why);
`quick` leaves out the tests marked `slow` (compiling every stage, building the whole site, the
long emulations) and `browser`, and spreads the rest over every core (pytest-xdist): a minute and
a half or less on a 2-core machine once the environment exists, for the edit-and-check loop. It
runs in the tests session's environment (.nox/tests). Times are in README, "The two commands".
"""

import os
import shlex
import shutil

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

# MkDocs and Material print a notice about their successors on every run; nothing to act on here.
QUIET = {"NO_MKDOCS_2_WARNING": "1"}
# The CPU build of torch is enough for the tests (they skip GPU work without CUDA); pinning the
# version lets pip take a wheel the machine already has. Another requirement (or pip options) can
# be given: HOPATTN_TEST_TORCH="torch==2.13.0 --extra-index-url ...".
TORCH_FOR_TESTS = shlex.split(os.environ.get("HOPATTN_TEST_TORCH", "torch==2.13.0"))


def install(session, what: str, *args):
    """pip install with its progress shown: a first run downloads a lot (see README)."""
    session.log(f"installing {what}")
    session.install(*args, silent=False)


def _test_environment(session):
    """Built in .nox/tests on the first run, reused after (nox.options.reuse_existing_virtualenvs)."""
    install(session, "the project with its test and docs tools, and torch", "-e", ".[test,docs]", *TORCH_FOR_TESTS)
    if not shutil.which("nvcc"):
        # CI compiles every stage for sm_90a; pip's CUDA compiler stands in for a system toolkit.
        install(session, "pip's CUDA compiler (no nvcc on PATH)", "nvidia-cuda-nvcc", "nvidia-cuda-runtime",
                "nvidia-cuda-cccl")


def _browser_note(session):
    """Say before the run, not only in the skip summary after it, that the browser tests will skip."""
    if "not browser" in " ".join(session.posargs):
        return
    missing = [n for n, found in (("chromium", shutil.which("chromium") or shutil.which("chromium-browser")),
                                  ("chromedriver", shutil.which("chromedriver"))) if not found]
    if missing:
        session.warn(f"the browser tests will skip: {' and '.join(missing)} not on PATH "
                     "(Debian/Ubuntu: sudo apt install chromium chromium-driver)")


NO_VENV = os.environ.get("HOPATTN_NOX_NO_VENV")


@nox.session(python=False if NO_VENV else None)
def tests(session):
    """CPU tests everywhere; GPU tests run where CUDA is present and skip (with the reason) elsewhere."""
    _test_environment(session)
    _browser_note(session)
    session.run("pytest", *(session.posargs or ["-q", "-rs"]), env=QUIET)


@nox.session(python=False)
def quick(session):
    """The quick tier: the tests session (its environment) on every test not marked slow or browser, on
    every core (pytest-xdist)."""
    session.notify("tests", ["-n", "auto", "-m", "not slow and not browser", *(session.posargs or ["-q", "-rs"])])


@nox.session
def docs(session):
    """Build the static site into site/ with zero warnings allowed."""
    install(session, "the project and MkDocs", "-e", ".[docs]")
    session.run("mkdocs", "build", "--strict", env=QUIET)


@nox.session
def serve(session):
    """Build and serve the site; edits to stages, notes and results rebuild it."""
    install(session, "the project and MkDocs", "-e", ".[docs]")
    try:
        session.run("mkdocs", "serve", "--livereload", *session.posargs, env=QUIET)
    except KeyboardInterrupt:  # Ctrl-C is how a server is stopped: not a failure
        session.log("stopped")


@nox.session
def facts(session):
    """Recompile the stages and refresh the committed compiler facts (kernels/compiler_facts/)."""
    install(session, "the project and the CUDA binary tools", "-e", ".[test]")
    session.run("python", "-m", "hopattn.compiler", *session.posargs)


@nox.session(python=False)
def bench(session):
    """Check and time every stage and the peers on this machine's GPU, the forward and then the
    backward (each backward stage, its deterministic mode as its own entry, against the backwards of
    FlashAttention-3/-4, cuDNN and FlashAttention-2, timed alone); writes bench/results/<gpu>.json.
    `nox -s bench -- --what backward` runs the backward only, `-- --what forward` the forward only.

    Runs in the current Python environment, which must already have torch with CUDA (and, for the
    FlashAttention-4 peer, flash_attn.cute) and this project installed (`pip install -e .`): GPU
    machines often cannot install packages.
    """
    session.run("python", "-m", "bench", *session.posargs)


@nox.session(python=False)
def bench_models(session):
    """Time real models (Llama-3.1-8B, Wan2.1 14B and 1.3B, LTX-2) with SDPA, cuDNN, hopattn and the
    FlashAttention peers on the same weights; writes bench/results/models-<gpu>.json.

    Runs in the current Python environment, which must have torch with CUDA, transformers and diffusers
    and this project installed (README: "Use it in a model"). `nox -s bench_models -- --dry-run` runs tiny models on CPU.
    """
    session.run("python", "-m", "bench.models", *session.posargs)


@nox.session
def lint(session):
    """ruff over the whole repository (pyproject.toml [tool.ruff]), research/ included."""
    install(session, "ruff", "ruff")
    session.run("ruff", "check", ".")
