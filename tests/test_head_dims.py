"""Head dims other than 128 (issue #29): what a stage serves is its stage.toml's supports.head_dims
(stages 01-23 and the backward: 128 only), stage 24's kernel has a tile for each (HeadDimTile<D>)
that fits the shared memory and the register file, and the contract accepts exactly the pairs a
stage serves, refusing any other with an error that names the head dim, the stage and the stage
that serves it, and hopattn.attention (the final stage, 24) serves each. CPU only: meta tensors,
nothing launched."""

import math
import shutil
import sys

import pytest
from hopattn import lineage

torch = pytest.importorskip("torch", reason="the contract checks need torch (pip install torch)")
import hopattn  # noqa: E402
from hopattn import api, backward, contract  # noqa: E402

BF16 = torch.bfloat16
SERVED = ((64, 64), (96, 96), (128, 128), (192, 128), (256, 256))  # issue #29's head dims
SMEM_LIMIT = 227 * 1024
REGISTER_FILE = 65536


def meta(*shape):
    return torch.empty(*shape, dtype=BF16, device="meta")


@pytest.fixture
def s24():
    return lineage.get_stage(24)


@pytest.fixture
def pair():
    """Stages 23 and 24 and the lineage (for the hint naming the stage that serves a head dim)."""
    return lineage.get_stage(23), lineage.get_stage(24), {s.number: s for s in lineage.discover()}


# --- what each stage serves -------------------------------------------------------------------


def test_stages_before_24_and_the_backward_serve_head_dim_128_only():
    for s in lineage.discover() + lineage.discover(lineage.BACKWARD_DIR):
        if s.number < 24 or s.backward:
            assert s.head_dims == ((128, 128),), s.name
            assert s.head_dims_text() == "128"


def test_stage_24_serves_the_issues_head_dims(s24):
    assert s24.head_dims == SERVED
    assert s24.head_dims_text() == "64, 96, 128, 192 (v 128) and 256"
    assert s24.head_dim_v(192) == 128 and s24.head_dim_v(80) is None


def _spec_copy(tmp_path, old, new):
    folder = tmp_path / "01_baseline"
    shutil.copytree(lineage.ATTENTION_DIR / "01_baseline", folder)
    path = folder / "stage.toml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return folder


def test_head_dims_are_read_as_pairs(tmp_path):
    folder = _spec_copy(tmp_path, "[supports]\n", "[supports]\nhead_dims = [64, [192, 128], 128]\n")
    assert lineage.load_stage(folder).head_dims == ((64, 64), (192, 128), (128, 128))


@pytest.mark.parametrize("value, message", [
    ("[60, 128]", "field 'supports.head_dims' must be a list of head dims (positive multiples of 8)"),
    ("[128, 128]", "no d twice"),
    ("[[192, 128, 64], 128]", "each d or [d, dv]"),
    ("[]", "must be a list of head dims"),
    ("[64, 256]", "field 'supports.head_dims' must include tile.head_dim (128, the head dim the figures draw)"),
])
def test_bad_head_dims_are_named(tmp_path, value, message):
    folder = _spec_copy(tmp_path, "[supports]\n", f"[supports]\nhead_dims = {value}\n")
    with pytest.raises(lineage.SpecError) as err:
        lineage.load_stage(folder)
    assert str(folder / "stage.toml") in str(err.value) and message in str(err.value)


# --- stage 24's tiles against its spec and the machine --------------------------------------------


def test_stage_24_has_a_tile_for_each_head_dim_it_serves(s24):
    assert sorted(s24.tile_head_dims()) == sorted(d for d, _ in s24.head_dims)
    assert s24.tile_head_dims()[0] == s24.head_dim == 128  # the figures' tile first: cpp.constants reads it alone
    for d, dv in s24.head_dims:
        c = s24.constants(d)
        assert (c["HEAD_DIM"], c["HEAD_DIM_V"]) == (d, dv)


