"""Concept diagrams, and the one table that says which stage introduces which concept.

A concept whose stage does not exist (yet) is not emitted. Each builder takes (stage, stages) and
returns a Diagram whose id is "c-<slug>" so that it is unique across the site.
"""

from __future__ import annotations

from .. import head_dims
from . import attention, basics, hopper, machine, scheduling

# stage number -> concept builder, in page order.
CONCEPTS = (
    (1, basics.online_softmax),
    (1, basics.mma_fragments),
    (2, basics.shared_tiles),
    (3, basics.ldmatrix_lanes),
    (4, basics.swizzle_banks),
    (5, basics.cp_async_double_buffer),
    (6, basics.exp2_ffma),
    (7, hopper.tma_box),
    (8, hopper.wgmma_descriptors),
    (9, hopper.register_p),
    (10, hopper.two_consumers),
    (11, hopper.mbarrier_ring),
    (12, hopper.pingpong),
    (13, hopper.intra_overlap),
    (14, scheduling.persistent_tiles),
    (15, scheduling.tma_store),
    (16, scheduling.tile_shape),
    (17, scheduling.causal_map),
    (18, scheduling.longest_first),
    (19, hopper.descriptor_offsets),
    (20, attention.gqa_heads),
    (21, attention.deferred_max),
    (22, scheduling.tile_coordinates),
    (24, head_dims.head_dim_tiles),
)

# The hand-written pages' own figures (docs/<page>), in page order; they belong to no one stage.
DOC_CONCEPTS = (
    ("introduction.md", attention.attention_shapes),
    ("introduction.md", attention.naive_vs_fused),
    ("introduction.md", attention.intensity),
    ("introduction.md", attention.tiling),
    ("hopper.md", machine.h200_chip),
    ("hopper.md", machine.sm_anatomy),
    ("hopper.md", machine.warpgroups),
    ("hopper.md", machine.memory_hierarchy),
    ("hopper.md", machine.tile_budget),
)


def concepts_for(stage, stages) -> list:
    return [build(stage, stages) for number, build in CONCEPTS if number == stage.number]


def doc_concepts(stages) -> list:
    return [build(stages) for _page, build in DOC_CONCEPTS]
