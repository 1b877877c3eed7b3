"""Which arms run where: stage skipping by architecture, causal support and tiles; peers reported missing."""

from __future__ import annotations

import dataclasses

import pytest
from hopattn import lineage

from bench import peers, report, timing
from bench.shapes import SHAPES, Shape
from bench.stages import StageArm, make_stage_arms


@pytest.fixture(scope="module")
def stage01():
    return lineage.discover()[0]


def test_stage_arm_identity(stage01):
    arm = StageArm(stage01, (9, 0), "NVIDIA H200")
    assert (arm.kind, arm.name, arm.key, arm.short) == ("stage", "01", "stage:01", "stage 01")
    assert arm.label == stage01.title and arm.source_hash == stage01.source_hash()


def test_stage_skips(stage01):
    h200 = StageArm(stage01, (9, 0), "NVIDIA H200")
    assert h200.applies(SHAPES["8k"], False) is None
    if not stage01.causal:
        assert h200.applies(SHAPES["8k"], True) == (
            "skipped", "stage has no causal support (stage.toml supports.causal = false)")
    hopper_only = dataclasses.replace(stage01, arch="sm_90a")
    status, reason = StageArm(hopper_only, (10, 0), "NVIDIA B200").applies(SHAPES["8k"], False)
    assert status == "skipped" and "sm_90a" in reason and "NVIDIA B200 is 10.0" in reason
    assert StageArm(hopper_only, (9, 0), "NVIDIA H100").applies(SHAPES["8k"], False) is None
    assert StageArm(stage01, (7, 5), "Tesla T4").applies(SHAPES["8k"], False)[0] == "skipped"
    odd = Shape("odd", 1, 1, 100, 100, 128)
    if not stage01.tails:
        assert "multiples of its tile" in h200.applies(odd, False)[1]
    assert "head dim" in h200.applies(Shape("d64", 1, 1, 128, 128, 64), False)[1]


def test_build_failure_is_reported_per_stage(stage01):
    arms = make_stage_arms([stage01], (9, 0), "NVIDIA H200", {1: "build failed: nvcc error"})
    assert arms[0].applies(SHAPES["4k"], False) == ("failed", "build failed: nvcc error")
    # a stage this GPU cannot run is skipped for that reason, not for the build
    hopper_only = dataclasses.replace(stage01, arch="sm_90a")
    arm = make_stage_arms([hopper_only], (8, 0), "A100", {1: "build failed"})[0]
    assert arm.applies(SHAPES["4k"], False)[0] == "skipped"


def test_peers_are_built_in_canonical_order_and_missing_flash_attention_says_why():
    torch = pytest.importorskip("torch")
    arms = peers.make_peers(torch, list(peers.ORDER))
    assert [a.name for a in arms] == list(peers.ORDER)
    assert all(a.kind == "peer" and a.label == peers.LABELS[a.name] for a in arms)
    for arm, module in zip(arms[:2], ("flash_attn_interface", "flash_attn.cute")):
        try:
            __import__(module)
        except Exception:
            status, reason = arm.applies(SHAPES["4k"], False)
            assert status == "missing" and f"{module} is not importable" in reason
            assert "peers-on-gpu-machine" in reason
    for arm in arms[2:]:
        assert arm.applies(SHAPES["4k"], True) is None  # SDPA backends and FlexAttention exist in this torch


def test_the_users_shapes_run_on_the_full_contract_stages_and_the_reference_peers():
    torch = pytest.importorskip("torch")
    from bench.shapes import USER_SHAPES

    by = {a.name: a for a in peers.make_peers(torch, list(peers.ORDER))}
    for shape in USER_SHAPES.values():
        assert by["cudnn"].applies(shape, True) is None
        for name in ("fa2", "flex", "efficient"):
            assert by[name].applies(shape, False)[0] == "skipped"
    stages = {s.number: s for s in lineage.discover()}
    early, full = StageArm(stages[16], (9, 0), "NVIDIA H200"), StageArm(stages[19], (9, 0), "NVIDIA H200")
    assert early.applies(USER_SHAPES["32k"], False)[0] == "skipped"
    assert full.applies(USER_SHAPES["32k"], True) is None and full.applies(USER_SHAPES["8k-bshd"], False) is None
    assert "grouped-query" in full.applies(USER_SHAPES["8k-gqa"], False)[1]
    assert StageArm(stages[20], (9, 0), "NVIDIA H200").applies(USER_SHAPES["8k-gqa"], True) is None


