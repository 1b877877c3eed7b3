// The recorder behind the trace points of common/trace.cuh: force-included by the traced build
// (nvcc -DHOPATTN_TRACE -include trace_recorder.cuh), never by a stage, so it can change without
// changing any stage's sources. What it must not do is change the schedule it records. A K/V step
// of a Hopper stage holds eight to ten events per warp, on the softmax's dependency chain, and the
// loop is bound by its instruction stream: a 16-byte record per event, each behind a branch, cost
// stages 08-21 +4 to +29 %, most of them +12 to +18 % (research/trace_variants/recorder_events.cuh
// keeps that recorder). So:
// (What is left is mostly the clock reads themselves, one per event of a K/V step: ptxas keeps the
// code on either side of each where it is, and they alone, storing nothing, cost stages 16-22
// about 7-11 %; and any record outside the loop makes ptxas build stage 15's loop differently,
// +16-22 %. The method page's "What the overhead is made of" has the measurements;
// research/trace_variants the recorders tried.)
//
//   - a K/V step's events are boundary stamps. TRACE_BEGIN of a step event reads no clock; its
//     TRACE_END reads the clock into a register of its own kind (one CS2R). The softmax's end, once
//     a step, stores all eleven stamps (one per stamp kind, and the step's earlier turn) together
//     with the step's labels: three 16-byte stores, predicated, no branch (a "step record"); the
//     epilogue's end stores those left from the tile's last turn. The host takes a stamped event's
//     start from the end of the warp's event before it: in every stage's loop the step's events
//     follow each other, up to a fence or a barrier arrival. A kind seen twice between two step
//     records keeps its last stamp (the turn excepted: a step's earlier turn has a stamp of its own);
//   - every other event (the producer's, and those once a tile: the waits for Q and the tile id,
//     the epilogue, the store) is one 16-byte record of its start and end, behind one uniform
//     branch (bra.uni: a warp that does not record the kind skips it);
//   - which event kinds a warp records is the host's choice, per warp (a bit mask, read once at the
//     start: every kind, only the step records (any stamp kind), or none, to time the trace points
//     alone); each warp records its first `capacity` rows (the host's choice too): the output tiles
//     the timeline's window needs, not the whole launch;
//   - only lane 0 of a warp writes: it executes every trace point of its warp (the producer's single
//     thread and the TMA store's issuer are lanes 0), so a trace point that only lane 0 passes keeps
//     the warp's records in order. The other lanes have no room from the start;
//   - the buffers' addresses sit in the constant bank (read as an operand: no load, no register);
//     the clock reads are volatile (they stay in order with the stage's own asm: wgmma, mbarrier
//     waits) but clobber no memory, so the compiler keeps every value it holds in registers.
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

// An event record: 16 bytes: event | tile << 8 (tile may be -1), the K/V step (-1: none), and the
// low 32 bits of clock64 at its start and its end. A step record: three such rows, twelve words:
// 0xff | tile << 8 | step << 20 (0xff: a marker no event uses; tile and step in 12 bits each, 0xfff
// for -1), then eleven stamps: one per kind of TRACE_STAMP_KINDS in order, and the step's earlier
// turn (0: not seen since the warp's last step record). Where a record sits says whose it is:
// [slot][warp][row]. The host unwraps the clock against the slot's full base clock (a kernel runs
// far less than 2^32 cycles).
struct TraceTarget {
    uint4* events;            // [max_ctas][warps][TRACE_CAPACITY]
    unsigned long long* base; // [2][max_ctas][2]: clock64 and %globaltimer (ns) when the CTA started,
                              // then at the end of its latest epilogue
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

// Per warp: the rows [next, end) it may still write (lane 0 only: the other lanes' end is their
// next) and the event kinds it records (bit e: event e), the same in all 32 lanes: broadcast from
// lane 0 with a shuffle, which tells the compiler they are warp-uniform, so the test of an event
// is one uniform branch.
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
        w.end = threadIdx.x % 32 == 0 ? w.next + min(int(g_trace.control[1]), TRACE_CAPACITY) : w.next;
        w.kinds = __shfl_sync(0xffffffffu, g_trace.control[2 + warp], 0);
    }
    return w;
}

