// Diagnostic: recorder_ncpred.cuh with a slot claim whose cursor comes without shuffles.
#pragma once
#include "recorder_ncpred.cuh"
__device__ __forceinline__ TraceWarp trace_init_noshfl(int* shared_slot) {
    if (threadIdx.x == 0) {
        uint32_t sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        int slot = -1;
        if (int(sm) == g_trace.target_sm) {
            slot = int(atomicAdd(g_trace.control, 1u));
            if (slot >= g_trace.max_ctas) slot = -1;
        }
        *shared_slot = slot;
    }
    __syncthreads();
    const int slot = *shared_slot;
    const int warp = int(threadIdx.x / 32);
    TraceWarp w;
    if (slot >= 0 && warp < g_trace.warps) {
        w.next = (slot * g_trace.warps + warp) * TRACE_CAPACITY;
        w.end = threadIdx.x % 32 == 0 ? w.next + min(int(g_trace.control[1]), TRACE_CAPACITY) : w.next;
        w.kinds = g_trace.control[2 + warp];
    }
    return w;
}
#undef TRACE_INIT
#define TRACE_INIT()                                               \
    __shared__ int trace_slot_shared_;                              \
    TraceWarp trace_warp_ = trace_init_noshfl(&trace_slot_shared_); \
    uint32_t trace_start_[kevent_count]
