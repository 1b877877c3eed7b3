// The boundary-stamps recorder with its per-warp state in one register (an experiment; the traced
// build force-includes research/trace_variants/recorder_<name>.cuh in place of the real recorder).
//
// The recorder (common/trace_recorder.cuh) holds three registers per thread for the whole kernel
// (the next row, the end of the warp's rows, the kinds it records) in consumers at 240 registers,
// where stage 21's and 22's non-causal kernels spill with any trace points outside the K/V loop.
// Here one register, the cursor, holds the row the warp writes next (the row index in the buffer,
// 19 bits: its region is row >> 12) and two switches: bit 30, the warp records step records; bit 31,
// it records the other events (the host's kinds mask, read as: any stamp kind / any other kind). The
// room test reads the records per warp from the constant bank; the cursor stops at the last row
// that fits. Lanes other than 0 have both switches off. Same records, same decoder.
#pragma once
#define hopattn_trace_setup hopattn_trace_setup_real
#include "../../kernels/attention/common/trace_recorder.cuh"
#undef hopattn_trace_setup

__constant__ int g_trace_per_warp;  // records per warp (at most TRACE_CAPACITY - 3): set with the target

// The real setup, and the records per warp (control[1], which the host writes before it) copied
// from the control buffer to the constant bank.
extern "C" __attribute__((visibility("default"))) int hopattn_trace_setup(void* events, void* base, void* info,
                                                                          void* control, int max_ctas, int warps,
                                                                          int target_sm, char* err, int errlen) {
    if (hopattn_trace_setup_real(events, base, info, control, max_ctas, warps, target_sm, err, errlen)) return 1;
    uint32_t words[2];
    cudaError_t status = cudaMemcpy(words, control, sizeof(words), cudaMemcpyDeviceToHost);
    const int per_warp = min(int(words[1]), TRACE_CAPACITY - 3);
    if (status == cudaSuccess) status = cudaMemcpyToSymbol(g_trace_per_warp, &per_warp, sizeof(per_warp));
    if (status != cudaSuccess) {
        snprintf(err, errlen, "trace setup failed: %s", cudaGetErrorString(status));
        return 1;
    }
    return 0;
}

constexpr uint32_t TRACE_ROW_MASK = 0x7ffffu, TRACE_STEPS_ON = 1u << 30, TRACE_OTHERS_ON = 1u << 31;

__device__ __forceinline__ uint32_t trace_lean_init(int* shared_slot) {
    const TraceWarp w = trace_init(shared_slot);  // the real recorder's slot claim
    uint32_t cursor = uint32_t(w.next) & TRACE_ROW_MASK;
    if (w.end > w.next) {  // lane 0 of a recording warp
        if (w.kinds & TRACE_STAMP_KINDS) cursor |= TRACE_STEPS_ON;
        if (w.kinds & ~TRACE_STAMP_KINDS) cursor |= TRACE_OTHERS_ON;
    }
    return cursor;
}

// An event record when the warp records other events and a row is left; a uniform branch skips it.
template <uint32_t EVENT>
__device__ __forceinline__ void trace_record_lean(uint32_t& cursor, int tile, int kv, uint32_t start) {
    asm volatile(
        "{\n"
        ".reg .pred skip, room;\n"
        ".reg .b32 t, meta, row, used;\n"
        ".reg .b64 at;\n"
        "setp.lt.s32 skip, %0, 0;\n"  // bit 31: records the other events
        "@!skip bra.uni TRACE_SKIP;\n"
        "mov.u32 t, %%clock;\n"
        "and.b32 row, %0, %6;\n"
        "and.b32 used, %0, 4095;\n"
        "setp.lt.s32 room, used, %7;\n"
        "shl.b32 meta, %2, 8;\n"
        "or.b32 meta, meta, %1;\n"
        "mad.wide.u32 at, row, 16, %5;\n"
        "@room st.global.v4.b32 [at], {meta, %3, %4, t};\n"
        "@room add.s32 %0, %0, 1;\n"
        "TRACE_SKIP:\n"
        "}\n"
        : "+r"(cursor)
        : "n"(EVENT), "r"(tile), "r"(kv), "r"(start), "l"(g_trace.events), "n"(TRACE_ROW_MASK), "r"(g_trace_per_warp));
}

