"""The RMSNorm backward without a GPU: its lineage (kernels/rmsnorm_backward, beside the forward's),
the typed stage.toml with [weight_grad], its [constants] against kernel.cu, the ABI every stage
exports; the op's contract (every bad input raises before a launch, naming the argument, through
rms_norm_backward and torch.ops.hopattn.rms_norm_backward alike, on fake CUDA tensors); the fake
implementation's shapes; the autograd formula's wiring (what it asks of the op, what it hands back);
the build's lineage selection; and (slow, needs nvcc) every stage compiled for sm_90a without
spills, as its notes state."""

import re
import shutil
from types import SimpleNamespace

import pytest
from hopattn import build, cuda_tools, lineage, rowwise, rowwise_backward, rowwise_build

STAGES = rowwise_backward.discover()
needs_nvcc = pytest.mark.skipif(cuda_tools.find("nvcc") is None,
                                reason="nvcc not found (install the CUDA toolkit or pip's nvidia-cuda-nvcc)")


# --- the lineage -----------------------------------------------------------------------------------

def test_lineage_is_discovered_in_order_beside_the_forward():
    assert [s.number for s in STAGES] == list(range(1, len(STAGES) + 1)) and len(STAGES) >= 4
    assert all(s.lineage == "rmsnorm_backward" and s.dir.parent == rowwise_backward.RMSNORM_BACKWARD_DIR
               for s in STAGES)
    assert rowwise_backward.RMSNORM_BACKWARD_DIR.parent == lineage.RMSNORM_DIR.parent
    assert all(s.lineage == "rmsnorm" for s in rowwise.discover())  # the forward sees none of it


def test_library_names_carry_the_lineage():
    names = {build.library_path(s).name for s in STAGES}
    assert all(n.startswith("rmsnorm_backward-stage") for n in names) and len(names) == len(STAGES)


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_spec_constants_match_the_kernel(stage):
    assert rowwise_backward.constant_mismatches(stage) == []
    assert re.search(rf"__global__ void .*?\b{stage.kernel}\(", stage.kernel_path.read_text(), re.S), stage.kernel
    assert stage.spec.launch.threads in stage.constants().values()


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_every_stage_exports_the_abi_and_states_its_prediction(stage):
    source = stage.kernel_path.read_text()
    assert '#include "../common/abi_rmsnorm_backward.h"' in source
    for name in ("hopattn_rmsnorm_backward_workspace", "hopattn_rmsnorm_backward_launch",
                 "hopattn_rmsnorm_backward_describe"):
        assert f"HOPATTN_EXPORT int {name}(" in source
    assert source.count("rms_backward_check_params(p, err, errlen)") == 3
    assert "atomicAdd" not in source and "red.global" not in source  # dw in a fixed order: no atomics
    notes = stage.notes_path.read_text()
    assert "## Prediction" in notes and "## Measured" in notes and "Not measured yet" not in notes
    assert "ptxas -v" in notes


def test_the_final_stage_reads_once_and_sums_dw_in_a_fixed_order():
    final = STAGES[-1].spec
    assert final.row.reads == 1 and final.row.held in ("registers", "smem") and final.weight_grad.persistent
    assert final.weight_grad.combine == "fixed-order-partials" and "cluster" in final.row.owners


def test_spec_errors_name_the_file_and_the_field(tmp_path):
    folder = tmp_path / "rmsnorm_backward" / "01_two-plain-kernels"
    shutil.copytree(STAGES[0].dir, folder)
    spec = folder / "stage.toml"
    text = spec.read_text()
    spec.write_text(text.replace('combine = "none"', 'combine = "magic"'))
    with pytest.raises(lineage.SpecError, match=r"stage.toml: field 'weight_grad.combine' must be one of none"):
        rowwise_backward.load_stage(folder)
    spec.write_text(text.replace('combine = "none"', 'combine = "atomics"'))
    with pytest.raises(lineage.SpecError, match=r"'weight_grad.combine' must be 'none' exactly when a thread"):
        rowwise_backward.load_stage(folder)
    spec.write_text(text.split("[weight_grad]")[0] + "[constants]\nkThreads = 128\n")
    with pytest.raises(lineage.SpecError, match=r"field 'weight_grad' must be a table"):
        rowwise_backward.load_stage(folder)
    spec.write_text(text.replace("backward = true", "backward = false"))
    with pytest.raises(lineage.SpecError, match=r"'supports.backward' must be true"):
        rowwise_backward.load_stage(folder)


