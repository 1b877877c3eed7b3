// Diagnostic recorder: some of a K/V step's trace points read the clock and keep only an XOR of the
// readings (one LOP3 each, one register), stored after the epilogue where it equals 1 (practically
// never, but the compiler cannot drop the reads); the rest of the step's trace points vanish. What
// the clock reads cost by themselves, as points the compiler does not schedule across, without
// holding or storing the stamps. The other events (the producer's, those once a tile) record as
// the real recorder does where TV_KEEP_OTHERS has their bit. Not a trace: no step records.
//   TV_FENCE_KINDS  the step events whose trace points read the clock (default: all of them)
//   TV_KEEP_OTHERS  the other events that record (default: all of them)
#pragma once
#include "../../kernels/attention/common/trace_recorder.cuh"

#ifndef TV_FENCE_KINDS
#define TV_FENCE_KINDS TRACE_STAMP_KINDS
#endif
#ifndef TV_KEEP_OTHERS
#define TV_KEEP_OTHERS (~TRACE_STAMP_KINDS)
#endif
constexpr uint32_t TRACE_PRODUCER_KINDS = trace_bit(kload_q) | trace_bit(kload_k) | trace_bit(kload_v) |
                                          trace_bit(kload_kv) | trace_bit(kwait_empty);

__device__ uint32_t g_trace_sink;

template <uint32_t EVENT>
__device__ __forceinline__ void trace_end_fence(TraceWarp& w, uint32_t& acc, const uint32_t (&start)[kevent_count],
                                                int tile, int kv) {
    if constexpr (TRACE_STAMP_KINDS & trace_bit(EVENT)) {
        if constexpr (uint32_t(TV_FENCE_KINDS) & trace_bit(EVENT)) acc ^= trace_now();
    } else {
        if constexpr (uint32_t(TV_KEEP_OTHERS) & trace_bit(EVENT)) trace_record<EVENT>(w, tile, kv, start[EVENT]);
        if constexpr (EVENT == kepilogue) {
            if (acc == 1u) g_trace_sink = acc;
        }
    }
}

template <uint32_t EVENT>
__device__ __forceinline__ void trace_mark_fence(TraceWarp& w, int tile, int kv) {
    if constexpr (uint32_t(TV_KEEP_OTHERS) & trace_bit(EVENT)) trace_record<EVENT>(w, tile, kv, trace_now());
}

template <uint32_t EVENT>
__device__ __forceinline__ void trace_begin_fence(uint32_t (&start)[kevent_count]) {
    if constexpr (!(TRACE_STAMP_KINDS & trace_bit(EVENT)) && (uint32_t(TV_KEEP_OTHERS) & trace_bit(EVENT)))
        start[EVENT] = trace_now();
}

#undef TRACE_INIT
#undef TRACE_BEGIN
#undef TRACE_END
#undef TRACE_MARK
#define TRACE_INIT()                                        \
    __shared__ int trace_slot_shared_;                       \
    TraceWarp trace_warp_ = trace_init(&trace_slot_shared_); \
    uint32_t trace_acc_ = 0;                                 \
    uint32_t trace_start_[kevent_count]
#define TRACE_BEGIN(event) trace_begin_fence<k##event>(trace_start_)
#define TRACE_END(event, tile, kv) trace_end_fence<k##event>(trace_warp_, trace_acc_, trace_start_, (tile), (kv))
#define TRACE_MARK(event, tile, kv) trace_mark_fence<k##event>(trace_warp_, (tile), (kv))
