"""Training through the integrations on the GPU with the real kernels (forward stage and backward
lineage), through the watchdog (gpu_watchdog.py; the cases are training_cases.py): one training
step of a small Llama through attn_implementation="hopattn" and of a small Wan2.1 transformer through
the "hopattn" diffusers backend, each against SDPA and a float32 copy of the same weights in the
same process (the tolerances are training_cases.py's), and deterministic gradients bit for bit.

    pytest -m gpu tests/test_training_gpu.py      # on the GPU machine; skipped, with the reason, elsewhere
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU on this machine (torch.cuda.is_available() is false): the kernels run on an "
                "H200, see README", allow_module_level=True)
pytest.importorskip("transformers")
pytest.importorskip("diffusers")

from conftest import GPU_SEED, gpu_log_path  # noqa: E402

CASE_S = 300.0  # a model built on the GPU and three training steps; the stages are compiled before


@pytest.fixture(scope="module")
def trainer():
    """A watchdog worker running training_cases.py, with the forward's and the backward's final
    stages compiled first (here: no case's limit includes nvcc)."""
    from gpu_watchdog import Worker
    from hopattn import api, backward, build

    build.build_stages([api._stage(None), backward._stage(None)])
    build.build_native()
    worker = Worker(gpu_log_path(), cases="training_cases")
    yield worker
    worker.close()


@pytest.mark.parametrize("layers, batch, length", [(2, 2, 1000), (1, 1, 4097)], ids=["2x1000", "1x4097"])
def test_llama_training_step_matches_sdpa_and_float32(trainer, layers, batch, length):
    seed = GPU_SEED
    trainer.call("llama_training_step", label=f"Llama training step, {layers} layers, B={batch} L={length}, "
                 f"hopattn vs SDPA vs float32, seed {seed}", timeout=CASE_S, seed=seed, layers=layers, batch=batch,
                 length=length)


def test_llama_training_fallback_gets_sdpas_gradients_without_cudnn(trainer):
    trainer.call("llama_fallback_gradients", label=f"Llama at head dim 64, training calls sent to SDPA, "
                 f"vs float32, seed {GPU_SEED}", timeout=CASE_S, seed=GPU_SEED)


def test_llama_deterministic_gradients_are_identical_run_to_run(trainer):
    trainer.call("llama_deterministic", label=f"Llama, register(deterministic=True), two steps, seed {GPU_SEED}",
                 timeout=CASE_S, seed=GPU_SEED)


def test_wan_training_step_matches_native_and_float32(trainer):
    trainer.call("wan_training_step", label=f"Wan2.1 training step, 2 layers, hopattn vs native vs float32, "
                 f"seed {GPU_SEED}", timeout=CASE_S, seed=GPU_SEED)
