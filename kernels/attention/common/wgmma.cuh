// wgmma: warpgroup matrix multiply-accumulate with operands in shared memory (sm_90a only).
// Introduced by stage 08 and shared by the later wgmma stages.
//
// A warpgroup (four consecutive warps, the first a multiple of 4) issues one wgmma.mma_async
// together: D (64 x N, fp32, in registers) = A (64 x 16) · B (16 x N) [+ D]. A and B are read by the
// tensor cores straight from shared memory, described by 64-bit matrix descriptors. The
// instruction is asynchronous: wgmma_fence() before the first one (after the accumulator
// registers were last touched by ordinary instructions), wgmma_commit() to close a group, and
// wgmma_wait<N>() until at most N groups are in flight before reading the accumulators.
//
// Accumulator layout (per warp w of the warpgroup, lane l; the mma.sync m16n8 layout repeated):
// d[4j + 0..1] = row 16w + l/4,     columns 8j + 2(l%4) and +1;
// d[4j + 2..3] = row 16w + l/4 + 8, the same columns.
#pragma once

#include <cstdint>

// Matrix descriptor for a tile stored with the 128-byte swizzle (as TMA writes it with
// CU_TENSOR_MAP_SWIZZLE_128B): 8-row x 128-byte swizzle atoms of 1024 bytes, which must start at
// multiples of 1024 bytes (then the "base offset" field is 0).
//   bits  0-13  start address >> 4 (shared::cta address of the first element the instruction reads)
//   bits 16-29  leading-dimension byte offset >> 4 (LBO)
//   bits 32-45  stride-dimension byte offset >> 4 (SBO)
//   bits 49-51  base offset (0)
//   bits 62-63  layout: 1 = 128-byte swizzle
// K-major operand (the 16 k-values of a row are contiguous, 32 of a row's 128 bytes): SBO = 1024,
//   the distance between 8-row groups; LBO is unused and set to 1 (16 bytes). The k-step inside a
//   128-byte row is chosen by adding 32 bytes per 16 k to the start address.
// MN-major operand (rows are k, the M/N index is contiguous; needs the transpose bit): SBO = 1024,
//   the distance between 8-row groups along k; LBO = the distance between 64-element blocks
//   along M/N (the next 128-byte-wide box).
__host__ __device__ constexpr uint64_t make_smem_desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
    return static_cast<uint64_t>((smem_addr >> 4) & 0x3fff) |
           (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3fff) << 16) |
           (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3fff) << 32) |
           (static_cast<uint64_t>(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Tells the compiler that the accumulators may have changed here (after a wait), so that it does
// not move reads of them above the wait.
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[N]) {
    #pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// wgmma with A and B from shared memory; `accumulate` 0 overwrites D, 1 adds to it. TRANS_B = 0:
// B is K-major (B[k][n] at row n, column k: a K tile used as Kᵀ); TRANS_B = 1: B is MN-major
// (row k, column n: a V tile).
// D (64 x 64 fp32, 32 registers per thread) = A (64 x 16) · B (16 x 64) [+ D], both from shared memory.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n64k16_bf16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7,"
        "%8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23,"
        "%24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1, 0, %35;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}

// D (64 x 128 fp32, 64 registers per thread) = A (64 x 16) · B (16 x 128) [+ D], both from shared memory.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n128k16_bf16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7,"
        "%8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23,"
        "%24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39,"
        "%40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55,"
        "%56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p, 1, 1, 0, %67;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}
