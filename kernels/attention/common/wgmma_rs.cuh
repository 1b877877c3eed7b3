// wgmma with the A operand in registers (sm_90a only): "RS" = A from Registers, B from Shared memory.
// Introduced by stage 09 and shared by the later wgmma stages; see wgmma.cuh for the descriptors,
// the fences and the accumulator layout.
//
// A (64 x 16, bf16) is spread over the warpgroup's 128 threads: four .b32 registers per thread, each
// two bf16 with the lower column in the lower half. Per warp w of the warpgroup and lane l (the
// layout of mma.sync m16n8k16's A fragment, one warp per 16 rows):
//   a0 = row 16w + l/4,     columns 2(l%4), +1        a2 = row 16w + l/4,     columns 8 + 2(l%4), +1
//   a1 = row 16w + l/4 + 8, columns 2(l%4), +1        a3 = row 16w + l/4 + 8, columns 8 + 2(l%4), +1
// This is the accumulator layout of wgmma.cuh restricted to 16 columns: the accumulators of
// columns 16k..16k+15 (d[8k .. 8k+7]), rounded pairwise to bf16x2, are the A operand of k-step k of
// the next product, with no data crossing threads.
//
// The registers are read asynchronously, like the accumulators: they must have been written
// before the wgmma_fence() that precedes the wgmma (ordinary instructions writing them after the
// fence is undefined behaviour), and must not be overwritten before wgmma_wait() has retired it.
#pragma once

#include <cstdint>

// Pins values computed by ordinary instructions (the A fragments) before the next asm volatile
// (the wgmma_fence): without it the compiler may sink their computation to just before the wgmma
// that reads them, past the fence.
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(uint32_t (&r)[N]) {
    #pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// D (64 x 128 fp32, 64 registers per thread) = A (64 x 16, four bf16x2 registers per thread) ·
// B (16 x 128, shared memory) [+ D]; `accumulate` 0 overwrites D, 1 adds to it. TRANS_B as in
// wgmma.cuh (1: B is MN-major, a V tile). There is no transpose bit for A: its layout is fixed.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n128k16_bf16_rs(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2,
                                                         uint32_t a3, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7,"
        "%8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23,"
        "%24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39,"
        "%40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55,"
        "%56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}
