// wgmma variants the backward adds to attention/common/wgmma.cuh (sm_90a only): an MN-major A
// operand, and a first k-step that only writes its accumulators. Introduced by backward stage 03
// and shared by the later backward stages; see attention/common/wgmma.cuh for the descriptors, the
// fences and the accumulator layout.
//
// The forward's wgmma always reads A K-major (a row of A is 16 contiguous k-values: Q or P by
// query). The backward's dQ = dS K wants A = dS with M = queries, but the consumer warpgroups hold
// dSᵀ (keys by queries) in registers; written to shared memory as it is held, a row of the tile is
// one key's 64 queries — A stored MN-major. For 16-bit types wgmma can read A that way ("imm-trans-a"
// set): no transposition in registers, no 2-byte stores.
#pragma once

#include <cstdint>

// D (64 x 64 fp32, 32 registers per thread) = A (64 x 16) · B (16 x 64) [+ D], A MN-major (rows are
// k, the M index contiguous), B as TRANS_B says (1: MN-major, a K tile read by key). `accumulate` 0
// overwrites D, 1 adds to it.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n64k16_bf16_ss_mn_a(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                             int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7,"
        "%8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23,"
        "%24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1, 1, %35;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}

// The first k-step of a product: D (64 x 64 fp32) = A (64 x 16) · B (16 x 64), D written, never read
// (scale-d 0 as an immediate, outputs "=f"). With the accumulating form and `accumulate` 0 the
// registers are still inputs of the instruction: a product whose accumulators are reused from step
// to step then keeps the last step's values alive into the next one, and ptxas moves registers
// around the chain and waits on the wgmmas in flight to do it (its C7517/C7519 remarks). TRANS_A,
// TRANS_B: 0 K-major, 1 MN-major (TRANS_A = 1 as above).
template <int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_m64n64k16_bf16_ss_first(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7,"
        "%8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23,"
        "%24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, 0, 1, 1, %34, %35;\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]),
          "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]),
          "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]),
          "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
        : "l"(desc_a), "l"(desc_b), "n"(TRANS_A), "n"(TRANS_B));
}
