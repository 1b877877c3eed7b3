// Boundary stamps kept in shared memory (an experiment; the traced build force-includes
// research/trace_variants/recorder_<name>.cuh in place of the real recorder). No stage source changes.
//
// The recorder (common/trace_recorder.cuh) holds a step's eleven stamps in registers from their
// events to the step's store, in consumers that already use 240. Here each stamp goes to shared
// memory at once (the clock read and one st.shared, no register held), into a 48-byte row per
// warp laid out as the step record's three global rows; the softmax's end (and the epilogue's)
// reads the row back (three ld.shared.v4), puts the labels in its first word, stores it (three
// predicated st.global.v4) and clears it (three st.shared.v4 of zeros). Same records, same decoder.
// (All of it is volatile asm, which the compiler keeps in order, so a stamp's st.shared precedes
// the flush's ld.shared without a memory clobber.)
#pragma once
#include "../../kernels/attention/common/trace_recorder.cuh"

constexpr int TRACE_SMEM_WARPS = 16;  // rows: every warp of a CTA of up to 512 threads

// This warp's row: word 0 is the labels' place, word 1 + i the stamp of stamp index i.
__device__ __forceinline__ uint32_t trace_row(uint32_t (&rows)[TRACE_SMEM_WARPS][12]) {
    return uint32_t(__cvta_generic_to_shared(&rows[(threadIdx.x / 32) % TRACE_SMEM_WARPS][0]));
}

__device__ __forceinline__ void trace_stamp_smem(uint32_t row, int index) {
    asm volatile(
        "{\n"
        ".reg .b32 t;\n"
        "mov.u32 t, %%clock;\n"
        "st.shared.b32 [%0], t;\n"
        "}\n"
        :
        : "r"(row + 4 * (1 + index)));
}

__device__ __forceinline__ void trace_shift_turn_smem(uint32_t row) {
    asm volatile(
        "{\n"
        ".reg .b32 old;\n"
        "ld.shared.b32 old, [%0];\n"
        "st.shared.b32 [%1], old;\n"
        "}\n"
        :
        : "r"(row + 4 * (1 + trace_stamp_index(kwait_turn))), "r"(row + 4 * (1 + TRACE_EARLIER_TURN)));
}

__device__ __forceinline__ void trace_flush_smem(TraceWarp& w, uint32_t row, int tile, int kv) {
    asm volatile(
        "{\n"
        ".reg .pred room;\n"
        ".reg .b64 at;\n"
        ".reg .b32 meta, after, kinds, a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3;\n"
        "ld.shared.v4.b32 {a0, a1, a2, a3}, [%3];\n"
        "ld.shared.v4.b32 {b0, b1, b2, b3}, [%3+16];\n"
        "ld.shared.v4.b32 {c0, c1, c2, c3}, [%3+32];\n"
        "add.s32 after, %0, 3;\n"
        "setp.le.s32 room, after, %1;\n"
        "and.b32 kinds, %6, %7;\n"
        "setp.ne.and.u32 room, kinds, 0, room;\n"
        "mad.wide.s32 at, %0, 16, %2;\n"
        "bfi.b32 meta, %4, 255, 8, 12;\n"
        "bfi.b32 meta, %5, meta, 20, 12;\n"
        "@room st.global.v4.b32 [at], {meta, a1, a2, a3};\n"
        "@room st.global.v4.b32 [at+16], {b0, b1, b2, b3};\n"
        "@room st.global.v4.b32 [at+32], {c0, c1, c2, c3};\n"
        "st.shared.v4.b32 [%3], {0, 0, 0, 0};\n"
        "st.shared.v4.b32 [%3+16], {0, 0, 0, 0};\n"
        "st.shared.v4.b32 [%3+32], {0, 0, 0, 0};\n"
        "}\n"
        :
        : "r"(w.next), "r"(w.end), "l"(g_trace.events), "r"(row), "r"(tile), "r"(kv), "r"(w.kinds),
          "n"(TRACE_STAMP_KINDS));
    w.next += 3;
}

template <uint32_t EVENT>
__device__ __forceinline__ void trace_end_smem(TraceWarp& w, uint32_t row, const uint32_t (&start)[kevent_count],
                                               int tile, int kv) {
    if constexpr (EVENT == kwait_turn) {
        trace_shift_turn_smem(row);
        trace_stamp_smem(row, trace_stamp_index(EVENT));
    } else if constexpr (TRACE_STAMP_KINDS & trace_bit(EVENT)) {
        trace_stamp_smem(row, trace_stamp_index(EVENT));
        if constexpr (EVENT == ksoftmax) trace_flush_smem(w, row, tile, kv);
    } else {
        trace_record<EVENT>(w, tile, kv, start[EVENT]);
        if constexpr (EVENT == kepilogue) trace_flush_smem(w, row, tile, kv);
    }
}

#undef TRACE_INIT
#undef TRACE_END
// The rows start cleared: trace_init's __syncthreads orders the clearing before any stamp.
#define TRACE_INIT()                                                                        \
    __shared__ __align__(16) uint32_t trace_rows_[TRACE_SMEM_WARPS][12];                     \
    if (threadIdx.x < TRACE_SMEM_WARPS * 12) (&trace_rows_[0][0])[threadIdx.x] = 0;           \
    __shared__ int trace_slot_shared_;                                                      \
    TraceWarp trace_warp_ = trace_init(&trace_slot_shared_);                                \
    const uint32_t trace_row_ = trace_row(trace_rows_);                                      \
    uint32_t trace_start_[kevent_count]
#define TRACE_END(event, tile, kv) trace_end_smem<k##event>(trace_warp_, trace_row_, trace_start_, (tile), (kv))