def test_grouped_query_and_bshd_shapes_reach_the_peers_as_models_pass_them():
    torch = pytest.importorskip("torch")
    cudnn = peers.make_peers(torch, ["cudnn"])[0]
    q, kv = torch.randn(1, 8, 16, 8), torch.randn(1, 2, 16, 8)
    cudnn.layout = "bshd"
    launch = cudnn.prepare(q, kv, kv, False, 0.5)
    with launch.context():
        pass
    out = torch.nn.functional.scaled_dot_product_attention(q, kv, kv, scale=0.5, enable_gqa=True)
    assert torch.allclose(launch.fn(), out, atol=1e-6)


def test_sdpa_peers_get_the_bottom_right_causal_mask_when_lengths_differ():
    """SDPA's is_causal is top-left; with Lq < Lk the stages' (bottom-right) function needs the bias."""
    torch = pytest.importorskip("torch")
    efficient = peers.make_peers(torch, ["efficient"])[0]
    q, kv = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 7, 8)
    got = efficient.prepare(q, kv, kv, True, 0.5).fn()
    mask = torch.arange(7)[None, :] <= torch.arange(3)[:, None] + 4  # query i sees keys j <= i + Lk - Lq
    want = torch.nn.functional.scaled_dot_product_attention(q, kv, kv, attn_mask=mask, scale=0.5)
    assert torch.allclose(got, want, atol=1e-6)


def test_sdpa_peer_runs_in_bhsd_under_its_backend_context():
    torch = pytest.importorskip("torch")
    fa2, efficient = peers.make_peers(torch, ["fa2", "efficient"])
    q = torch.randn(1, 2, 16, 8)
    launch = fa2.prepare(q, q, q, False, 0.5)
    with launch.context():  # the CPU has a flash backend
        out = launch.fn()
    assert out.shape == q.shape
    launch = efficient.prepare(q, q, q, False, 0.5)
    with pytest.raises(RuntimeError), launch.context():  # and no memory-efficient one: the arm must not fall back
        launch.fn()


def test_launches_per_round():
    assert timing.launches_for(3.0, 10) == 10
    assert timing.launches_for(100.0, 10) == 4
    assert timing.launches_for(1000.0, 10) == 3
    assert timing.launches_for(0.0, 10) == 10


def test_summary_table():
    entries = [
        {"kind": "peer", "name": "fa4", "shape": "8k", "causal": False, "status": "ok", "tflops": 660.0,
         "median_ms": 3.3346, "spread_pct": 1.0, "ratios": {"fa4": 1.0, "cudnn": 1.087}, "rel_err": 0.00222,
         "reason": None},
        {"kind": "stage", "name": "07", "shape": "8k", "causal": True, "status": "skipped", "tflops": None,
         "median_ms": None, "spread_pct": None, "ratios": None, "rel_err": None, "reason": "stage uses sm_90a"},
        {"kind": "stage", "name": "01", "shape": "8k", "causal": False, "status": "ok", "tflops": 40.2,
         "median_ms": 54.7, "spread_pct": 0.5, "ratios": {"fa4": 0.061}, "rel_err": 0.0021, "reason": None},
    ]
    lines = report.summary_table(entries).splitlines()
    assert lines[0].split()[:3] == ["arm", "shape", "status"] and set(lines[1]) == {"-"}
    assert lines[2].startswith("stage 01") and "0.061" in lines[2] and lines[2].split()[-1] == "2.10e-03"
    assert lines[3].startswith("fa4") and "660.0" in lines[3] and "1.087" in lines[3]
    assert lines[4].startswith("stage 07") and "8k causal" in lines[4] and lines[4].endswith("stage uses sm_90a")


def test_stage_arms_run_the_head_dims_their_stage_serves(stage01):
    """supports.head_dims decides: a stage of 128 only skips the head-dim points naming what it serves."""
    from bench.shapes import HEAD_DIM_SHAPES

    h200 = StageArm(stage01, (9, 0), "NVIDIA H200")
    assert h200.applies(HEAD_DIM_SHAPES["8k-d128"], False) is None
    assert h200.applies(HEAD_DIM_SHAPES["8k-d64"], False) == (
        "skipped", "stage serves head dim 128 (stage.toml supports.head_dims), shape has 64")
    assert "shape has 192 (v 128)" in h200.applies(HEAD_DIM_SHAPES["8k-d192v128"], False)[1]
    many = StageArm(dataclasses.replace(stage01, head_dims=((64, 64), (128, 128), (192, 128))), (9, 0), "NVIDIA H200")
    for name in ("8k-d64", "8k-d128", "8k-d192v128"):
        assert many.applies(HEAD_DIM_SHAPES[name], False) is None, name
    assert many.applies(HEAD_DIM_SHAPES["8k-d256"], False)[0] == "skipped"
