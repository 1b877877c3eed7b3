// Diagnostic: recorder_ncpred.cuh's wait-for-Q record with no clock read at all (times 0).
#pragma once
#include "recorder_ncpred.cuh"
template <uint32_t EVENT>
__device__ __forceinline__ void trace_end_noclk(TraceWarp& w, int tile, int kv) {
    if constexpr (EVENT == kwait_q) {
        asm volatile(
            "{\n"
            ".reg .pred room;\n"
            ".reg .b32 meta;\n"
            ".reg .b64 at;\n"
            "setp.lt.s32 room, %0, %1;\n"
            "shl.b32 meta, %2, 8;\n"
            "or.b32 meta, meta, %3;\n"
            "mad.wide.s32 at, %0, 16, %4;\n"
            "@room st.global.v4.b32 [at], {meta, 0, 0, 0};\n"
            "@room add.s32 %0, %0, 1;\n"
            "}\n"
            : "+r"(w.next)
            : "r"(w.end), "r"(tile), "n"(EVENT), "l"(g_trace.events));
    }
}
#undef TRACE_END
#undef TRACE_BEGIN
#define TRACE_BEGIN(event) \
    do {                   \
    } while (0)
#define TRACE_END(event, tile, kv) trace_end_noclk<k##event>(trace_warp_, (tile), (kv))
