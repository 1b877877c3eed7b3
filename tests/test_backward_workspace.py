"""The backward's workspace is as large as what its kernels write (nvcc, no GPU: the workspace sizes
are host code of each stage's library, callable on a machine without CUDA devices).

From stage 05 on the row_stats workspace ends with a key-block ticket per (batch, K/V head), which the
preprocess zeroes and the deterministic CTAs take with atomicAdd. The binding once built the size
query without kv_heads (0), so the tickets had no room: the preprocess wrote past the allocation
(into the allocator's rounding slack, or at 8 x 16 x 4096, 512 bytes into the next allocation)."""

from __future__ import annotations

import pytest
from hopattn import api, build, cuda_tools, lineage

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]

STAGES = lineage.discover(lineage.BACKWARD_DIR)
TICKETS_FROM = 5  # the first stage whose row_stats ends with the key-block tickets


@pytest.fixture(scope="module")
def native():
    try:
        cuda_tools.require("nvcc")
    except cuda_tools.ToolError as err:
        pytest.skip(str(err))
    build.build_native()
    return api._native()


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_row_stats_has_room_for_every_ticket(native, stage):
    lib = native.BackwardLibrary(str(build.compile_stage(stage).library))
    batch, heads, len_q = 8, 16, 4096
    for deterministic in (False, True):
        one, _ = lib.workspace(batch, heads, 1, len_q, deterministic)
        four, _ = lib.workspace(batch, heads, 4, len_q, deterministic)
        rows = (len_q + 63) // 64 * 64
        assert one >= 2 * batch * heads * rows  # D and lse2 per row, at least
        # a ticket per (batch, K/V head) from stage 05 on: three more K/V heads, three more per batch
        assert four - one == (3 * batch if stage.number >= TICKETS_FROM else 0), stage.name


def test_kv_heads_out_of_range_is_refused(native):
    lib = native.BackwardLibrary(str(build.compile_stage(STAGES[-1]).library))
    for bad in (0, -1, 17):
        with pytest.raises(ValueError, match="kv_heads: expected 1 to heads"):
            lib.workspace(2, 16, bad, 128, False)


def test_the_backward_sizes_the_workspace_with_the_calls_kv_heads(monkeypatch):
    """hopattn.backward asks its library for the workspace of the call's own K/V heads (GQA: 2 of 8)."""
    import torch
    from hopattn import backward, contract

    asked = []

    class Library:  # stands in for the CUDA library: records the size query, launches nothing
        def workspace(self, batch, heads, kv_heads, len_q, deterministic):
            asked.append((batch, heads, kv_heads, len_q, deterministic))
            return 16, 0

        def launch(self, *args):
            pass

    monkeypatch.setattr(backward, "_library", lambda number: Library())
    monkeypatch.setattr(api, "_check_device_supports", lambda s, device: None)
    monkeypatch.setattr(api, "_sm_count", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "device", lambda device: _Null())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    q = torch.zeros(2, 8, 64, 128, dtype=torch.bfloat16)
    k, v = torch.zeros(2, 2, 64, 128, dtype=torch.bfloat16), torch.zeros(2, 2, 64, 128, dtype=torch.bfloat16)
    out, dout, lse = torch.zeros_like(q), torch.zeros_like(q), torch.zeros(2, 8, 64)
    call = contract.Call(stage=STAGES[-1], layout="bhsd", causal=False, scale=128 ** -0.5, batch=2, heads=8,
                         kv_heads=2, len_q=64, len_k=64)
    backward._run(call, dout, q, k, v, out, lse, None, True)
    assert asked == [(2, 8, 2, 64, True)]


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Stream:
    cuda_stream = 0
