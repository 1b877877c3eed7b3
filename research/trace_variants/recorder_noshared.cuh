// Diagnostic: recorder_ncpred.cuh with the slot broadcast through barrier reductions (no static
// shared variable).
#pragma once
#include "recorder_ncpred.cuh"
__device__ __forceinline__ TraceWarp trace_init_nosmem() {
    int claimed = 0;  // slot + 1 (0: none), thread 0's
    if (threadIdx.x == 0) {
        uint32_t sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        if (int(sm) == g_trace.target_sm) {
            const int slot = int(atomicAdd(g_trace.control, 1u));
            if (slot < g_trace.max_ctas) claimed = slot + 1;
        }
    }
    int got = 0;
    for (int bit = 0; bit < 4; ++bit) got |= __syncthreads_or(claimed >> bit & 1) << bit;
    const int slot = got - 1;
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
#define TRACE_INIT()                               \
    TraceWarp trace_warp_ = trace_init_nosmem(); \
    uint32_t trace_start_[kevent_count]
