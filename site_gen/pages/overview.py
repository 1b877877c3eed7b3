"""The overview page (index.md): the lineage with its numbers, the progression chart, where the
numbers come from, how to read a stage page, and the compiler at a glance."""

from __future__ import annotations

from ..benchmark_section.tables import md_cell
from .stage import GENERATED, stage_title

READING_GUIDE = """\
Each stage is one complete kernel that differs from the one before it by one optimization. Its
page (for example [{first}](stages/{first_name}.md)) has the same sections in the same order, each
with a stable link you can share:

- **The one change** and the prose: why this step, and what to look for.
- [`#diagrams`](stages/{first_name}.md#diagrams): memory movement, the warp roles and the
  tensor-core pipeline timeline of that stage, drawn from its `stage.toml`.
- [`#diff`](stages/{first_name}.md#diff): the source against the previous stage, unified or side by
  side; unchanged stretches are folded, click to expand.
- [`#compiler`](stages/{first_name}.md#compiler): registers, spills, shared memory and instruction
  mix as `nvcc`/`ptxas` report them.
- [`#benchmark`](stages/{first_name}.md#benchmark): TFLOP/s per shape, with ratios to
  FlashAttention-4, cuDNN and the previous stage; numbers measured on older sources are marked
  stale.

The [gallery](gallery.md) shows every diagram in one place.{more}
"""


def index_page(stages, *, numbers_md: str, chart: str | None, environment_md: str, compiler_md: str,
               gpu_name: str | None, reading_guide: str | None = None, model_md: str = "") -> str:
    parts = [
        "# hopattn: attention on Hopper, one change at a time\n",
        GENERATED,
        (f"Forward attention (bf16, head dim 128) for NVIDIA Hopper, built as a lineage of "
         f"{len(stages)} stage{'s' if len(stages) != 1 else ''}: each a complete kernel, each one "
         "optimization on top of the last.\n"),
        "## The lineage at a glance {#lineage}\n",
    ]
    if numbers_md:
        parts.append(f"Numbers from {gpu_name}.\n\n" + numbers_md)
    else:
        parts.append("| Stage | The one change |\n|---|---|")
        parts += [f"| [{stage_title(s)}](stages/{s.name}.md) | {md_cell(s.change)} |" for s in stages]
        parts.append("\nNo measurements yet: run the benchmark (`nox -s bench`) on a GPU to fill in the numbers.\n")
    parts.append("## Progression {#progression}\n")
    if chart:
        parts.append(chart + "\n")
    else:
        parts.append("The chart appears once there are measurements.\n")
    if model_md:  # site_gen/benchmark_section/model_vs_measured.py
        parts += ["## The model against the GPU {#model}\n", model_md]
    parts.append("## Where the numbers come from {#environment}\n")
    parts.append(environment_md or "No benchmark runs recorded yet.\n")
    parts.append("## How to read a stage page {#reading-guide}\n")
    if stages:
        more = f" The [reading guide]({reading_guide}) goes further." if reading_guide else ""
        parts.append(READING_GUIDE.format(first=stage_title(stages[0]), first_name=stages[0].name, more=more))
    parts.append("## Compiler at a glance {#compiler}\n")
    parts.append(compiler_md)
    return "\n".join(parts)
