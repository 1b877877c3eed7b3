"""The cross-entropy lineage (kernels/cross_entropy) without a GPU: discovery and the typed stage.toml,
[constants] against kernel.cu, the ABI every stage exports, the notes' sections; the ops' contract
(every bad input raises before a launch, naming the argument, through cross_entropy_ops and
torch.ops.hopattn.* alike, on fake CUDA tensors); the fake implementations' shapes; the autograd
formula's wiring; the float64 reference against torch.nn.functional.cross_entropy in float64 (ignore
index, label smoothing, every reduction, the gradient); the GPU cases' spread; the bench's sizes; and
(needs nvcc) every stage compiled for sm_90a without spills, every dispatched template instance in
the log, and the binding built."""

import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import cross_entropy_cases
import pytest
from hopattn import build, cross_entropy_lineage, cuda_tools, lineage, rowwise_build

STAGES = cross_entropy_lineage.discover()
SCRIPT = lineage.RMSNORM_DIR.parent.parent / "research" / "cross_entropy" / "gpu_run.sh"
needs_nvcc = pytest.mark.skipif(cuda_tools.find("nvcc") is None,
                                reason="nvcc not found (install the CUDA toolkit or pip's nvidia-cuda-nvcc)")


def test_the_lineage_is_discovered_in_order():
    assert [s.number for s in STAGES] == list(range(1, len(STAGES) + 1)) and len(STAGES) >= 3
    assert all(s.lineage == "cross_entropy" for s in STAGES)
    names = {build.library_path(s).name for s in STAGES}
    assert len(names) == len(STAGES) and all(n.startswith("cross_entropy-stage") for n in names)
    assert all(s.dir.parent == cross_entropy_lineage.CROSS_ENTROPY_DIR for s in STAGES)
    assert not (cross_entropy_lineage.CROSS_ENTROPY_DIR / ".draft-copy").exists()


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_spec_constants_abi_and_notes(stage):
    assert cross_entropy_lineage.constant_mismatches(stage) == []
    source = stage.kernel_path.read_text()
    assert re.search(rf"__global__ void .*?\b{stage.kernel}\(", source, re.S), stage.kernel
    for name in ("hopattn_cross_entropy_launch", "hopattn_cross_entropy_describe"):
        assert f"HOPATTN_EXPORT int {name}(" in source
    assert source.count("cross_entropy_check_params(p, err, errlen)") == 2
    notes = stage.notes_path.read_text()
    assert notes.index("## Prediction") < notes.index("## Measured")
    # measured, or the newest stage before its GPU run (tests/test_part_ii_notes.py checks the records)
    assert "Not measured yet." not in notes or stage == STAGES[-1]
    assert "ptxas -v" in notes and "GB/s" in notes


def test_the_final_stage_reads_once_in_a_cluster():
    assert STAGES[-1].spec.row.reads == 1 and "cluster" in STAGES[-1].spec.row.owners


def test_spec_errors_name_the_file_and_the_field(tmp_path):
    root = tmp_path / "cross_entropy"
    shutil.copytree(STAGES[0].dir, root / "01_three-passes")
    spec = root / "01_three-passes" / "stage.toml"
    spec.write_text(spec.read_text() + "\n[supports2]\n")
    with pytest.raises(lineage.SpecError, match="supports2: unknown key"):
        cross_entropy_lineage.load_stage(spec.parent)
    spec.write_text(spec.read_text().replace("\n[supports2]\n", "").replace("strided = true",
                                                                            "strided = true\nbackward = true"))
    with pytest.raises(lineage.SpecError, match="'supports.backward' must be false"):
        cross_entropy_lineage.load_stage(spec.parent)
    spec.write_text(spec.read_text().replace("backward = true", ""))
    shutil.copytree(STAGES[0].dir, root / "03_gap")
    with pytest.raises(lineage.SpecError, match="expected 02 here"):
        cross_entropy_lineage.discover(root)
    with pytest.raises(lineage.SpecError, match="no such folder"):
        cross_entropy_lineage.discover(tmp_path / "nowhere")


def test_cases_span_the_contract():
    cases = cross_entropy_cases.cases(1234)
    assert {c["dtype"] for c in cases} == set(cross_entropy_cases.DTYPES)
    assert {c["view"] for c in cases} == set(cross_entropy_cases.VIEWS)
    assert {c["grad"] for c in cases} == set(cross_entropy_cases.GRADS)
    assert {1, 8, 9, 32768, 131072, 262145, 524289} <= {c["cols"] for c in cases}
    assert any(c["label_smoothing"] for c in cases) and any(c["outliers"] for c in cases)
    assert all(c["rows"] * c["cols"] <= 2 * cross_entropy_cases.MAX_ELEMENTS for c in cases)
    assert cross_entropy_cases.cases(3) == cross_entropy_cases.cases(3) != cross_entropy_cases.cases(4)