def test_a_wrong_constant_is_reported(tmp_path):
    root = tmp_path / "kernels"
    folder = root / "rmsnorm_backward" / "01_two-plain-kernels"
    shutil.copytree(STAGES[0].dir, folder)
    spec = folder / "stage.toml"
    spec.write_text(spec.read_text().replace("kThreads = 128", "kThreads = 64"))
    assert rowwise_backward.constant_mismatches(rowwise_backward.load_stage(folder)) == [
        f"{spec}: constants.kThreads = 64, kernel.cu has 128"]


def test_the_build_selects_lineages():
    assert {"rmsnorm", "rmsnorm_backward"} <= set(rowwise_build.LINEAGES)
    with pytest.raises(SystemExit):
        rowwise_build.main(["3-4"] + ["--lineage", "all"])  # stages of which lineage?


# --- the op's contract on fake tensors -------------------------------------------------------------

torch = pytest.importorskip("torch", reason="the op needs torch")
from hopattn import rmsnorm  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

BF16 = torch.bfloat16


def _f(*shape, dtype=BF16, stride=None):
    if stride is not None:
        return torch.empty_strided(shape, stride, dtype=dtype, device="cuda")
    return torch.empty(*shape, dtype=dtype, device="cuda")


def _good():
    return dict(dy=_f(4, 8), x=_f(4, 8), weight=_f(8), rstd=_f(4, dtype=torch.float32), drstd=None)


BAD = [  # (a change to good arguments, made under FakeTensorMode; the error; its message)
    (lambda a: a.update(dy=_f(4, 8, dtype=torch.float32)), ValueError,
     r"dy: expected x's dtype torch.bfloat16, got torch.float32: pass dy.to\(torch.bfloat16\)"),
    (lambda a: a.update(dy=_f(4, 9)), ValueError, r"dy: expected x's shape \(4, 8\), got \(4, 9\)"),
    (lambda a: a.update(dy=_f(4, 8, stride=(1, 4))), ValueError, r"dy: the last axis must be contiguous"),
    (lambda a: a.update(dy=_f(4, 8, stride=(0, 1))), ValueError, r"dy: its rows, .* are not a single stride"),
    (lambda a: a.update(x=_f(4, 8, dtype=torch.float64)), ValueError, "x: expected torch.bfloat16, torch.float16"),
    (lambda a: a.update(weight=_f(7)), ValueError, r"weight: expected shape \(8,\)"),
    (lambda a: a.update(rstd=_f(4)), ValueError, r"rstd: expected torch.float32 \(the forward's rstd\)"),
    (lambda a: a.update(rstd=_f(3, dtype=torch.float32)), ValueError, r"rstd: expected shape \(4,\)"),
    (lambda a: a.update(rstd=_f(4, dtype=torch.float32, stride=(2,))), ValueError,
     r"rstd: expected a contiguous tensor"),
    (lambda a: a.update(drstd=_f(5, dtype=torch.float32)), ValueError, r"drstd: expected shape \(4,\)"),
]


@pytest.mark.parametrize("change,error,message", BAD, ids=[m for _, _, m in BAD])
def test_bad_inputs_name_the_argument(change, error, message):
    with FakeTensorMode():
        a = _good()
        change(a)
        with pytest.raises(error, match=message):
            rmsnorm.rms_norm_backward(a["dy"], a["x"], a["weight"], a["rstd"], a["drstd"])
        with pytest.raises(error, match=message):
            torch.ops.hopattn.rms_norm_backward(a["dy"], a["x"], a["weight"], a["rstd"], a["drstd"], True, None)


def test_stage_flags_and_types_are_checked():
    with FakeTensorMode():  # through the Python function: the op's schema would refuse them first, or read True as 1
        a = _good()
        with pytest.raises(TypeError, match="dy: expected a torch.Tensor, got list"):
            rmsnorm.rms_norm_backward([1.0], a["x"], a["weight"], a["rstd"])
        with pytest.raises(TypeError, match="drstd: expected a torch.Tensor or None, got float"):
            rmsnorm.rms_norm_backward(a["dy"], a["x"], a["weight"], a["rstd"], 3.0)
        with pytest.raises(ValueError, match="stage: expected None \\(the final backward stage"):
            rmsnorm.rms_norm_backward(a["dy"], a["x"], a["weight"], a["rstd"], stage=99)
        with pytest.raises(ValueError, match="stage: expected None"):
            rmsnorm.rms_norm_backward(a["dy"], a["x"], a["weight"], a["rstd"], stage=True)
        with pytest.raises(TypeError, match="weight_grad: expected a bool"):
            rmsnorm.check_backward(a["dy"], a["x"], a["weight"], a["rstd"], None, 1, None)


