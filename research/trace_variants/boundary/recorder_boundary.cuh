// A prototype for the next recorder (an experiment; no stage uses it): one clock read per boundary
// between adjacent events of a K/V step, held in registers, and the step's stamps stored together
// at its end (three 16-byte stores, predicated on the warp recording and on its room), instead of
// two clock reads, a branch and a store per event. Force-included like the real recorder, whose
// macros it keeps for the events outside the loop; research/trace_variants/boundary/make_21_boundary.py
// writes stage 21 with its consumer loop on these stamps.
#pragma once
#include "../../../kernels/attention/common/trace_recorder.cuh"

constexpr int TRACE_STAMPS = 9;  // the ends of a step's events, in order; its start is the last step's end

// [0] tile << 16 | K/V step, [1..9] the stamps, [10..11] unused: 48 bytes, three records' room.
__device__ __forceinline__ void trace_step(TraceWarp& w, int tile, int kv, const uint32_t (&t)[TRACE_STAMPS]) {
    asm volatile(
        "{\n"
        ".reg .pred room;\n"
        ".reg .b64 at;\n"
        ".reg .b32 meta;\n"
        "setp.lt.s32 room, %0, %1;\n"
        "mad.wide.s32 at, %0, 16, %2;\n"
        "prmt.b32 meta, %4, %3, 0x5410;\n"
        "@room st.global.v4.b32 [at], {meta, %5, %6, %7};\n"
        "@room st.global.v4.b32 [at+16], {%8, %9, %10, %11};\n"
        "@room st.global.v2.b32 [at+32], {%12, %13};\n"
        "}\n"
        :
        : "r"(w.next), "r"(w.end), "l"(g_trace.events), "r"(tile), "r"(kv), "r"(t[0]), "r"(t[1]), "r"(t[2]),
          "r"(t[3]), "r"(t[4]), "r"(t[5]), "r"(t[6]), "r"(t[7]), "r"(t[8]));
    w.next += 3;
}

#undef TRACE_INIT
#define TRACE_INIT()                                        \
    __shared__ int trace_slot_shared_;                       \
    TraceWarp trace_warp_ = trace_init(&trace_slot_shared_); \
    uint32_t trace_start_[kevent_count];                     \
    uint32_t trace_stamp_[TRACE_STAMPS]
#define TRACE_STAMP(i) trace_stamp_[i] = trace_now()
#define TRACE_STEP(tile, kv) trace_step(trace_warp_, (tile), (kv), trace_stamp_)
