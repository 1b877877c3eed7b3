// Warp-level tensor-core helpers (sm_80 instructions; they also run on Hopper and Blackwell).
// Introduced by stage 01 and shared, unchanged, by every stage that issues mma.sync.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

// D = A·B + D for one 16x8x16 tile: A is 16x16 bf16 (row-major fragments, 4 registers of bf16x2),
// B is 16x8 bf16 ("col" fragments, 2 registers), D is 16x8 fp32 (4 registers).
//
// Fragment ownership, with group = lane / 4 and quad = lane % 4:
//   A: a[0] = row group,   cols 2*quad..+1   a[1] = row group+8, cols 2*quad..+1
//      a[2] = row group,   cols 2*quad+8..+9 a[3] = row group+8, cols 2*quad+8..+9
//   B: b[0] = k rows 2*quad..+1 of column group, b[1] = k rows 2*quad+8..+9 of column group
//   D: d[0..1] = row group, cols 2*quad..+1;  d[2..3] = row group+8, cols 2*quad..+1
__device__ __forceinline__ void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// A row of a 16-row fragment is spread over the 4 threads of a quad: reduce across them.
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