def test_gpu_run_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    assert "kernels/cross_entropy" in text and "HOPATTN_GPU_LOG" in text and "tar" in text
    assert ".draft-copy" not in text and "cp -r" not in text  # the lineage has landed: nothing is copied


torch = pytest.importorskip("torch", reason="the ops need torch")
import torch.nn.functional as F  # noqa: E402
from hopattn import cross_entropy_ops as ce  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

BF16 = torch.bfloat16


def _f(*shape, dtype=BF16, stride=None):
    if stride is not None:
        return torch.empty_strided(shape, stride, dtype=dtype, device="cuda")
    return torch.empty(*shape, dtype=dtype, device="cuda")


def _t(*shape, dtype=torch.int64):
    return torch.empty(*shape, dtype=dtype, device="cuda")


BAD = [
    (lambda: (_f(4, 8, dtype=torch.float64), _t(4)), {}, ValueError, "logits: expected torch.bfloat16, torch.float16"),
    (lambda: (_f(4, 0), _t(4)), {}, ValueError, r"logits: the last axis \(the classes\) is empty"),
    (lambda: (_f(1, 2**31 - 2**20 + 1), _t(1)), {}, ValueError, r"logits: rows of at most 2146435072 classes"),
    (lambda: (_f(4, 8, stride=(1, 4)), _t(4)), {}, ValueError, "logits: the last axis must be contiguous"),
    (lambda: (_f(6, 4, 16, stride=(16, 96, 1)), _t(6, 4)), {}, ValueError, "logits: .* do not fold into rows"),
    (lambda: (_f(4, 64, stride=(32, 1)), _t(4)), {}, ValueError, "logits: rows overlap"),
    (lambda: (_f(4, 8), _t(4, dtype=torch.int32)), {}, ValueError, r"targets: expected torch.int64 .* targets.long\(\)"),
    (lambda: (_f(4, 8), _t(4, dtype=torch.float32)), {}, ValueError, "targets: expected torch.int64 .* probabilities"),
    (lambda: (_f(4, 8), _t(5)), {}, ValueError, r"targets: expected shape \(4,\)"),
    (lambda: (_f(4, 8), _t(4, 1)), {}, ValueError, r"targets: expected shape \(4,\)"),
    (lambda: (_f(4, 8), torch.empty_strided((4,), (2,), dtype=torch.int64, device="cuda")), {}, ValueError, "targets: expected a contiguous tensor"),
    (lambda: (_f(4, 8), _t(4)), {"ignore_index": 1.5}, TypeError, "ignore_index: expected an int"),
    (lambda: (_f(4, 8), _t(4)), {"ignore_index": True}, TypeError, "ignore_index: expected an int"),
    (lambda: (_f(4, 8), _t(4)), {"label_smoothing": 1.5}, ValueError, r"label_smoothing: expected a number in \[0, 1\]"),
    (lambda: (_f(4, 8), _t(4)), {"label_smoothing": float("nan")}, ValueError, "label_smoothing"),
    (lambda: (_f(4, 8), _t(4)), {"label_smoothing": "0.1"}, TypeError, "label_smoothing: expected a float"),
    (lambda: (_f(4, 8), _t(4)), {"reduction": "avg"}, ValueError, "reduction: expected one of 'none', 'mean', 'sum'"),
    (lambda: (_f(4, 8), _t(4)), {"stage": 99}, ValueError, r"stage: expected None \(the final stage"),
    (lambda: (_f(4, 8), _t(4)), {"stage": True}, ValueError, "stage: expected None"),
]


@pytest.mark.parametrize("make,kwargs,error,message", BAD, ids=[m for _, _, _, m in BAD])
def test_bad_inputs_name_the_argument(make, kwargs, error, message):
    with FakeTensorMode():
        logits, targets = make()
        with pytest.raises(error, match=message):
            ce.cross_entropy(logits, targets, **kwargs)
        if error is ValueError and "stage" not in kwargs:
            args = {"ignore_index": -100, "label_smoothing": 0.0, "reduction": "mean", **kwargs}
            with pytest.raises(error, match=message):
                torch.ops.hopattn.cross_entropy(logits, targets, args["ignore_index"], args["label_smoothing"],
                                                args["reduction"], None, False)


