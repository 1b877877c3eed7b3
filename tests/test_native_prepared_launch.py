"""The binding's prepared launch (kernels/hopattn/native.cpp, StageLibrary.prepare / launch_prepared, which
api._run calls) hands a stage library the same AttnParams, byte for byte, as launch() with all 19 arguments
does. Checked against a stage library that only records what it is given (research/binding_cost.py builds
it: nvcc, no GPU)."""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import pytest
from hopattn import api, build, cuda_tools

_spec = importlib.util.spec_from_file_location(
    "binding_cost", Path(__file__).resolve().parent.parent / "research" / "binding_cost.py")
binding_cost = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(binding_cost)

pytestmark = pytest.mark.nvcc

def test_prepared_and_plain_launches_pass_the_same_params(tmp_path):
    try:
        cuda_tools.require("nvcc")
    except cuda_tools.ToolError as err:
        pytest.skip(str(err))
    library = binding_cost.build_recorder(tmp_path)
    build.build_native()
    lib = api._native().StageLibrary(str(library))
    recorded = ctypes.CDLL(str(library))
    strides = [(1000, 64, 320), (2000, 128, 640), (3000, 192, 960), (4000, 256, 1280)]
    sizes = dict(batch=2, heads=8, len_q=300, len_k=500, head_dim=96, scale=0.3, causal=True, num_sms=132, kv_heads=4)
    plain, prepared = ctypes.create_string_buffer(1024), ctypes.create_string_buffer(1024)
    lib.launch(11, 22, 33, 44, *strides, *list(sizes.values())[:8], 0, sizes["kv_heads"], 55)
    n = recorded.last_params(plain)
    lib.launch_prepared(lib.prepare(*strides, *sizes.values()), 11, 22, 33, 44, 55, 0)
    assert recorded.last_params(prepared) == n
    assert prepared.raw[:n] == plain.raw[:n]
    lib.launch_prepared(lib.prepare(*strides, *sizes.values()), 11, 22, 33, 44, 0, 0)  # no lse: a null pointer
    recorded.last_params(prepared)
    assert prepared.raw[:n] != plain.raw[:n]