__device__ __forceinline__ void trace_flush_lean(uint32_t& cursor, int tile, int kv, const uint32_t (&t)[TRACE_NSTAMPS]) {
    asm volatile(
        "{\n"
        ".reg .pred room, on;\n"
        ".reg .b64 at;\n"
        ".reg .b32 meta, row, used, sw;\n"
        "and.b32 row, %0, %15;\n"
        "and.b32 used, %0, 4095;\n"
        "add.s32 used, used, 3;\n"
        "setp.le.s32 room, used, %16;\n"
        "and.b32 sw, %0, %17;\n"
        "setp.ne.and.u32 room, sw, 0, room;\n"
        "mad.wide.u32 at, row, 16, %1;\n"
        "bfi.b32 meta, %2, 255, 8, 12;\n"
        "bfi.b32 meta, %3, meta, 20, 12;\n"
        "@room st.global.v4.b32 [at], {meta, %4, %5, %6};\n"
        "@room st.global.v4.b32 [at+16], {%7, %8, %9, %10};\n"
        "@room st.global.v4.b32 [at+32], {%11, %12, %13, %14};\n"
        "@room add.s32 %0, %0, 3;\n"
        "}\n"
        : "+r"(cursor)
        : "l"(g_trace.events), "r"(tile), "r"(kv), "r"(t[0]), "r"(t[1]), "r"(t[2]), "r"(t[3]), "r"(t[4]), "r"(t[5]),
          "r"(t[6]), "r"(t[7]), "r"(t[8]), "r"(t[9]), "r"(t[10]), "n"(TRACE_ROW_MASK), "r"(g_trace_per_warp),
          "n"(TRACE_STEPS_ON));
}

__device__ __forceinline__ void trace_flush_and_clear_lean(uint32_t& cursor, int tile, int kv,
                                                           uint32_t (&stamp)[TRACE_NSTAMPS]) {
    trace_flush_lean(cursor, tile, kv, stamp);
    for (int i = 0; i < TRACE_NSTAMPS; ++i) stamp[i] = 0;
}

template <uint32_t EVENT>
__device__ __forceinline__ void trace_end_lean(uint32_t& cursor, uint32_t (&stamp)[TRACE_NSTAMPS],
                                               const uint32_t (&start)[kevent_count], int tile, int kv) {
    if constexpr (EVENT == kwait_turn) {
        stamp[TRACE_EARLIER_TURN] = stamp[trace_stamp_index(EVENT)];
        stamp[trace_stamp_index(EVENT)] = trace_now();
    } else if constexpr (TRACE_STAMP_KINDS & trace_bit(EVENT)) {
        stamp[trace_stamp_index(EVENT)] = trace_now();
        if constexpr (EVENT == ksoftmax) trace_flush_and_clear_lean(cursor, tile, kv, stamp);
    } else {
        trace_record_lean<EVENT>(cursor, tile, kv, start[EVENT]);
        if constexpr (EVENT == kepilogue) trace_flush_and_clear_lean(cursor, tile, kv, stamp);
    }
}

#undef TRACE_INIT
#undef TRACE_END
#undef TRACE_MARK
#define TRACE_INIT()                                                  \
    __shared__ int trace_slot_shared_;                                 \
    uint32_t trace_cursor_ = trace_lean_init(&trace_slot_shared_);     \
    uint32_t trace_start_[kevent_count];                               \
    uint32_t trace_stamp_[TRACE_NSTAMPS] = {}
#define TRACE_END(event, tile, kv) trace_end_lean<k##event>(trace_cursor_, trace_stamp_, trace_start_, (tile), (kv))
#define TRACE_MARK(event, tile, kv) trace_record_lean<k##event>(trace_cursor_, (tile), (kv), trace_now())