def test_devices_and_types_are_checked():
    with pytest.raises(ValueError, match=r"logits: expected a CUDA tensor, got one on cpu: pass logits.cuda\(\)"):
        ce.cross_entropy(torch.ones(2, 8), torch.zeros(2, dtype=torch.long))
    with pytest.raises(TypeError, match="logits: expected a torch.Tensor, got list"):
        ce.cross_entropy([1.0], torch.zeros(1, dtype=torch.long))
    with FakeTensorMode():
        with pytest.raises(TypeError, match="targets: expected a torch.Tensor, got list"):
            ce.cross_entropy(_f(2, 8), [0, 1])
        with pytest.raises(ValueError, match="dloss: expected torch.float32"):
            ce.cross_entropy_backward(_f(2, 8), _t(2), _f(2))
        with pytest.raises(ValueError, match=r"dloss: expected shape \(2,\)"):
            ce.cross_entropy_backward(_f(2, 8), _t(2), _f(3, dtype=torch.float32))
        with pytest.raises(ValueError, match="dlogits: expected a torch.bfloat16 tensor"):
            ce._cross_entropy_into(_f(2, 8), _t(2), _f(2, dtype=torch.float32), None, _f(2, 9))
        with pytest.raises(ValueError, match="loss: expected a contiguous torch.float32"):
            ce._cross_entropy_into(_f(2, 8), _t(2), _f(2), None)


def test_fake_outputs_have_the_op_shapes():
    with FakeTensorMode():
        for dtype in (BF16, torch.float16, torch.float32):
            x, t = _f(2, 3, 4096, dtype=dtype), _t(2, 3)
            loss, lse, dl = torch.ops.hopattn.cross_entropy(x, t, -100, 0.0, "none", None, True)
            assert loss.shape == (2, 3) and loss.dtype == torch.float32 and lse.shape == (2, 3)
            assert dl.shape == x.shape and dl.dtype == dtype
            loss, _, dl = torch.ops.hopattn.cross_entropy(x, t, -100, 0.1, "mean", None, False)
            assert loss.shape == () and dl.numel() == 0
            dx = torch.ops.hopattn.cross_entropy_backward(x, t, _f(2, 3, dtype=torch.float32), -100, 0.0, None)
            assert dx.shape == x.shape and dx.dtype == dtype
        call = ce.check(_f(8, 4096, stride=(4100, 1)), _t(8), -100, 0.0, "mean", None)
        assert (call.rows, call.cols, call.logits_stride) == (8, 4096, 4100)
        assert ce.check(_f(0, 7), _t(0)).rows == 0


def test_the_autograd_formula_scales_the_saved_gradient():
    op = ce._cross_entropy_op
    if hasattr(op, "_backward_fn"):
        assert op._backward_fn is ce._backward and op._setup_context_fn is ce._setup
    x = torch.randn(4, 8, dtype=BF16)
    ctx = SimpleNamespace(mark_non_differentiable=lambda *t: None)
    ctx.save_for_backward = lambda *t: setattr(ctx, "saved_tensors", t)
    inputs = (x, None, -100, 0.0, "none", None, True)
    ce._setup(ctx, inputs, (None, None, x))
    g = torch.arange(4, dtype=torch.float32)
    grads = ce._backward(ctx, g, None, None)
    assert len(grads) == 7 and all(v is None for v in grads[1:])
    assert grads[0].dtype == BF16 and torch.equal(grads[0], (x.float() * g[:, None]).to(BF16))
    ce._setup(ctx, (x, None, -100, 0.0, "mean", None, False), (None, None, x))
    with pytest.raises(RuntimeError, match="with_grad=False"):
        ce._backward(ctx, torch.tensor(1.0), None, None)


