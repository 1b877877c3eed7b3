// Shared implementation of the experimental trace recorders (research/trace_variants): a drop-in
// replacement for kernels/attention/common/trace_recorder.cuh, configured by the variant file that
// includes it (recorder_*.cuh), which defines
//
//   TV_GUARD   how a trace point decides whether to record:
//                TV_GUARD_KIND    uniform branch on (kinds & 1 << event), the kinds mask loop-invariant
//                TV_GUARD_WARP    uniform branch on one per-warp flag (records every kind or none)
//                TV_GUARD_CURSOR  uniform branch on cursor < end (idle warps start with cursor == end)
//                TV_GUARD_NONE    no branch: the store is predicated on the per-warp flag
//   TV_SATURATE 1: the cursor saturates (min(next + 16, last)): no capacity compare, overflowing
//               records rewrite the warp's last slot (index records-per-warp - 1); 0: exact (only
//               with TV_GUARD_CURSOR, where the guard is the capacity compare).
//
// Record format, buffers, host API and macros are those of trace_recorder.cuh. Every variant keeps
// the write address inside the warp's region [(slot * warps + warp) * TRACE_CAPACITY, + records
// per warp): the cursor is the low 32 bits of the slot's 64-bit address; the high word is loop-
// invariant, so the store is STG.E.128 [{lo, hi}] and advancing is one VIADD / VIADDMNMX. Should a
// region straddle a 4 GiB boundary (the high word changes inside it), it is cut at the boundary.
#pragma once
#define HOPATTN_TRACE_RECORDER

#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

#define TV_GUARD_KIND 1
#define TV_GUARD_WARP 2
#define TV_GUARD_CURSOR 3
#define TV_GUARD_NONE 4
#ifndef TV_GUARD
#error "define TV_GUARD before including recorder_impl.cuh"
#endif
#ifndef TV_SATURATE
#define TV_SATURATE 1
#endif
#ifndef TV_UNIFORM
#define TV_UNIFORM 0
#endif
#if !TV_SATURATE && TV_GUARD == TV_GUARD_NONE
#error "an exact (non-saturating) cursor needs a guard branch"
#endif
#ifndef TV_LANE0
#define TV_LANE0 0  // 1: only lane 0 stores (the other lanes' store is predicated off)
#endif

enum TraceEvent : uint32_t {
    kload_q = 1, kload_k, kload_v, kload_kv,
    kwait_q, kwait_k, kwait_v, kwait_kv,
    kwait_empty,
    kwait_turn,
    kwait_tile,
    kqk, kwait_qk, ksoftmax, krescale, kpv, kwait_pv,
    kepilogue, kstore,
    kevent_count
};

constexpr int TRACE_CAPACITY = 4096;

struct TraceTarget {
    uint4* events;
    unsigned long long* base;
    uint32_t* info;
    uint32_t* control;
    int max_ctas, warps, target_sm;
};
__constant__ TraceTarget g_trace;

__device__ __forceinline__ uint32_t trace_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
    return uint32_t(t);
}

// Per warp, the same in all lanes (broadcast from lane 0): the cursor (low word of the next
// record's address), the high word, and `lim`: the last writable slot's low word (saturating) or
// one past it (exact). `on`: the kinds this warp records (KIND), or 0 / 1 (WARP, NONE).
struct TraceWarp {
    unsigned long long at = 0;  // the next record's address: {lo (the cursor), hi (loop-invariant)}
    uint32_t lim = 0, on = 0;
    uint32_t lane0 = 1;  // TV_LANE0: 1 in lane 0 only
};

__device__ __forceinline__ TraceWarp trace_init(int* shared_slot) {
    if (threadIdx.x == 0) {
        uint32_t sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        int slot = -1;
        if (int(sm) == g_trace.target_sm) {
            slot = int(atomicAdd(g_trace.control, 1u));
            if (slot >= g_trace.max_ctas) slot = -1;
        }
        if (slot >= 0) {
            unsigned long long clk, ns;
            asm volatile("mov.u64 %0, %%clock64;" : "=l"(clk));
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
            g_trace.base[2 * slot] = clk;
            g_trace.base[2 * slot + 1] = ns;
            g_trace.info[2 * slot] = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
            g_trace.info[2 * slot + 1] = sm;
        }
        *shared_slot = slot;
    }
    __syncthreads();
    TraceWarp w;
    const int slot = *shared_slot;
    const int warp = int(threadIdx.x / 32);
    uint32_t lo = 0, hi = 0, lim = 0, on = 0;
    if (slot >= 0 && warp < g_trace.warps) {
        const int records = min(int(g_trace.control[1]), TRACE_CAPACITY);
        const uint32_t kinds = g_trace.control[2 + warp];
        const unsigned long long first =
            reinterpret_cast<unsigned long long>(g_trace.events + size_t(slot * g_trace.warps + warp) * TRACE_CAPACITY);
        lo = uint32_t(first);
        hi = uint32_t(first >> 32);
        if (records > 0 && kinds != 0) {
            // the last slot, or the last one below a 4 GiB boundary inside the region
            unsigned long long last = first + 16ull * (records - 1);
            if (uint32_t(last >> 32) != hi) last = (first | 0xffffffffull) - 15ull;
#if TV_GUARD == TV_GUARD_KIND
            on = kinds;
#else
            on = 1;
#endif
            lim = TV_SATURATE ? uint32_t(last) : uint32_t(last) + 16u;  // exact: one past (no wrap: a
            // region ending exactly at a 4 GiB boundary is cut one slot short so the compare holds)
            if (!TV_SATURATE && lim == 0) lim -= 16u;
        } else {
            lim = lo;  // records nothing: the exact cursor starts at its end; saturating: pinned
        }
    }
    // Broadcast (the compiler then treats them as warp-uniform) or not: see TV_UNIFORM.
#if TV_UNIFORM
    lo = __shfl_sync(0xffffffffu, lo, 0);
    hi = __shfl_sync(0xffffffffu, hi, 0);
    lim = __shfl_sync(0xffffffffu, lim, 0);
    on = __shfl_sync(0xffffffffu, on, 0);
#endif
    w.at = (static_cast<unsigned long long>(hi) << 32) | lo;
    w.lim = lim;
    w.on = on;
#if TV_LANE0
    w.lane0 = (threadIdx.x & 31) == 0;
#endif
    return w;
}

