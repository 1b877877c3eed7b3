// Single-instruction wrappers that stages 06-22 each carried a copy of in their kernel.cu: the
// 2^x of the softmax, the bf16x2 rounding of P and of O, and a 32-bit shared-memory load (the
// tile-id ring). Introduced by stage 23, which is the first to include them (the earlier stages
// keep their own copies, so their sources and their machine code stay as measured).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

// Two floats rounded into one bf16x2 register (one cvt instruction); `lo` goes to the lower half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 pair = __float22bfloat162_rn(make_float2(lo, hi));
    return *reinterpret_cast<uint32_t*>(&pair);
}

// 2^x on the special-function unit (MUFU.EX2); flushes denormal results to zero.
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// One 32-bit load from shared memory at a byte address.
__device__ __forceinline__ int ld_shared_s32(uint32_t addr) {
    int value;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(value) : "r"(addr) : "memory");
    return value;
}
