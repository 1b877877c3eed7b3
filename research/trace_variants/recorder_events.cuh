// The first recorder (2026-11 to 2026-12-01), kept as an experiment variant so its cost can be measured
// again beside the boundary stamps that replaced it (time_recorders.py --variants current,events):
// one 16-byte record per event, each behind a uniform branch on the warp's kinds.
//
// The recorder behind the trace points of common/trace.cuh: force-included by the traced build
// (nvcc -DHOPATTN_TRACE -include trace_recorder.cuh), never by a stage, so it can change without
// changing any stage's sources. What it must not do is change the schedule it records. A record
// costs some twenty-five cycles of a warp's instruction stream, and a K/V step of a Hopper stage
// holds eight to ten events per warp, on the softmax's dependency chain. So a record is only made
// where it is needed:
//
//   - which event kinds a warp records is the host's choice, per warp (a bit mask, read once at the
//     start: every kind, only a step's QK (to time the steps with one record each), or none (to
//     time the trace points alone)); an event a warp does not record costs its start's clock read
//     and one branch;
//   - each warp records its first `capacity` events (the host's choice too): the output tiles
//     the timeline's window needs, not the whole launch;
//   - the buffers' addresses sit in the constant bank (read as an operand: no load, no register);
//     the clock reads are volatile (they stay in order with the stage's own asm: wgmma, mbarrier
//     waits) but clobber no memory, so the compiler keeps every value it holds in registers;
//   - a record is one 16-byte store by lane 0.
#pragma once
#define HOPATTN_TRACE_RECORDER

#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

enum TraceEvent : uint32_t {
    kload_q = 1, kload_k, kload_v, kload_kv,             // copies issued (TMA, cp.async) or plain loads done
    kwait_q, kwait_k, kwait_v, kwait_kv,                 // waiting for data to land
    kwait_empty,                                         // the producer waits for a free buffer
    kwait_turn,                                          // a consumer waits for its pingpong turn
    kwait_tile,                                          // waiting for the next tile id (tile-id ring)
    kqk, kwait_qk, ksoftmax, krescale, kpv, kwait_pv,    // the GEMMs (issue, then wait to retire), the softmax
    kepilogue, kstore,                                   // normalise and stage O; write it out
    kevent_count
};

constexpr int TRACE_CAPACITY = 4096;  // room per warp; the host's `capacity` may use less

// One record: 16 bytes: event | tile << 8 (tile may be -1), the K/V step (-1: none), and the low
// 32 bits of clock64 at its start and its end. Where a record sits says whose it is:
// [slot][warp][record]. The host unwraps the clock against the slot's full base clock (a kernel
// runs far less than 2^32 cycles).
struct TraceTarget {
    uint4* events;            // [max_ctas][warps][TRACE_CAPACITY]
    unsigned long long* base; // [max_ctas][2]: clock64 and %globaltimer (ns) when the CTA started
    uint32_t* info;           // [max_ctas][2]: linear block index, SM
    uint32_t* control;        // [0] the next free slot (zeroed before each launch), [1] records per warp
                              // (at most TRACE_CAPACITY), [2 + w] the event kinds warp w records (bit e)
    int max_ctas, warps, target_sm;
};
__constant__ TraceTarget g_trace;

__device__ __forceinline__ uint32_t trace_now() {
    unsigned long long t;  // clock64, of which the low word is kept: one CS2R.32 (%clock is slower)
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
    return uint32_t(t);
}

// Per warp: the records [next, end) it may still write and the event kinds it records (bit e:
// event e), the same in all 32 lanes. They are broadcast from lane 0 with a shuffle, which tells
// the compiler they are warp-uniform: it keeps them in uniform registers, and the test of an
// event is one uniform branch. All lanes store the same record to the same address: one write.
struct TraceWarp {
    int next = 0, end = 0;
    uint32_t kinds = 0;
};

// Thread 0 claims a slot when the CTA runs on the target SM; the slot reaches the other threads
// through shared memory (this barrier exists in the traced build only).
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
    const int slot = __shfl_sync(0xffffffffu, *shared_slot, 0);
    const int warp = __shfl_sync(0xffffffffu, int(threadIdx.x / 32), 0);
    TraceWarp w;
    if (slot >= 0 && warp < g_trace.warps) {
        w.next = (slot * g_trace.warps + warp) * TRACE_CAPACITY;
        w.end = w.next + min(int(g_trace.control[1]), TRACE_CAPACITY);
        w.kinds = __shfl_sync(0xffffffffu, g_trace.control[2 + warp], 0);
    }
    return w;
}

// The end of an event: its record, when this warp records the kind and has room left. Written in
// PTX for its branch: `bra.uni` (the test is the same in every lane) lets the compiler skip the
// record with one branch, where left to itself it predicates all of it and a skipped record
// costs as many cycles as a kept one.
template <uint32_t EVENT>
__device__ __forceinline__ void trace_end(TraceWarp& w, int tile, int kv, uint32_t start, bool instant) {
    asm volatile(
        "{\n"
        ".reg .pred skip;\n"
        ".reg .b32 t, meta;\n"
        ".reg .b64 at;\n"
        "and.b32 t, %1, %3;\n"
        "setp.eq.u32 skip, t, 0;\n"
        "@skip bra.uni TRACE_SKIP;\n"
        "mov.u32 t, %%clock;\n"
        "shl.b32 meta, %5, 8;\n"
        "or.b32 meta, meta, %4;\n"
        "mad.wide.s32 at, %0, 16, %8;\n"
        "st.global.v4.b32 [at], {meta, %6, %7, t};\n"
        "add.s32 %0, %0, 1;\n"
        "setp.ge.s32 skip, %0, %2;\n"
        "@skip mov.b32 %1, 0;\n"
        "TRACE_SKIP:\n"
        "}\n"
        : "+r"(w.next), "+r"(w.kinds)
        : "r"(w.end), "n"(1u << EVENT), "n"(EVENT), "r"(tile), "r"(kv), "r"(start), "l"(g_trace.events));
}

// The start of each open event, one element per event kind: indexed by constants only, so each
// element the kernel uses is a register while its event is open, and the rest do not exist.
#define TRACE_INIT()                                        \
    __shared__ int trace_slot_shared_;                       \
    TraceWarp trace_warp_ = trace_init(&trace_slot_shared_); \
    uint32_t trace_start_[kevent_count]
#define TRACE_BEGIN(event) trace_start_[k##event] = trace_now()
#define TRACE_END(event, tile, kv) trace_end<k##event>(trace_warp_, (tile), (kv), trace_start_[k##event], false)
#define TRACE_MARK(event, tile, kv) trace_end<k##event>(trace_warp_, (tile), (kv), trace_now(), true)

// Host: where the next launch records to (the binding calls it before a traced launch), and the
// capacity the buffers must have.
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