def test_cpu_tensors_are_refused_with_the_fix():
    x = torch.ones(2, 8)
    with pytest.raises(ValueError, match=r"x: expected a CUDA tensor, got one on cpu: pass x.cuda\(\)"):
        rmsnorm.rms_norm_backward(x, x, None, torch.ones(2))


def test_fake_outputs_have_the_op_shapes():
    with FakeTensorMode():
        for dtype in (BF16, torch.float16, torch.float32):
            x, w = _f(2, 3, 4096, dtype=dtype), _f(4096, dtype=dtype)
            rstd = _f(2, 3, dtype=torch.float32)
            dx, dw = torch.ops.hopattn.rms_norm_backward(x, x, w, rstd, None, True, None)
            assert dx.shape == x.shape and dx.dtype == dtype and dx.is_contiguous() and dw.shape == (4096,)
            _, dw = torch.ops.hopattn.rms_norm_backward(x, x, w, rstd, rstd, False, None)
            assert dw.shape == (0,)
            dx, dw = rmsnorm.rms_norm_backward(x, x, None, rstd)  # no weight: no dw
            assert dx.shape == x.shape and dw is None
        row = _f(5)  # one row, rstd a 0-d tensor
        dx, _ = rmsnorm.rms_norm_backward(row, row, None, torch.empty((), device="cuda"))
        assert dx.shape == (5,)


def test_strided_rows_are_read_in_place():
    with FakeTensorMode():
        x = _f(8, 4096, stride=(4100, 1))  # a column slice of a wider tensor
        dy = _f(2, 4, 4096, stride=(4 * 5000, 5000, 1))
        call = rmsnorm.check_backward(dy.view(8, 4096), x, None, _f(8, dtype=torch.float32), None, True, None)
        assert (call.x_stride, call.dy_stride, call.weight_grad) == (4100, 5000, False)


class _Ctx(SimpleNamespace):
    pass


def test_the_autograd_formula_asks_for_what_is_needed():
    """rmsnorm._backward (registered for hopattn::rms_norm): dw only when the weight needs it, the
    gradient of rstd passed on, one gradient per input of the op."""
    seen = []
    real = torch.ops.hopattn.rms_norm_backward

    def spy(dy, x, weight, rstd, drstd, weight_grad, stage):
        seen.append(dict(dy_contiguous=dy.is_contiguous(), weight=weight is not None, drstd=drstd is not None,
                         weight_grad=weight_grad))
        return real(dy, x, weight, rstd, drstd, weight_grad, stage)

    with FakeTensorMode():
        x, w, rstd = _f(4, 8), _f(8), _f(4, dtype=torch.float32)
        original = torch.ops.hopattn.rms_norm_backward
        try:
            torch.ops.hopattn.rms_norm_backward = spy  # noqa: B010  (only this module's attribute lookup)
        except (AttributeError, TypeError):
            pytest.skip("torch.ops.hopattn cannot be patched in this torch")
        try:
            ctx = _Ctx(saved_tensors=(x, w, rstd), needs_input_grad=(True, False, False, False), has_weight=True)
            grads = rmsnorm._backward(ctx, _f(4, 8), None)
            assert len(grads) == 4 and grads[0].shape == x.shape and grads[1] is None and grads[2:] == (None, None)
            ctx = _Ctx(saved_tensors=(x, w, rstd), needs_input_grad=(False, True, False, False), has_weight=True)
            grads = rmsnorm._backward(ctx, _f(4, 8), rstd)
            assert grads[0] is None and grads[1].shape == (8,)
            ctx = _Ctx(saved_tensors=(x, None, rstd), needs_input_grad=(True, False, False, False), has_weight=False)
            grads = rmsnorm._backward(ctx, None, rstd)  # only rstd reached the loss
            assert grads[0].shape == x.shape and grads[1] is None
        finally:
            torch.ops.hopattn.rms_norm_backward = original
    assert seen == [dict(dy_contiguous=True, weight=True, drstd=False, weight_grad=False),
                    dict(dy_contiguous=True, weight=True, drstd=True, weight_grad=True),
                    dict(dy_contiguous=True, weight=False, drstd=True, weight_grad=False)]


def test_gradients_that_are_not_rows_a_stride_apart_are_made_contiguous():
    base = torch.ones(4, 16)
    assert rmsnorm._as_rows(base[:, :8]) is not None and rmsnorm._as_rows(base[:, :8]).data_ptr() == base.data_ptr()
    for grad in (torch.ones(()).expand(4, 8), torch.ones(8, 4).t(), torch.ones(6, 4, 8).transpose(0, 1)):
        rows = rmsnorm._as_rows(grad)
        assert rows.is_contiguous() and torch.equal(rows, grad)
    empty = torch.ones(0, 8)
    assert rmsnorm._as_rows(empty) is empty