__host__ __device__ constexpr uint32_t trace_bit(uint32_t e) { return 1u << e; }

// The events of a K/V step, recorded as stamps (in this order in a step record), and a second stamp
// for the pingpong's turn: where a step has two turns (QK's and PV's), the later must not
// overwrite the earlier's stamp before the softmax's end stores them.
constexpr uint32_t TRACE_STAMP_KINDS = trace_bit(kwait_k) | trace_bit(kwait_v) | trace_bit(kwait_kv) |
                                       trace_bit(kwait_turn) | trace_bit(kqk) | trace_bit(kwait_qk) |
                                       trace_bit(ksoftmax) | trace_bit(krescale) | trace_bit(kpv) | trace_bit(kwait_pv);
constexpr int TRACE_NSTAMPS = 11;
constexpr int TRACE_EARLIER_TURN = 10;  // the turn before the latest, in a step with two
static_assert(__builtin_popcount(TRACE_STAMP_KINDS) + 1 == TRACE_NSTAMPS, "one stamp per stamp kind, two turns");
__host__ __device__ constexpr int trace_stamp_index(uint32_t e) {
    int n = 0;  // the stamp kinds below e
    for (uint32_t k = 0; k < e; ++k) n += (TRACE_STAMP_KINDS >> k) & 1u;
    return n;
}

// An event record, when this warp records the kind; stored by lane 0 while it has room. Written in
// PTX for its branch: `bra.uni` (the kinds are the same in every lane, and never change) lets the
// compiler skip the record with one branch, where left to itself it predicates all of it and a
// skipped record costs as many cycles as a kept one.
template <uint32_t EVENT>
__device__ __forceinline__ void trace_record(TraceWarp& w, int tile, int kv, uint32_t start) {
    asm volatile(
        "{\n"
        ".reg .pred skip, room;\n"
        ".reg .b32 t, meta;\n"
        ".reg .b64 at;\n"
        "and.b32 t, %1, %3;\n"
        "setp.eq.u32 skip, t, 0;\n"
        "@skip bra.uni TRACE_SKIP;\n"
        "mov.u32 t, %%clock;\n"
        "shl.b32 meta, %5, 8;\n"
        "or.b32 meta, meta, %4;\n"
        "mad.wide.s32 at, %0, 16, %8;\n"
        "setp.lt.s32 room, %0, %2;\n"
        "@room st.global.v4.b32 [at], {meta, %6, %7, t};\n"
        "add.s32 %0, %0, 1;\n"
        "TRACE_SKIP:\n"
        "}\n"
        : "+r"(w.next)
        : "r"(w.kinds), "r"(w.end), "n"(1u << EVENT), "n"(EVENT), "r"(tile), "r"(kv), "r"(start), "l"(g_trace.events));
}

// A step record: the stamps so far, labelled with the step that stores them (word 0: 0xff, then
// the tile and the K/V step in 12 bits each, 0xfff for -1); by lane 0, when all three rows fit (a
// partial record would run into the next warp's) and the warp records some stamp kind. No branch:
// three predicated stores.
__device__ __forceinline__ void trace_flush(TraceWarp& w, int tile, int kv, const uint32_t (&t)[TRACE_NSTAMPS]) {
    asm volatile(
        "{\n"
        ".reg .pred room;\n"
        ".reg .b64 at;\n"
        ".reg .b32 meta, after, kinds;\n"
        "add.s32 after, %0, 3;\n"
        "setp.le.s32 room, after, %1;\n"
        "and.b32 kinds, %16, %17;\n"
        "setp.ne.and.u32 room, kinds, 0, room;\n"
        "mad.wide.s32 at, %0, 16, %2;\n"
        "bfi.b32 meta, %3, 255, 8, 12;\n"
        "bfi.b32 meta, %4, meta, 20, 12;\n"
        "@room st.global.v4.b32 [at], {meta, %5, %6, %7};\n"
        "@room st.global.v4.b32 [at+16], {%8, %9, %10, %11};\n"
        "@room st.global.v4.b32 [at+32], {%12, %13, %14, %15};\n"
        "}\n"
        :
        : "r"(w.next), "r"(w.end), "l"(g_trace.events), "r"(tile), "r"(kv), "r"(t[0]), "r"(t[1]), "r"(t[2]),
          "r"(t[3]), "r"(t[4]), "r"(t[5]), "r"(t[6]), "r"(t[7]), "r"(t[8]), "r"(t[9]), "r"(t[10]), "r"(w.kinds),
          "n"(TRACE_STAMP_KINDS));
    w.next += 3;
}

