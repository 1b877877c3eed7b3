// cp.async: asynchronous 16-byte copies from global to shared memory (sm_80 instructions).
// Introduced by stage 05 and shared, unchanged, by the later cp.async stages.
//
// A thread issues copies, closes them into a group with commit, and later waits until at most N of
// its groups are still in flight. The wait covers only the calling thread's copies: a barrier
// afterwards makes every thread's copies visible to the whole CTA.
#pragma once

#include <cstdint>

__device__ __forceinline__ void cp_async_16(uint32_t smem_dst, const void* gmem_src) {
    // .cg: cache in L2 only; the tile is read once per CTA from shared memory afterwards.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_dst), "l"(gmem_src) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
