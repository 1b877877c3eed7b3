// Boundary stamps stored straight to global memory (an experiment; the traced build force-includes
// research/trace_variants/recorder_<name>.cuh in place of the real recorder). No stage source changes.
//
// The recorder (common/trace_recorder.cuh) holds a step's eleven stamps in registers from their
// events to the step's store, in consumers that already use 240. Here a stamp is its clock read and
// one predicated st.global.b32 into the step record's row, reserved at the previous step record
// (the row address is held in a register pair; null where the warp does not record stamps, for
// lanes other than 0 and when the warp's rows are full). The softmax's end (and the epilogue's)
// writes the labels into the row's word 0 and reserves the next row. Nothing is held but the row's
// address and the latest turn's stamp (the earlier turn of a step is the latest before it, 0 after
// a step record). The buffer must be zeroed before a recorded launch (a stamp not seen stays 0),
// which bench.trace does. Same records, same decoder; the step record sits before the event
// records stored during its step (the decoder orders events by time).
#pragma once
#include "../../kernels/attention/common/trace_recorder.cuh"

struct TraceDirect {
    uint32_t* row = nullptr;  // this step's record (null: nothing to record)
    uint32_t turn = 0;        // the latest turn's stamp since the last step record
};

// Reserves the next step record's three rows at w.next, when the warp records stamps and they fit.
__device__ __forceinline__ uint32_t* trace_reserve(TraceWarp& w) {
    const bool room = w.next + 3 <= w.end && (w.kinds & TRACE_STAMP_KINDS) != 0;
    uint32_t* row = room ? reinterpret_cast<uint32_t*>(g_trace.events + w.next) : nullptr;
    w.next += 3;
    return row;
}

template <int WORD>
__device__ __forceinline__ void trace_put(uint32_t* row, uint32_t value) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.u64 p, %0, 0;\n"
        "@p st.global.b32 [%0+%2], %1;\n"
        "}\n"
        :
        : "l"(row), "r"(value), "n"(4 * WORD));
}

__device__ __forceinline__ void trace_step_record(TraceWarp& w, TraceDirect& d, int tile, int kv) {
    uint32_t meta = 0xffu | (uint32_t(tile) & 0xfffu) << 8 | (uint32_t(kv) & 0xfffu) << 20;
    trace_put<0>(d.row, meta);
    d.row = trace_reserve(w);
    d.turn = 0;
}

template <uint32_t EVENT>
__device__ __forceinline__ void trace_end_direct(TraceWarp& w, TraceDirect& d, const uint32_t (&start)[kevent_count],
                                                 int tile, int kv) {
    if constexpr (EVENT == kwait_turn) {
        trace_put<1 + TRACE_EARLIER_TURN>(d.row, d.turn);
        d.turn = trace_now();
        trace_put<1 + trace_stamp_index(EVENT)>(d.row, d.turn);
    } else if constexpr (TRACE_STAMP_KINDS & trace_bit(EVENT)) {
        trace_put<1 + trace_stamp_index(EVENT)>(d.row, trace_now());
        if constexpr (EVENT == ksoftmax) trace_step_record(w, d, tile, kv);
    } else {
        trace_record<EVENT>(w, tile, kv, start[EVENT]);
        if constexpr (EVENT == kepilogue) trace_step_record(w, d, tile, kv);
    }
}

__device__ __forceinline__ TraceDirect trace_direct_init(TraceWarp& w) {
    TraceDirect d;
    d.row = trace_reserve(w);
    return d;
}

#undef TRACE_INIT
#undef TRACE_END
#define TRACE_INIT()                                                   \
    __shared__ int trace_slot_shared_;                                  \
    TraceWarp trace_warp_ = trace_init(&trace_slot_shared_);            \
    TraceDirect trace_direct_ = trace_direct_init(trace_warp_);         \
    uint32_t trace_start_[kevent_count]
#define TRACE_END(event, tile, kv) trace_end_direct<k##event>(trace_warp_, trace_direct_, trace_start_, (tile), (kv))
