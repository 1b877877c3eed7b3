"""The softmax lineages without a GPU: discovery (kernels/softmax and kernels/softmax_backward, beside
the RMSNorm lineages), the typed stage.toml, [constants] against kernel.cu, the ABI every stage
exports; the ops' contract (every bad input raises before a launch, naming the argument, through
hopattn.softmax / softmax_backward and torch.ops.hopattn.* alike, on fake CUDA tensors); the fake
implementations' shapes; the autograd formula's wiring; the GPU cases' spread; and (slow, needs
nvcc) every stage compiled for sm_90a without spills."""

import re
import shutil
from types import SimpleNamespace

import pytest
from hopattn import build, cuda_tools, lineage, rowwise_build, softmax_lineage
from rmsnorm_fuzz import DTYPES, VIEWS, softmax_cases

FORWARD = softmax_lineage.discover()
BACKWARD = softmax_lineage.discover_backward()
ALL = FORWARD + BACKWARD
IDS = [f"{s.lineage}-{s.name}" for s in ALL]
needs_nvcc = pytest.mark.skipif(cuda_tools.find("nvcc") is None,
                                reason="nvcc not found (install the CUDA toolkit or pip's nvidia-cuda-nvcc)")


def test_lineages_are_discovered_in_order():
    for stages, name in ((FORWARD, "softmax"), (BACKWARD, "softmax_backward")):
        assert [s.number for s in stages] == list(range(1, len(stages) + 1))
        assert all(s.lineage == name for s in stages)
    assert len(FORWARD) >= 4 and len(BACKWARD) >= 2
    assert softmax_lineage.SOFTMAX_DIR.parent == lineage.RMSNORM_DIR.parent
    assert {"softmax", "softmax_backward"} <= set(rowwise_build.LINEAGES)
    names = {build.library_path(s).name for s in ALL}
    assert len(names) == len(ALL) and all(n.startswith(("softmax-stage", "softmax_backward-stage")) for n in names)


@pytest.mark.parametrize("stage", ALL, ids=IDS)
def test_spec_constants_abi_and_notes(stage):
    assert softmax_lineage.constant_mismatches(stage) == []
    source = stage.kernel_path.read_text()
    assert re.search(rf"__global__ void .*?\b{stage.kernel}\(", source, re.S), stage.kernel
    assert stage.spec.launch.threads in stage.constants().values()
    prefix = "hopattn_softmax_backward" if stage.lineage == "softmax_backward" else "hopattn_softmax"
    for name in (f"{prefix}_launch", f"{prefix}_describe"):
        assert f"HOPATTN_EXPORT int {name}(" in source
    assert source.count("check_params(p, err, errlen)") == 2
    notes = stage.notes_path.read_text()
    assert "## Prediction" in notes and "## Measured" in notes
    # measured, or the newest stage before its GPU run (tests/test_part_ii_notes.py checks the records)
    assert "Not measured yet" not in notes or stage in (FORWARD[-1], BACKWARD[-1])
    assert "ptxas -v" in notes


def test_the_final_stages_read_once():
    assert FORWARD[-1].spec.row.reads == 1 and "cluster" in FORWARD[-1].spec.row.owners
    assert BACKWARD[-1].spec.row.reads == 1 and "cluster" in BACKWARD[-1].spec.row.owners


def test_spec_errors_name_the_file_and_the_field(tmp_path):
    folder = tmp_path / "softmax" / "01_three-passes"
    shutil.copytree(FORWARD[0].dir, folder)
    spec = folder / "stage.toml"
    spec.write_text(spec.read_text() + "\n[supports2]\n")
    with pytest.raises(lineage.SpecError, match="supports2: unknown key"):
        softmax_lineage.load_stage(folder)
    spec.write_text(spec.read_text().replace("\n[supports2]\n", "").replace("strided = true", "strided = true\nbackward = true"))
    with pytest.raises(lineage.SpecError, match="'supports.backward' must be false in a forward stage"):
        softmax_lineage.load_stage(folder)


def test_cases_span_the_contract():
    cases = softmax_cases(1234)
    assert {c.dtype for c in cases} == set(DTYPES) and {c.view for c in cases} == set(VIEWS)
    assert {1, 65537, 262144, 524289} <= {c.cols for c in cases}
    assert any(c.masked for c in cases) and any(not c.masked for c in cases)
    assert softmax_cases(3) == softmax_cases(3) != softmax_cases(4)


torch = pytest.importorskip("torch", reason="the ops need torch")
import hopattn  # noqa: E402
from hopattn import softmax_ops as sm  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

BF16 = torch.bfloat16


def _f(*shape, dtype=BF16, stride=None):
    if stride is not None:
        return torch.empty_strided(shape, stride, dtype=dtype, device="cuda")
    return torch.empty(*shape, dtype=dtype, device="cuda")


FORWARD_BAD = [
    (lambda: _f(4, 8, dtype=torch.float64), ValueError, "x: expected torch.bfloat16, torch.float16"),
    (lambda: _f(4, 0), ValueError, "x: the last axis is empty"),
    (lambda: _f(4, 8, stride=(1, 4)), ValueError, r"x: the last axis must be contiguous .* pass x.contiguous"),
    (lambda: _f(6, 4, 16, stride=(16, 96, 1)), ValueError, "do not fold into rows"),
    (lambda: _f(4, 64, stride=(32, 1)), ValueError, "x: rows overlap"),
]


