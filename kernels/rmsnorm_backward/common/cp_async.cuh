// cp.async: asynchronous 16-byte copies from global to shared memory, with zero fill (sm_80
// instructions). Introduced by the RMSNorm backward's stage 05 (the next row's x and dy, copied while
// the current row is reduced).
//
// A thread issues copies, closes them into a group with commit, and later waits until at most N of
// its groups are still in flight. The wait covers only the calling thread's copies: a thread that
// reads back only what it copied itself needs no barrier.
#pragma once

#include <cstdint>

// 16 bytes at gmem into smem, of which the first src_bytes (0 ... 16) are read and the rest are
// zeros: a vector that ends past a row's last element, or lies wholly past it (src_bytes 0: nothing
// is read).
__device__ __forceinline__ void cp_async_16_zfill(void* smem, const void* gmem, int src_bytes) {
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    // .cg: cache in L2 only; each row is read once, from shared memory afterwards.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
