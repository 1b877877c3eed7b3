"""The overview page (index.md): the climb first (chart, then the lineage table), the users' shapes,
where the numbers come from, how to read a stage page, and the compiler at a glance."""

from __future__ import annotations

from ..benchmark_section.tables import md_cell
from .stage import GENERATED, stage_title

FRONT = "---\nhide:\n  - toc\n---\n\n"
READING_GUIDE = """\
Each stage is one complete kernel that differs from the one before it by one optimization. Its
page (for example [{first}](stages/{first_name}.md)) opens with that change, its numbers at 8k and
the figure that shows the change; then the prose, and the same sections in the same order, each
with a stable link you can share:

- [`#diagrams`](stages/{first_name}.md#diagrams): memory movement and the warp roles of that
  stage, drawn from its `stage.toml` (a picture that did not change says so and links the stage
  where it last did), and its timeline: what every warp of one SM did, recorded on the GPU by the
  stage's trace points, beside what the schedule model predicts.
- [`#diff`](stages/{first_name}.md#diff): the source against the previous stage, unified or side by
  side; unchanged stretches are folded, click to expand.
- [`#compiler`](stages/{first_name}.md#compiler): registers, spills, shared memory and instruction
  mix as `nvcc`/`ptxas` report them.
- [`#benchmark`](stages/{first_name}.md#benchmark): TFLOP/s per shape, with ratios to the reference
  peers timed in the same run (FlashAttention-3, FlashAttention-4, cuDNN: whichever ran) and to the
  previous stage; numbers measured on older sources are marked stale.

The [gallery](gallery.md) shows every distinct diagram as a grid, by kind and stage, and puts a
stage beside its predecessor.{more}
"""


BACKWARD = """\
Act V is the backward pass: the gradients dQ, dK and dV, built the same way, one change per stage,
from a FlashAttention-2-style baseline. Its pages, at `/backward/NN-slug/` (for example
[{first}](backward/{first_name}.md)), have the same sections and anchors; their figures show where
the operands of the five GEMMs live and how dQ is summed over the key blocks. TFLOP/s count the
backward alone, 2.5 times the forward's FLOPs, against the backwards of FlashAttention-4, cuDNN and
FlashAttention-2 timed in the same run.
"""


PART_II = """\
Part II turns to the other half of a transformer's kernels, the memory-bound ones, on the same
generator: [RMSNorm](rmsnorm/index.md) first, a lineage of {n} stage{s} from a row per thread to a
cluster per row reduced through distributed shared memory, each at `/rmsnorm/NN-slug/` with the same
sections and anchors. Their figures show who holds which bytes of a row, the reduction tree and the
bytes per element; their numbers are GB/s against the copy ceiling timed in the same run.
"""


def index_page(stages, *, numbers_md: str, chart: str | None, environment_md: str, compiler_md: str,
               gpu_name: str | None, reading_guide: str | None = None, users_md: str = "", head_dims_md: str = "",
               model_md: str = "", backward=(), backward_md: str = "", part_ii=()) -> str:
    act_v = (f" Its backward, [Act V](#backward), is a lineage of {len(backward)} stage"
             f"{'s' if len(backward) != 1 else ''} of its own.") if backward else ""
    parts = [
        FRONT,
        "# hopattn: attention on Hopper, one change at a time\n",
        GENERATED,
        (f"Forward attention (bf16, head dim 128) for NVIDIA Hopper, built as a lineage of "
         f"{len(stages)} stage{'s' if len(stages) != 1 else ''}: each a complete kernel, each one "
         f"optimization on top of the last. [Real models](models.md) call the last one.{act_v}\n"),
        "## The climb {#progression}\n",
    ]
    if chart:
        parts.append(chart + "\n")
    else:
        parts.append("The chart appears once there are measurements.\n")
    parts.append("## The lineage at a glance {#lineage}\n")
    if numbers_md:
        parts.append(f"Numbers from {gpu_name}.\n\n" + numbers_md)
    else:
        parts.append("| Stage | The one change |\n|---|---|")
        parts += [f"| [{stage_title(s)}](stages/{s.name}.md) | {md_cell(s.change)} |" for s in stages]
        parts.append("\nNo measurements yet: run the benchmark (`nox -s bench`) on a GPU to fill in the numbers.\n")
    if users_md:
        parts.append("## The shapes users run {#users-shapes}\n")
        parts.append("Beyond 4k, 8k and 16k: a single long sequence, short sequences in a large batch, odd lengths, "
                     "few queries over many keys, BSHD input and grouped-query heads, for the stages with the whole "
                     "contract (any length, BSHD, causal) and the reference peers.\n\n" + users_md)
    if head_dims_md:
        parts.append("## Every head dim {#head-dims}\n")
        parts.append("Head dims 64, 96, 128, 192 (Q and K; V 128, DeepSeek's MLA prefill) and 256, at H·D = 2048 as "
                     "in the FlashAttention-3 paper, for the stages that serve them (stage 24 on; earlier stages "
                     "serve 128) and the reference peers. TFLOP/s = 2·B·H·Lq·Lk·(D + Dv) / time, halved for "
                     "causal.\n\n" + head_dims_md)
    if backward:
        parts.append("## Act V: the backward pass {#backward}\n")
        parts.append(BACKWARD.format(first=f"Backward {backward[0].id} · {backward[0].title.split(':')[0]}",
                                     first_name=backward[0].name))
        parts.append(backward_md)
    if part_ii:
        parts.append("## Part II: memory-bound kernels {#part-ii}\n")
        parts.append(PART_II.format(n=len(part_ii), s="s" if len(part_ii) != 1 else ""))
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
