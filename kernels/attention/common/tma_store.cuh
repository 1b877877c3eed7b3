// TMA store: a box of shared memory written to a global tensor by the copy engine (sm_90).
// Introduced by stage 15 (TMA-store epilogue) for the output tile.
//
// The load direction (tma.cuh) completes on an mbarrier; the store direction has no barrier.
// Instead every thread has its own queue of "bulk async-groups": the stores it has issued since
// its last commit_group form one group, and wait_group N blocks the thread until at most N of its
// groups are still pending. `.read` waits only until the copy engine has finished *reading* shared
// memory — enough to overwrite the staging buffer — not until the writes are visible in global
// memory. Groups are per thread: only the thread that issued the stores can wait for them.
//
// Shared memory written by ordinary stores (the generic proxy) and then read by the copy engine
// (the async proxy) needs fence.proxy.async.shared::cta (mbarrier.cuh) by the writing threads,
// and a barrier that orders those fences before the issuing thread's store.
#pragma once

#include <cstdint>
#include <cuda.h>  // CUtensorMap

// Copy the box at shared address `src` (laid out as the map's swizzle says) to the tensor at
// coordinates (col, row). Joins the issuing thread's current bulk async-group.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, uint32_t src, int col, int row) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
                 ::"l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(src)
                 : "memory");
}

// Close the issuing thread's current group of bulk copies.
__device__ __forceinline__ void bulk_commit_group() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Wait until at most N of this thread's bulk groups still read their shared-memory source.
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// Wait until at most N of this thread's bulk groups are pending at all (their writes done).
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// One 32-bit store to shared memory at a byte address (a 32-bit shared-window address, as the
// descriptors and TMA use).
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t value) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(value) : "memory");
}
