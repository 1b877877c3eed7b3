// The real recorder with its event records (every event but a K/V step's stamps) predicated instead
// of skipped by a uniform branch (an experiment: whether the branches of the records outside the
// K/V loop change how the compiler builds the loop; stage 15's consumers cost +19 % with them).
#pragma once
#include "../../kernels/attention/common/trace_recorder.cuh"

template <uint32_t EVENT>
__device__ __forceinline__ void trace_record_pred(TraceWarp& w, int tile, int kv, uint32_t start) {
    asm volatile(
        "{\n"
        ".reg .pred room;\n"
        ".reg .b32 t, meta, k;\n"
        ".reg .b64 at;\n"
        "mov.u32 t, %%clock;\n"
        "and.b32 k, %1, %3;\n"
        "setp.lt.s32 room, %0, %2;\n"
        "setp.ne.and.u32 room, k, 0, room;\n"
        "shl.b32 meta, %5, 8;\n"
        "or.b32 meta, meta, %4;\n"
        "mad.wide.s32 at, %0, 16, %8;\n"
        "@room st.global.v4.b32 [at], {meta, %6, %7, t};\n"
        "@room add.s32 %0, %0, 1;\n"
        "}\n"
        : "+r"(w.next)
        : "r"(w.kinds), "r"(w.end), "n"(1u << EVENT), "n"(EVENT), "r"(tile), "r"(kv), "r"(start), "l"(g_trace.events));
}

template <uint32_t EVENT>
__device__ __forceinline__ void trace_end_pred(TraceWarp& w, uint32_t (&stamp)[TRACE_NSTAMPS],
                                               const uint32_t (&start)[kevent_count], int tile, int kv) {
    if constexpr (TRACE_STAMP_KINDS & trace_bit(EVENT)) {
        trace_end<EVENT>(w, stamp, start, tile, kv);
    } else {
        trace_record_pred<EVENT>(w, tile, kv, start[EVENT]);
        if constexpr (EVENT == kepilogue) trace_flush_and_clear(w, tile, kv, stamp);
    }
}

#undef TRACE_END
#undef TRACE_MARK
#define TRACE_END(event, tile, kv) trace_end_pred<k##event>(trace_warp_, trace_stamp_, trace_start_, (tile), (kv))
#define TRACE_MARK(event, tile, kv) trace_record_pred<k##event>(trace_warp_, (tile), (kv), trace_now())
