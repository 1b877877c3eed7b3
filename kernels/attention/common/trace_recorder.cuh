// The recorder behind the trace points of common/trace.cuh: force-included by the traced build
// (nvcc -DHOPATTN_TRACE -include trace_recorder.cuh), never by a stage, so it can change without
// changing any stage's sources. What it must not do is change the schedule it records; so each
// event costs as little as the record allows:
//
//   - the buffers' addresses sit in the constant bank (read as an operand: no load, no register);
//   - the clock reads are volatile (they stay in order with the stage's own asm: wgmma, mbarrier
//     waits) but clobber no memory, so the compiler keeps every value it holds in registers;
//   - a record is one 16-byte store by lane 0, guarded by one comparison.
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

constexpr int TRACE_CAPACITY = 4096;  // records per warp: the first ones of the launch

// One record: 16 bytes: event | tile << 8 (tile may be -1), the K/V step (-1: none), and the low
// 32 bits of clock64 at its start and its end. Where a record sits says whose it is:
// [slot][warp][record]. The host unwraps the clock against the slot's full base clock (a kernel
// runs far less than 2^32 cycles).
struct TraceTarget {
    uint4* events;            // [max_ctas][warps][TRACE_CAPACITY]
    unsigned long long* base; // [max_ctas][2]: clock64 and %globaltimer (ns) when the CTA started
    uint32_t* info;           // [max_ctas][2]: linear block index, SM
    uint32_t* slots;          // the next free slot (zeroed before the launch)
    int max_ctas, warps, target_sm;
};
__constant__ TraceTarget g_trace;

__device__ __forceinline__ uint32_t trace_now() {
    unsigned long long t;  // clock64, of which the low word is kept: one CS2R.32 (%clock is slower)
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
    return uint32_t(t);
}

// Per thread: the records [next, end) this thread may still write. Lane 0 of a traced warp owns
// its warp's region; every other thread has next == end, so the guard is one comparison.
struct TraceWarp {
    int next = 0, end = 0;
};

// Thread 0 claims a slot when the CTA runs on the target SM; the slot reaches the other threads
// through shared memory (this barrier exists in the traced build only).
__device__ __forceinline__ TraceWarp trace_init(int* shared_slot) {
    if (threadIdx.x == 0) {
        uint32_t sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        int slot = -1;
        if (int(sm) == g_trace.target_sm) {
            slot = int(atomicAdd(g_trace.slots, 1u));
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
    if (slot >= 0 && threadIdx.x % 32 == 0) {
        w.next = (slot * g_trace.warps + int(threadIdx.x / 32)) * TRACE_CAPACITY;
        w.end = w.next + TRACE_CAPACITY;
    }
    return w;
}

__device__ __forceinline__ void trace_record(TraceWarp& w, uint32_t event, int tile, int kv, uint32_t start,
                                             uint32_t end) {
    if (w.next < w.end) g_trace.events[w.next++] = make_uint4(event | (uint32_t(tile) << 8), uint32_t(kv), start, end);
}

// The start of each open event, one element per event kind: indexed by constants only, so each
// element the kernel uses is a register while its event is open, and the rest do not exist.
#define TRACE_INIT()                                        \
    __shared__ int trace_slot_shared_;                       \
    TraceWarp trace_warp_ = trace_init(&trace_slot_shared_); \
    uint32_t trace_start_[kevent_count]
#define TRACE_BEGIN(event) trace_start_[k##event] = trace_now()
#define TRACE_END(event, tile, kv) \
    trace_record(trace_warp_, k##event, (tile), (kv), trace_start_[k##event], trace_now())
#define TRACE_MARK(event, tile, kv)                                             \
    do {                                                                        \
        const uint32_t trace_t_ = trace_now();                                  \
        trace_record(trace_warp_, k##event, (tile), (kv), trace_t_, trace_t_); \
    } while (0)

// Host: where the next launch records to (the binding calls it before a traced launch), and the
// capacity the buffers must have.
extern "C" __attribute__((visibility("default"))) int hopattn_trace_capacity() { return TRACE_CAPACITY; }
extern "C" __attribute__((visibility("default"))) int hopattn_trace_setup(void* events, void* base, void* info,
                                                                          void* slots, int max_ctas, int warps,
                                                                          int target_sm, char* err, int errlen) {
    const TraceTarget t{static_cast<uint4*>(events), static_cast<unsigned long long*>(base),
                        static_cast<uint32_t*>(info), static_cast<uint32_t*>(slots), max_ctas, warps, target_sm};
    const cudaError_t status = cudaMemcpyToSymbol(g_trace, &t, sizeof(t));
    if (status != cudaSuccess) {
        snprintf(err, errlen, "trace setup failed: %s", cudaGetErrorString(status));
        return 1;
    }
    return 0;
}