@pytest.mark.parametrize("eps", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("cols", [1, 2, 37, 1000])
def test_the_reference_matches_torch_in_float64(eps, cols):
    gen = torch.Generator().manual_seed(cols)
    x = torch.randn(33, cols, generator=gen, dtype=torch.float64) * 5
    t = torch.randint(0, cols, (33,), generator=gen)
    t[::4] = -100
    t[1] = 7 if cols <= 7 else t[1]  # out of range where it can be
    valid_range = t[1].item() < cols
    loss, lse, grad = ce.reference(x, t, -100, eps)
    keep = torch.ones(33, dtype=torch.bool)
    if not valid_range:
        keep[1] = False
        assert torch.isnan(loss[1]) and torch.isnan(grad[1]).all()
    ref = F.cross_entropy(x[keep], t[keep], reduction="none", label_smoothing=eps)
    assert torch.allclose(loss[keep], ref, rtol=1e-12, atol=1e-12)
    assert torch.allclose(lse, torch.logsumexp(x, -1), rtol=1e-12, atol=1e-12)
    assert (loss[::4] == 0).all() and (grad[::4] == 0).all()
    for reduction in ("sum", "mean"):
        xr = x[keep].clone().requires_grad_()
        out = F.cross_entropy(xr, t[keep], reduction=reduction, label_smoothing=eps)
        out.backward()
        scale = 1.0 if reduction == "sum" else 1.0 / (t[keep] != -100).sum().item()
        assert torch.allclose(grad[keep] * scale, xr.grad, rtol=1e-10, atol=1e-12)
        mine = loss[keep].sum() * scale
        assert torch.allclose(mine, out.detach(), rtol=1e-12, atol=1e-12)
    dloss = torch.randn(33, generator=gen, dtype=torch.float64)
    _, _, scaled = ce.reference(x, t, -100, eps, dloss)
    assert torch.allclose(scaled[keep], grad[keep] * dloss[keep, None], rtol=1e-12, atol=1e-14)


def test_the_reference_on_rows_of_minus_infinity():
    x = torch.full((3, 5), -torch.inf, dtype=torch.float64)
    x[2, 1] = 0.0
    t = torch.tensor([0, -100, 1])
    loss, lse, grad = ce.reference(x, t)
    assert torch.isnan(loss[0]) and lse[0] == -torch.inf and torch.isnan(grad[0]).all()
    assert loss[1] == 0 and (grad[1] == 0).all()
    assert loss[2] == 0 and grad[2, 1] == 0 and (grad[2, [0, 2, 3, 4]] == 0).all()
    ref = F.cross_entropy(x, torch.tensor([0, -100, 1]), reduction="none")
    assert torch.isnan(ref[0]) and torch.equal(loss[1:], ref[1:])


def test_the_bench_counts_at_least_64_mb():
    from bench import rowwise_cross_entropy as bench

    for size, (rows, cols) in bench.SIZES.items():
        assert rows * cols * 2 >= 64 << 20, size
        assert bench.moved_bytes(rows, cols, 2, "forward") >= 64 << 20
    assert {"32k", "128k"} <= set(bench.SIZES)
    assert set(bench.DIRECTIONS) == {"forward", "fused", "backward"}
    args = bench.parse_args(["--sizes", "32k", "--direction", "fused"])
    assert args.sizes == "32k" and args.direction == "fused"


def _sm90a_functions(log: str) -> dict[str, tuple[int, int, int]]:
    from hopattn.compiler.ptxas import parse_ptxas

    return {fn: (r.registers, r.spill_stores, r.spill_loads)
            for (arch, fn), r in parse_ptxas(log).items() if arch == "sm_90a"}


# The template instances each stage's launcher can dispatch (3 dtypes each): kernel name -> count.
EXPECTED_INSTANCES = {1: {"cross_entropy_three_passes": 3},
                      2: {"cross_entropy_online": 12},
                      3: {"cross_entropy_online": 12, "cross_entropy_rows": 24},
                      4: {"cross_entropy_online": 12, "cross_entropy_cluster_rows": 33},
                      5: {"cross_entropy_online": 12, "cross_entropy_lean_rows": 33}}


@needs_nvcc
@pytest.mark.nvcc
@pytest.mark.slow  # five stages for sm_90a: a minute or two, cached after
def test_every_stage_compiles_without_spills():
    results = rowwise_build.build_all(STAGES, jobs=2)
    for stage in STAGES:
        functions = _sm90a_functions(results[(stage.lineage, stage.number)].ptxas_log)
        counts = {}
        for name in functions:
            kernel = re.match(r"_Z\d+(\w+?)I", name).group(1)
            counts[kernel] = counts.get(kernel, 0) + 1
        assert counts == EXPECTED_INSTANCES.get(stage.number, counts), (stage.name, counts)
        spilled = {n: f for n, f in functions.items() if f[1] or f[2]}
        assert not spilled, f"cross-entropy {stage.id} spills: {spilled}"


@needs_nvcc
@pytest.mark.nvcc
def test_the_binding_builds_and_imports():
    assert Path(ce.build_native()).is_file()
    assert ce._native().CROSS_ENTROPY_ABI_VERSION == 1