def test_the_forward_op_differentiates_through_the_backward_op():
    """register_autograd wired hopattn::rms_norm to rmsnorm._backward (recording autograd on fake CUDA
    tensors needs a CUDA build of torch: the GPU tests run .backward() itself)."""
    op = rmsnorm._rms_norm_op
    if not hasattr(op, "_backward_fn"):
        pytest.skip("this torch's CustomOpDef keeps its autograd formula elsewhere")
    assert op._backward_fn is rmsnorm._backward and op._setup_context_fn is rmsnorm._setup


def test_default_stage_is_the_final_one():
    assert rmsnorm._backward_stage(None).number == rmsnorm.final_backward_stage() == len(rmsnorm.backward_stages())


# --- the compiled stages ---------------------------------------------------------------------------

def _sm90a_functions(log: str) -> dict[str, tuple[int, int, int]]:
    """{kernel: (registers, spill stores, spill loads)} of a ptxas -v report's sm_90a entries."""
    out = {}
    for m in re.finditer(r"Compiling entry function '(\S+)' for 'sm_90a'\n.*?\n\s+\d+ bytes stack frame, (\d+) bytes "
                         r"spill stores, (\d+) bytes spill loads\n.*?Used (\d+) registers", log):
        out[m.group(1)] = (int(m.group(4)), int(m.group(2)), int(m.group(3)))
    return out


@needs_nvcc
@pytest.mark.nvcc
@pytest.mark.slow  # four stages for sm_90a: a minute or two on two cores, cached after
def test_every_stage_compiles_without_spills():
    results = rowwise_build.build_all(STAGES, jobs=2)
    for stage in STAGES:
        functions = _sm90a_functions(results[(stage.lineage, stage.number)].ptxas_log)
        assert any(stage.kernel in name for name in functions), (stage.name, list(functions))
        spilled = {n: f for n, f in functions.items() if f[1] or f[2]}
        assert not spilled, f"stage {stage.id} spills: {spilled}"
        # 1024-thread CTAs (and the held rows' CTAs, bound to 1024 threads an SM) need <= 64 registers
        assert all(f[0] <= 64 for n, f in functions.items() if "rmsnorm_bwd_rows" in n), \
            {n: f for n, f in functions.items() if "rmsnorm_bwd_rows" in n and f[0] > 64}


def _sass_of(library, kernel_prefix: str) -> dict[str, str]:
    """{mangled name: SASS} of the functions of a library whose names start with kernel_prefix."""
    import subprocess

    tool = cuda_tools.find("cuobjdump")
    text = subprocess.run([str(tool), "-sass", str(library)], capture_output=True, text=True, check=True).stdout
    out = {}
    for part in text.split("Function : ")[1:]:
        name, _, body = part.partition("\n")
        if name.strip().startswith(kernel_prefix):
            out[name.strip()] = body
    return out


@needs_nvcc
@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.skipif(cuda_tools.find("cuobjdump") is None, reason="cuobjdump not found (pip's nvidia-cuda-cuobjdump)")
def test_what_the_notes_say_of_the_sass():
    """Stage 05's row copies are LDGSTS with zero fill, and its clusters' exchange costs a GPU-scope
    membar a row; stage 06's exchange is STAS and mbarrier transactions, with no membar at all."""
    by_slug = {s.slug: s for s in STAGES}
    libs = rowwise_build.build_all([by_slug["prefetch-next-row"], by_slug["cluster-exchange-without-fences"]], jobs=2)
    cluster16 = "_Z16rmsnorm_bwd_rowsI13__nv_bfloat16Li1024ELi2ELi1ELi16E"
    s05 = _sass_of(libs[("rmsnorm_backward", 5)].library, cluster16)
    s06 = _sass_of(libs[("rmsnorm_backward", 6)].library, cluster16)
    assert len(s05) == len(s06) == 1
    (sass05,), (sass06,) = s05.values(), s06.values()
    assert "LDGSTS.E.BYPASS.128.ZFILL" in sass05 and "LDGSTS.E.BYPASS.128.ZFILL" in sass06
    assert "MEMBAR.ALL.GPU" in sass05 and "MEMBAR" not in sass06
    assert "STAS" in sass06 and "SYNCS.ARRIVE.TRANS64" in sass06 and "SYNCS.PHASECHK.TRANS64" in sass06
