"""The #benchmark section of a stage page: its table on every GPU that measured it."""

from __future__ import annotations

from . import tables


def stage_section(stage, prev, hashes, all_results: list) -> str:
    parts = []
    for nums in all_results:
        table = tables.stage_table(stage, prev, hashes, nums)
        if table:
            head = f"**{nums.gpu_name}**\n\n" if len(all_results) > 1 else f"Measured on {nums.gpu_name}; bf16, head dim 128 unless the shape names another (`d64`; `d192v128`: 192 for Q and K, 128 for V), TFLOP/s = 2·B·H·Lq·Lk·(D + Dv) / time (halved for causal). Environment: [overview](../index.md#environment).\n\n"
            parts.append(head + table)
    if not parts:
        return "No measurements of this stage yet: run the benchmark (`nox -s bench`) on a GPU.\n"
    return "\n".join(parts)