// The record itself: clock, meta (tile << 8 | event: one LEA/VIADD), one 16-byte store to the
// address {lo, hi}, the cursor advanced. Operands: %0 the address, %1 on (the kinds, or the flag),
// %2 lim, %3 this thread stores (lane 0 only, TV_LANE0; else 1), %4 tile, %5 kv, %6 start; %7 EVENT
// and %8 its bit as immediates.
#if TV_SATURATE
#define TV_ADVANCE "add.u32 lo, lo, 16;\n min.u32 lo, lo, %2;\n"
#elif TV_GUARD == TV_GUARD_CURSOR
#define TV_ADVANCE "add.u32 lo, lo, 16;\n"
#else  // exact with a flag guard: the flag is cleared once the cursor reaches the end (as trace_recorder.cuh)
#define TV_ADVANCE "add.u32 lo, lo, 16;\n setp.ge.u32 skip, lo, %2;\n @skip mov.b32 %1, 0;\n"
#endif

#if TV_GUARD == TV_GUARD_KIND
#define TV_TEST "and.b32 t, %1, %8;\n setp.eq.u32 skip, t, 0;\n @skip bra.uni TRACE_SKIP;\n"
#elif TV_GUARD == TV_GUARD_WARP
#define TV_TEST "setp.eq.u32 skip, %1, 0;\n @skip bra.uni TRACE_SKIP;\n"
#elif TV_GUARD == TV_GUARD_CURSOR
#define TV_TEST "setp.ge.u32 skip, lo, %2;\n @skip bra.uni TRACE_SKIP;\n"
#else
#define TV_TEST ""
#endif

#if TV_GUARD == TV_GUARD_NONE
#define TV_STORE "setp.ne.u32 st, %1, 0;\n" TV_STORE_LANE "@st st.global.v4.b32 [%0], {meta, %5, %6, t};\n"
#else
#define TV_STORE TV_STORE_LANE0 "st.global.v4.b32 [%0], {meta, %5, %6, t};\n"
#endif
#if TV_LANE0
#define TV_STORE_LANE "setp.ne.and.u32 st, %3, 0, st;\n"
#define TV_STORE_LANE0 "setp.ne.u32 st, %3, 0;\n @st "
#else
#define TV_STORE_LANE ""
#define TV_STORE_LANE0 ""
#endif

template <uint32_t EVENT>
__device__ __forceinline__ void trace_end(TraceWarp& w, int tile, int kv, uint32_t start) {
    asm volatile(
        "{\n"
        ".reg .pred skip, st;\n"
        ".reg .b32 t, meta, lo, hi;\n"
        "mov.b64 {lo, hi}, %0;\n"
        TV_TEST
        "mov.u32 t, %%clock;\n"
        "mad.lo.u32 meta, %4, 256, %7;\n"
        TV_STORE
        TV_ADVANCE
        "mov.b64 %0, {lo, hi};\n"
        "TRACE_SKIP:\n"
        "}\n"
        : "+l"(w.at), "+r"(w.on)
        : "r"(w.lim), "r"(w.lane0), "r"(tile), "r"(kv), "r"(start), "n"(EVENT), "n"(1u << EVENT));
}

#define TRACE_INIT()                                        \
    __shared__ int trace_slot_shared_;                       \
    TraceWarp trace_warp_ = trace_init(&trace_slot_shared_); \
    uint32_t trace_start_[kevent_count]
#define TRACE_BEGIN(event) trace_start_[k##event] = trace_now()
#define TRACE_END(event, tile, kv) trace_end<k##event>(trace_warp_, (tile), (kv), trace_start_[k##event])
#define TRACE_MARK(event, tile, kv) trace_end<k##event>(trace_warp_, (tile), (kv), trace_now())

extern "C" __attribute__((visibility("default"))) int hopattn_trace_capacity() { return TRACE_CAPACITY; }
extern "C" __attribute__((visibility("default"))) int hopattn_trace_setup(void* events, void* base, void* info,
                                                                          void* control, int max_ctas, int warps,
                                                                          int target_sm, char* err, int errlen) {
    const TraceTarget t{static_cast<uint4*>(events), static_cast<unsigned long long*>(base),
                        static_cast<uint32_t*>(info), static_cast<uint32_t*>(control), max_ctas, warps, target_sm};
    const cudaError_t status = cudaMemcpyToSymbol(g_trace, &t, sizeof(t));
    if (status != cudaSuccess) {
        snprintf(err, errlen, "trace setup failed: %s", cudaGetErrorString(status));
        return 1;
    }
    return 0;
}
