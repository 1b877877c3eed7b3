// The boundary-stamps recorder with each warp's cursor in shared memory (an experiment; the traced
// build force-includes research/trace_variants/recorder_<name>.cuh in place of the real recorder).
//
// The recorder (common/trace_recorder.cuh) keeps a warp's cursor (next row, end, kinds) in three
// registers of every thread for the whole kernel. Any event record outside the K/V loop keeps them
// live across it, and that alone changes how ptxas builds stage 15's loop (+12 instructions, the
// shared window's base read again with S2UR in the loop; +19 % kernel time). Here the cursor is a
// 16-byte row of shared memory per warp, read and written by every lane of the warp at a record
// (a warp-uniform value: each lane reads the same cursor and writes the same record to the same
// address, and a record that one lane passes alone, the TMA store's, moves the warp's cursor for
// all). Nothing of the recorder is live across the loop but the stamps of the current step.
#pragma once
#include "../../kernels/attention/common/trace_recorder.cuh"

constexpr int TRACE_STATE_WARPS = 16;  // every warp of a CTA of up to 512 threads

// This warp's cursor: [next, end, kinds, -] (end == next: the warp records nothing).
__device__ __forceinline__ uint32_t trace_state_addr(uint32_t (&state)[TRACE_STATE_WARPS][4]) {
    return uint32_t(__cvta_generic_to_shared(&state[(threadIdx.x / 32) % TRACE_STATE_WARPS][0]));
}

__device__ __forceinline__ void trace_state_init(uint32_t (&state)[TRACE_STATE_WARPS][4], int* shared_slot) {
    TraceWarp w = trace_init(shared_slot);
    if (threadIdx.x % 32 == 0 && threadIdx.x / 32 < TRACE_STATE_WARPS) {
        state[threadIdx.x / 32][0] = uint32_t(w.next);
        state[threadIdx.x / 32][1] = uint32_t(w.end);
        state[threadIdx.x / 32][2] = w.kinds;
    }
    __syncwarp();
}

template <uint32_t EVENT>
__device__ __forceinline__ void trace_record_ss(uint32_t state, int tile, int kv, uint32_t start) {
    asm volatile(
        "{\n"
        ".reg .pred room;\n"
        ".reg .b32 t, meta, k, next, end, kinds, pad;\n"
        ".reg .b64 at;\n"
        "mov.u32 t, %%clock;\n"
        "ld.shared.v4.b32 {next, end, kinds, pad}, [%0];\n"
        "and.b32 k, kinds, %1;\n"
        "setp.lt.s32 room, next, end;\n"
        "setp.ne.and.u32 room, k, 0, room;\n"
        "shl.b32 meta, %3, 8;\n"
        "or.b32 meta, meta, %2;\n"
        "mad.wide.s32 at, next, 16, %6;\n"
        "@room st.global.v4.b32 [at], {meta, %4, %5, t};\n"
        "add.s32 next, next, 1;\n"
        "@room st.shared.b32 [%0], next;\n"
        "}\n"
        :
        : "r"(state), "n"(1u << EVENT), "n"(EVENT), "r"(tile), "r"(kv), "r"(start), "l"(g_trace.events));
}

__device__ __forceinline__ void trace_flush_ss(uint32_t state, int tile, int kv, const uint32_t (&t)[TRACE_NSTAMPS]) {
    asm volatile(
        "{\n"
        ".reg .pred room;\n"
        ".reg .b64 at;\n"
        ".reg .b32 meta, after, k, next, end, kinds, pad;\n"
        "ld.shared.v4.b32 {next, end, kinds, pad}, [%0];\n"
        "add.s32 after, next, 3;\n"
        "setp.le.s32 room, after, end;\n"
        "and.b32 k, kinds, %15;\n"
        "setp.ne.and.u32 room, k, 0, room;\n"
        "mad.wide.s32 at, next, 16, %1;\n"
        "bfi.b32 meta, %2, 255, 8, 12;\n"
        "bfi.b32 meta, %3, meta, 20, 12;\n"
        "@room st.global.v4.b32 [at], {meta, %4, %5, %6};\n"
        "@room st.global.v4.b32 [at+16], {%7, %8, %9, %10};\n"
        "@room st.global.v4.b32 [at+32], {%11, %12, %13, %14};\n"
        "@room st.shared.b32 [%0], after;\n"
        "}\n"
        :
        : "r"(state), "l"(g_trace.events), "r"(tile), "r"(kv), "r"(t[0]), "r"(t[1]), "r"(t[2]), "r"(t[3]), "r"(t[4]),
          "r"(t[5]), "r"(t[6]), "r"(t[7]), "r"(t[8]), "r"(t[9]), "r"(t[10]), "n"(TRACE_STAMP_KINDS));
}

__device__ __forceinline__ void trace_flush_and_clear_ss(uint32_t state, int tile, int kv, uint32_t (&stamp)[TRACE_NSTAMPS]) {
    trace_flush_ss(state, tile, kv, stamp);
    for (int i = 0; i < TRACE_NSTAMPS; ++i) stamp[i] = 0;
}

template <uint32_t EVENT>
__device__ __forceinline__ void trace_end_ss(uint32_t (&rows)[TRACE_STATE_WARPS][4], uint32_t (&stamp)[TRACE_NSTAMPS],
                                             const uint32_t (&start)[kevent_count], int tile, int kv) {
    if constexpr (EVENT == kwait_turn) {
        stamp[TRACE_EARLIER_TURN] = stamp[trace_stamp_index(EVENT)];
        stamp[trace_stamp_index(EVENT)] = trace_now();
    } else if constexpr (TRACE_STAMP_KINDS & trace_bit(EVENT)) {
        stamp[trace_stamp_index(EVENT)] = trace_now();
        if constexpr (EVENT == ksoftmax) trace_flush_and_clear_ss(trace_state_addr(rows), tile, kv, stamp);
    } else {
        trace_record_ss<EVENT>(trace_state_addr(rows), tile, kv, start[EVENT]);
        if constexpr (EVENT == kepilogue) trace_flush_and_clear_ss(trace_state_addr(rows), tile, kv, stamp);
    }
}

#undef TRACE_INIT
#undef TRACE_END
#undef TRACE_MARK
#define TRACE_INIT()                                                         \
    __shared__ __align__(16) uint32_t trace_state_[TRACE_STATE_WARPS][4];     \
    __shared__ int trace_slot_shared_;                                       \
    trace_state_init(trace_state_, &trace_slot_shared_);                     \
    uint32_t trace_start_[kevent_count];                                     \
    uint32_t trace_stamp_[TRACE_NSTAMPS] = {}
#define TRACE_END(event, tile, kv) trace_end_ss<k##event>(trace_state_, trace_stamp_, trace_start_, (tile), (kv))
#define TRACE_MARK(event, tile, kv) trace_record_ss<k##event>(trace_state_addr(trace_state_), (tile), (kv), trace_now())
