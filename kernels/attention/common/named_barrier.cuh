// Named barriers: the CTA's sixteen hardware barriers (ids 0-15), used between two warpgroups
// with an explicit thread count instead of the whole CTA (sm_70+; the stages use them from 12 on).
// Introduced by stage 12 (pingpong) and shared by the later stages that order their consumer
// warpgroups.
//
// `__syncthreads()` is barrier 0 with every thread of the CTA. A named barrier with a count N
// (a multiple of 32) completes a phase once N threads have arrived, counted a warp at a time: a
// warp executing bar.sync or bar.arrive adds its 32 threads. bar.sync arrives and waits for the
// phase to complete; bar.arrive arrives and goes on. So a barrier with N = 256 on which one
// warpgroup syncs and another arrives is a one-way signal: "the arriving warpgroup has got this
// far" — the syncing warpgroup cannot pass before it. Once the phase completes the barrier resets
// for the next one; no parity is involved, so each phase must get exactly its N arrivals (an extra
// warpgroup's arrival would complete a phase without the waiter and shift every later one).
//
// Both instructions are .aligned: every thread of a warp executes the same one (the stages call
// them from warpgroup-uniform code). bar.sync also orders memory among the participants; the
// stages do not rely on that (they only order instruction issue).
#pragma once

#include <cstdint>

// Arrive at barrier `id` and wait until THREADS threads have arrived (this warp's 32 included).
template <int THREADS>
__device__ __forceinline__ void named_barrier_sync(uint32_t id) {
    static_assert(THREADS % 32 == 0, "named barriers count whole warps");
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory");
}

// Arrive at barrier `id` (of THREADS threads) without waiting: a signal to the warps that sync on it.
template <int THREADS>
__device__ __forceinline__ void named_barrier_arrive(uint32_t id) {
    static_assert(THREADS % 32 == 0, "named barriers count whole warps");
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory");
}