@pytest.mark.parametrize("head_dim", [d for d, _ in SERVED])
def test_each_tile_fits_the_shared_memory_and_the_register_file(s24, head_dim):
    c = s24.constants(head_dim)
    assert c["BLOCK_M"] == 64 * c["CONSUMERS"] and c["NUM_THREADS"] == 128 * (1 + c["CONSUMERS"])
    assert c["SMEM_BYTES"] <= SMEM_LIMIT, f"{c['SMEM_BYTES']} bytes of shared memory"
    assert 128 * c["PRODUCER_REGS"] + 128 * c["CONSUMERS"] * c["CONSUMER_REGS"] <= REGISTER_FILE  # setmaxnreg
    # A consumer thread's share of O (V's head dim: at 96 the PV reads 96 of the V tile's 128 columns,
    # no product over its zeros), S and P, with room for the rest (addresses, the rows' state, the
    # rings' phases: about 50 registers; ptxas -v, in test_stage24_sass.py, decides).
    assert c["V_TILE_COLS"] == 64 * math.ceil(c["HEAD_DIM_V"] / 64)
    assert (c["O_REGS"], c["S_REGS"], c["P_REGS"]) == (c["HEAD_DIM_V"] // 2, c["BLOCK_N"] // 2, c["BLOCK_N"] // 4)
    assert c["O_REGS"] + c["S_REGS"] + c["P_REGS"] + 48 <= c["CONSUMER_REGS"]
    assert c["BLOCK_N"] % 16 == 0 and c["BLOCK_N"] <= 256 and c["BLOCK_M"] <= 256


def test_the_figures_tile_is_stage_23s(s24):
    """Head dim 128's tile is stage 23's, number for number, and the spec draws it."""
    ours, theirs = s24.constants(128), lineage.get_stage(23).constants()
    for name in ("BLOCK_M", "BLOCK_N", "NUM_THREADS", "KV_STAGES", "Q_STAGES", "SMEM_BYTES", "S_REGS", "O_REGS",
                 "P_REGS", "PRODUCER_REGS", "CONSUMER_REGS", "PINGPONG_BAR", "EPILOGUE_BAR", "SCHED_STAGES"):
        assert ours[name] == theirs[name], name
    assert (s24.block_m, s24.block_n, s24.threads, s24.kv_stages, s24.smem_bytes) == (
        ours["BLOCK_M"], ours["BLOCK_N"], ours["NUM_THREADS"], ours["KV_STAGES"], ours["SMEM_BYTES"])


# --- the contract -----------------------------------------------------------------------------


@pytest.mark.parametrize("head_dim, head_dim_v", SERVED)
def test_stage_24_accepts_each_head_dim_it_serves(s24, head_dim, head_dim_v):
    q, k, v = meta(2, 4, 300, head_dim), meta(2, 2, 500, head_dim), meta(2, 2, 500, head_dim_v)
    call = contract.check_call(q, k, v, causal=True, scale=None, stage=s24, layout="bhsd",
                               out=meta(2, 4, 300, head_dim_v), lse=True)
    assert (call.head_dim, call.head_dim_v) == (head_dim, head_dim_v)
    assert call.scale == pytest.approx(1 / math.sqrt(head_dim))
    assert api._new_out(q, call).shape == (2, 4, 300, head_dim_v)
    bshd = contract.check_call(*(t.transpose(1, 2) for t in (q, k, v)), causal=False, scale=0.5, stage=s24,
                               layout="bshd")
    assert bshd.scale == 0.5 and bshd.head_dim == head_dim


def test_size_one_axes_get_strides_of_their_own_head_dim(s24):
    x = meta(1, 1, 300, 64)
    weird = torch.empty_strided((1, 1, 300, 64), (7, 3, 64, 1), dtype=BF16, device="meta")
    call = contract.check_call(weird, x, x, causal=False, scale=None, stage=s24, layout="bhsd")
    batch, head, row = call.strides(weird)
    assert row == 64 and head % 8 == 0 and batch % 8 == 0 and head > 0 and batch > 0


@pytest.mark.parametrize("q_dim, k_dim, v_dim, message", [
    (80, 80, 80, "q: head dim 80 (the last axis): stage 24 serves head dim 64, 96, 128, 192 (v 128) and 256"),
    (192, 192, 192, "v: expected head dim 128 with q's and k's 192 (stage 24 serves 64, 96, 128, 192 (v 128) and "
                    "256), got 192"),
    (64, 64, 128, "v: expected head dim 64 with q's and k's 64"),
    (64, 128, 64, "k: expected head dim 64 as q's (the last axis), got 128"),
])
def test_stage_24_refuses_other_head_dims_naming_them(s24, q_dim, k_dim, v_dim, message):
    with pytest.raises(ValueError) as err:
        contract.check_call(meta(1, 2, 128, q_dim), meta(1, 2, 128, k_dim), meta(1, 2, 128, v_dim), causal=False,
                            scale=None, stage=s24, layout="bhsd")
    assert message in str(err.value)


def test_an_out_with_q_s_head_dim_is_refused_where_v_s_differs(s24):
    q, v = meta(1, 2, 128, 192), meta(1, 2, 128, 128)
    with pytest.raises(ValueError, match=r"out: expected a torch.bfloat16 tensor of shape \(1, 2, 128, 128\)"):
        contract.check_call(q, q, v, causal=False, scale=None, stage=s24, layout="bhsd", out=meta(1, 2, 128, 192))


def test_stage_23_names_the_stage_that_serves_the_head_dim(pair):
    s23, s24, stages = pair
    with pytest.raises(ValueError) as err:
        contract.check_call(*(meta(1, 2, 128, 64),) * 3, causal=False, scale=None, stage=s23, layout="bhsd",
                            lineage=stages)
    assert str(err.value) == ("q: head dim 64 (the last axis): stage 23 serves head dim 128; use stage 24 or later, "
                              "which serves head dim 64, 96, 128, 192 (v 128) and 256")
    with pytest.raises(ValueError) as err:  # a head dim no stage serves: no hint
        contract.check_call(*(meta(1, 2, 128, 72),) * 3, causal=False, scale=None, stage=s23, layout="bhsd",
                            lineage=stages)
    assert str(err.value) == "q: head dim 72 (the last axis): stage 23 serves head dim 128"


def test_every_stage_before_24_refuses_head_dim_64():
    for s in lineage.discover():
        if s.number < 24:
            with pytest.raises(ValueError, match=f"q: head dim 64 \\(the last axis\\): stage {s.id} serves head "
                                                 f"dim 128"):
                hopattn.attention(*(meta(1, 2, 128, 64),) * 3, stage=s.number)


def test_the_backward_refuses_other_head_dims_naming_its_stage():
    x = meta(1, 2, 128, 64)
    lse = torch.empty(1, 2, 128, dtype=torch.float32, device="meta")
    with pytest.raises(ValueError, match=r"q: head dim 64 \(the last axis\): backward stage \d\d serves head dim 128"):
        backward.attention_backward(x, x, x, x, x, lse)


# --- through hopattn.attention and the ops (stage 24 is the final stage) --------------------------


@pytest.mark.parametrize("head_dim, head_dim_v", SERVED)
def test_attention_returns_v_s_head_dim_through_every_op(head_dim, head_dim_v):
    q, k, v = meta(2, 4, 300, head_dim), meta(2, 2, 500, head_dim), meta(2, 2, 500, head_dim_v)
    assert hopattn.attention(q, k, v, stage=24).shape == (2, 4, 300, head_dim_v)
    out, lse = hopattn.attention(q, k, v, stage=24, causal=True, return_lse=True)
    assert out.shape == (2, 4, 300, head_dim_v) and lse.shape == (2, 4, 300)
    assert torch.ops.hopattn.attention(q, k, v, False, None, 24, "bhsd").shape == (2, 4, 300, head_dim_v)
    target = meta(2, 4, 300, head_dim_v)
    assert hopattn.attention(q, k, v, stage=24, out=target) is target


def test_the_final_stage_serves_every_head_dim():
    assert api._stage(None).head_dims == SERVED


# --- the protocol of each tile, emulated (research/stage24/protocol.py) ---------------------------


def _protocol():
    import importlib.util

    path = lineage.ATTENTION_DIR.parent.parent / "research" / "stage24" / "protocol.py"
    spec = importlib.util.spec_from_file_location("stage24_protocol", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up there
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def test_no_tile_deadlocks_and_one_q_buffer_needs_the_held_v_first():
    """Three consumers' ring of turns, four K/V buffers, one Q buffer with O staged in it: every
    sequence of output tiles completes in both orders; without issuing the held-back V before the
    wait for the one Q buffer, the order without a mask hangs at head dims 192 and 256."""
    protocol = _protocol()
    tiles = {t.head_dim: t for t in protocol.stage_24_tiles()}
    assert sorted(tiles) == [64, 96, 128, 192, 256] and tiles[64].consumers == 3 and tiles[256].o_in_q
    for t in tiles.values():
        for ring in (False, True):
            for seq in protocol.sequences(150, 0):
                if ring or 0 not in seq:
                    assert protocol.run(t, seq, ring, fixed=True) is None, (t, seq, ring)
    assert protocol.run(tiles[192], [1, 1, 1], ring=False, fixed=False).startswith("producer: q_empty")
    assert protocol.run(tiles[128], [1, 1, 1], ring=False, fixed=False) is None  # two Q buffers: no wait on it