// The clock and the global timer at the end of each epilogue, by lane 0 of a recording warp, in one
// 16-byte store (the pair stays whole when warps race): the CTA's last pair and its start's give
// the SM clock over the CTA's run, the whole kernel for a persistent CTA (the driver's reading
// after a launch is up to a fifth off). A warp's slot is its rows' region: lane 0's end is in it.
__device__ __forceinline__ void trace_end_time(const TraceWarp& w) {
    if (w.kinds == 0 || threadIdx.x % 32 != 0) return;
    const int slot = (w.end - 1) / TRACE_CAPACITY / g_trace.warps;
    unsigned long long clk, ns;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(clk));
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    *reinterpret_cast<ulonglong2*>(g_trace.base + 2 * (g_trace.max_ctas + slot)) = make_ulonglong2(clk, ns);
}

template <uint32_t EVENT>
__device__ __forceinline__ void trace_begin(uint32_t (&start)[kevent_count]) {
    if constexpr (!(TRACE_STAMP_KINDS & trace_bit(EVENT))) start[EVENT] = trace_now();
}

__device__ __forceinline__ void trace_flush_and_clear(TraceWarp& w, int tile, int kv, uint32_t (&stamp)[TRACE_NSTAMPS]) {
    trace_flush(w, tile, kv, stamp);
    for (int i = 0; i < TRACE_NSTAMPS; ++i) stamp[i] = 0;  // a stamp's register is free until its next event
}

template <uint32_t EVENT>
__device__ __forceinline__ void trace_end(TraceWarp& w, uint32_t (&stamp)[TRACE_NSTAMPS],
                                          const uint32_t (&start)[kevent_count], int tile, int kv) {
    if constexpr (EVENT == kwait_turn) {  // the two turns' stamps shift: the latest, and the one before
        stamp[TRACE_EARLIER_TURN] = stamp[trace_stamp_index(EVENT)];
        stamp[trace_stamp_index(EVENT)] = trace_now();
    } else if constexpr (TRACE_STAMP_KINDS & trace_bit(EVENT)) {
        stamp[trace_stamp_index(EVENT)] = trace_now();
        if constexpr (EVENT == ksoftmax) trace_flush_and_clear(w, tile, kv, stamp);
    } else {
        trace_record<EVENT>(w, tile, kv, start[EVENT]);
        if constexpr (EVENT == kepilogue) {
            trace_flush_and_clear(w, tile, kv, stamp);  // the tile's last turn
            trace_end_time(w);
        }
    }
}

// The start of each open event and the stamps, one element per kind: indexed by constants only, so
// each element the kernel uses is a register, and the rest do not exist.
#define TRACE_INIT()                                        \
    __shared__ int trace_slot_shared_;                       \
    TraceWarp trace_warp_ = trace_init(&trace_slot_shared_); \
    uint32_t trace_start_[kevent_count];                     \
    uint32_t trace_stamp_[TRACE_NSTAMPS] = {}
#define TRACE_BEGIN(event) trace_begin<k##event>(trace_start_)
#define TRACE_END(event, tile, kv) trace_end<k##event>(trace_warp_, trace_stamp_, trace_start_, (tile), (kv))
#define TRACE_MARK(event, tile, kv) trace_record<k##event>(trace_warp_, (tile), (kv), trace_now())

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
