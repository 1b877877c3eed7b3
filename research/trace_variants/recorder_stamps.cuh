// Boundary stamps behind the existing trace points (an experiment; the traced build force-includes
// research/trace_variants/recorder_<name>.cuh in place of the real recorder). No stage source changes.
//
// The K/V step's events of a consumer (the waits for K, V and the turn, QK and PV issued, the
// waits for them, the softmax, the rescale) become stamps: TRACE_BEGIN reads no clock, TRACE_END
// reads one into a register of its own kind, and the softmax's end, once a step, stores the step's
// stamps together: 48 bytes, predicated on the warp's room (no branch). The host would take each
// event's start from the warp's previous end (adjacent in every stage's loop, up to a fence or an
// arrival). Every other event (the producer's, once a tile) keeps the real recorder's record.
#pragma once
#include "../../kernels/attention/common/trace_recorder.cuh"

__host__ __device__ constexpr uint32_t trace_bit(uint32_t e) { return 1u << e; }
constexpr uint32_t TRACE_STAMP_KINDS = trace_bit(kwait_k) | trace_bit(kwait_v) | trace_bit(kwait_kv) |
                                       trace_bit(kwait_turn) | trace_bit(kqk) | trace_bit(kwait_qk) |
                                       trace_bit(ksoftmax) | trace_bit(krescale) | trace_bit(kpv) | trace_bit(kwait_pv);
constexpr int TRACE_NSTAMPS = 10;  // the stamp kinds
__host__ __device__ constexpr int trace_slot(uint32_t e) {
    int n = 0;  // the stamp kinds below e
    for (uint32_t k = 0; k < e; ++k) n += (TRACE_STAMP_KINDS >> k) & 1u;
    return n;
}

template <uint32_t EVENT>
__device__ __forceinline__ void trace_begin_stamped(uint32_t (&start)[kevent_count]) {
    if constexpr (!(TRACE_STAMP_KINDS & trace_bit(EVENT))) start[EVENT] = trace_now();
}

// The step's record: [0] 0xff | tile << 8 (a marker no event id uses), [1] K/V step, [2..11] the
// stamps in the order of the stamp kinds (0: not seen yet).
__device__ __forceinline__ void trace_flush(TraceWarp& w, int tile, int kv, const uint32_t (&t)[TRACE_NSTAMPS]) {
    asm volatile(
        "{\n"
        ".reg .pred room;\n"
        ".reg .b64 at;\n"
        ".reg .b32 meta, after, kinds;\n"
        "add.s32 after, %0, 3;\n"
        "setp.le.s32 room, after, %1;\n"  // all three rows fit: a partial record would run into the next warp's
        "and.b32 kinds, %15, %16;\n"
        "setp.ne.and.u32 room, kinds, 0, room;\n"  // and the warp records some stamp kind (none: recording nothing)
        "mad.wide.s32 at, %0, 16, %2;\n"
        "shl.b32 meta, %3, 8;\n"
        "or.b32 meta, meta, 255;\n"
        "@room st.global.v4.b32 [at], {meta, %4, %5, %6};\n"
        "@room st.global.v4.b32 [at+16], {%7, %8, %9, %10};\n"
        "@room st.global.v4.b32 [at+32], {%11, %12, %13, %14};\n"
        "}\n"
        :
        : "r"(w.next), "r"(w.end), "l"(g_trace.events), "r"(tile), "r"(kv), "r"(t[0]), "r"(t[1]), "r"(t[2]),
          "r"(t[3]), "r"(t[4]), "r"(t[5]), "r"(t[6]), "r"(t[7]), "r"(t[8]), "r"(t[9]), "r"(w.kinds),
          "n"(TRACE_STAMP_KINDS));
    w.next += 3;
}

template <uint32_t EVENT>
__device__ __forceinline__ void trace_end_stamped(TraceWarp& w, uint32_t (&stamp)[TRACE_NSTAMPS],
                                                  const uint32_t (&start)[kevent_count], int tile, int kv) {
    if constexpr (TRACE_STAMP_KINDS & trace_bit(EVENT)) {
        stamp[trace_slot(EVENT)] = trace_now();
        if constexpr (EVENT == ksoftmax) trace_flush(w, tile, kv, stamp);
    } else {
        trace_end<EVENT>(w, tile, kv, start[EVENT], false);
    }
}

#undef TRACE_INIT
#undef TRACE_BEGIN
#undef TRACE_END
#define TRACE_INIT()                                        \
    __shared__ int trace_slot_shared_;                       \
    TraceWarp trace_warp_ = trace_init(&trace_slot_shared_); \
    uint32_t trace_start_[kevent_count];                     \
    uint32_t trace_stamp_[TRACE_NSTAMPS] = {}
#define TRACE_BEGIN(event) trace_begin_stamped<k##event>(trace_start_)
#define TRACE_END(event, tile, kv) \
    trace_end_stamped<k##event>(trace_warp_, trace_stamp_, trace_start_, (tile), (kv))