@pytest.mark.parametrize("make,error,message", FORWARD_BAD, ids=[m for _, _, m in FORWARD_BAD])
def test_forward_bad_inputs_name_the_argument(make, error, message):
    with FakeTensorMode():
        x = make()
        with pytest.raises(error, match=message):
            hopattn.softmax(x)
        with pytest.raises(error, match=message):
            torch.ops.hopattn.softmax(x, None)


BACKWARD_BAD = [
    (lambda: (_f(4, 8, dtype=torch.float32), _f(4, 8)), ValueError, r"dy: expected y's dtype torch.bfloat16"),
    (lambda: (_f(4, 9), _f(4, 8)), ValueError, r"dy: expected y's shape \(4, 8\), got \(4, 9\)"),
    (lambda: (_f(4, 8, stride=(1, 4)), _f(4, 8)), ValueError, "dy: the last axis must be contiguous"),
    (lambda: (_f(4, 8), _f(4, 8, stride=(1, 4))), ValueError, "y: the last axis must be contiguous"),
    (lambda: (_f(4, 8, stride=(0, 1)), _f(4, 8)), ValueError, "dy: rows overlap"),
]


@pytest.mark.parametrize("make,error,message", BACKWARD_BAD, ids=[m for _, _, m in BACKWARD_BAD])
def test_backward_bad_inputs_name_the_argument(make, error, message):
    with FakeTensorMode():
        dy, y = make()
        with pytest.raises(error, match=message):
            sm.softmax_backward(dy, y)
        with pytest.raises(error, match=message):
            torch.ops.hopattn.softmax_backward(dy, y, None)


def test_stages_and_types_are_checked():
    with pytest.raises(ValueError, match=r"x: expected a CUDA tensor, got one on cpu: pass x.cuda\(\)"):
        hopattn.softmax(torch.ones(2, 8))
    with FakeTensorMode():
        x = _f(4, 8)
        with pytest.raises(ValueError, match="stage: expected None \\(the final stage"):
            hopattn.softmax(x, stage=99)
        with pytest.raises(ValueError, match="stage: expected None"):
            hopattn.softmax(x, stage=True)
        with pytest.raises(ValueError, match="stage: expected None \\(the final backward stage"):
            sm.softmax_backward(x, x, stage=99)
        with pytest.raises(TypeError, match="x: expected a torch.Tensor, got list"):
            hopattn.softmax([1.0])


def test_fake_outputs_have_the_op_shapes():
    with FakeTensorMode():
        for dtype in (BF16, torch.float16, torch.float32):
            x = _f(2, 3, 4096, dtype=dtype)
            y = torch.ops.hopattn.softmax(x, None)
            assert y.shape == x.shape and y.dtype == dtype and y.is_contiguous()
            dx = torch.ops.hopattn.softmax_backward(x, y, None)
            assert dx.shape == x.shape and dx.dtype == dtype and dx.is_contiguous()
        assert hopattn.softmax(_f(5)).shape == (5,)
        assert hopattn.softmax(_f(0, 7)).shape == (0, 7)
        call = sm.check(_f(8, 4096, stride=(4100, 1)), None)
        assert (call.rows, call.cols, call.x_stride) == (8, 4096, 4100)


def test_the_autograd_formula_saves_y_and_runs_the_backward_op():
    op = sm._softmax_op
    if hasattr(op, "_backward_fn"):
        assert op._backward_fn is sm._backward and op._setup_context_fn is sm._setup
    with FakeTensorMode():
        y = _f(4, 8)
        ctx = SimpleNamespace()
        ctx.save_for_backward = lambda *t: setattr(ctx, "saved_tensors", t)
        sm._setup(ctx, (_f(4, 8), None), y)
        assert ctx.saved_tensors == (y,)
        grads = sm._backward(ctx, _f(4, 8))
        assert len(grads) == 2 and grads[0].shape == (4, 8) and grads[1] is None


def test_default_stages_are_the_final_ones():
    assert sm._pick(sm._STAGES, None, "").number == sm.final_stage() == len(FORWARD)
    assert sm._pick(sm._BACKWARD_STAGES, None, "").number == sm.final_backward_stage() == len(BACKWARD)


def _sm90a_functions(log: str) -> dict[str, tuple[int, int, int]]:
    out = {}
    for m in re.finditer(r"Compiling entry function '(\S+)' for 'sm_90a'\n.*?\n\s+\d+ bytes stack frame, (\d+) bytes "
                         r"spill stores, (\d+) bytes spill loads\n.*?Used (\d+) registers", log):
        out[m.group(1)] = (int(m.group(4)), int(m.group(2)), int(m.group(3)))
    return out


@needs_nvcc
@pytest.mark.nvcc
@pytest.mark.slow  # eight stages for sm_90a: a minute or two on two cores, cached after
def test_every_stage_compiles_without_spills():
    results = rowwise_build.build_all(ALL, jobs=2)
    for stage in ALL:
        functions = _sm90a_functions(results[(stage.lineage, stage.number)].ptxas_log)
        assert any(stage.kernel in name for name in functions), (stage.name, list(functions))
        spilled = {n: f for n, f in functions.items() if f[1] or f[2]}
        assert not spilled, f"{stage.lineage} {stage.id} spills: {spilled}"
        assert all(f[0] <= 64 for n, f in functions.items() if "Li1024E" in n), "1024-thread CTAs need <= 64 registers"
        if stage.lineage == "softmax" and stage.number >= 5:  # its slices: four 256-thread CTAs an SM
            assert all(f[0] <= 64 for n, f in functions.items() if "Li256ELi8ELi1E" in n), "slices need <= 64 registers"
