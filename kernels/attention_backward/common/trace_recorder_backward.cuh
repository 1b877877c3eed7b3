// The backward's recorder (Act V), behind the trace points of trace_backward.cuh: force-included by a
// backward stage's traced build (nvcc -DHOPATTN_TRACE -include trace_recorder_backward.cuh, see
// hopattn.build), never by a stage. It builds on the forward's recorder (attention/common/
// trace_recorder.cuh, included below: the buffers and their constant-bank addresses, the slot a CTA
// claims on the target SM, the clock, the CTA's end time, the host's two functions), which it leaves
// as it is, so the forward's traced builds and trace records do not change; and it names the
// backward's own events, numbered from 32 on, above the forward's TraceEvent: a record's event byte
// says whose event it is.
//
// What differs from the forward's rules, and why:
//   - a step's events are boundary stamps, as the forward's are (TRACE_BEGIN reads no clock; an
//     event starts where the warp's event before it ended), but each is stored at its own end, one
//     16-byte row [event | tile << 8, step, 0, clock] behind one uniform branch (bra.uni: a warp that
//     does not record the kind skips the row, its clock read included), instead of being held in a
//     register until a step record stores them all. A backward step is one query block through five
//     GEMMs — 4 us at stage 03, about ten times a forward K/V step, with about as many events — and
//     the consumers of stages 03-05 run at 246-255 registers, where fifteen stamps held to the
//     step's end would spill. A row per event holds nothing beyond the warp's three registers
//     (next row, end, kinds) and adds 16 bytes of stores per event, against the 32 KB of dQ that a
//     CTA adds up each step;
//   - the events once a CTA (the wait for K and V, the store of dK and dV) keep their start too
//     (TRACE_BEGIN reads the clock); a copy issued is an instant, start = end;
//   - the kinds a warp records are the host's mask, one word per warp as in the forward: bit e − 32
//     for event e (the host's choice: every kind, one kind a step, or none);
//   - a function of the kernel (a role, a helper) records through TRACE_PARAM and TRACE_ARG: the
//     warp's state is passed by reference, which inlining leaves in registers;
//   - the end of store_dkdv stores the CTA's end clock and global timer (the SM clock over its run),
//     as the forward's epilogue does.
#pragma once

#include "../../attention/common/trace_recorder.cuh"

namespace trace_bwd {

constexpr uint32_t FIRST = 32;  // the first backward event
enum TraceBackwardEvent : uint32_t {
    kload_q = FIRST, kload_do, kload_kv,  // copies issued (TMA; with dO, warp-specialized, the row statistics)
    kwait_kv,                             // waiting for K and V (once a CTA)
    kwait_empty,                          // the load warp waits for a free Q/dO stage
    kwait_qdo,                            // a consumer waits for its step's Q and dO
    kqk, kwait_qk,                        // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ issued (one event: a branch between
                                          // them would make ptxas fence dPᵀ's accumulators); Sᵀ retired
    ksoftmax, kwait_dp, kds,              // Pᵀ = 2^(Sᵀ·scale − lse₂); dPᵀ retired; dSᵀ = Pᵀ ∘ (dPᵀ − D), both to bf16
    kdvdk,                                // dV += Pᵀ dO and dK += dSᵀ Q issued
    kwait_ds_free, kstore_ds, kwait_ds,   // dSᵀ's tile free again; dSᵀ stored; both warpgroups' halves in
    kdq, kwait_dq, kwait_dvdk,            // dQ = dS K issued; retired (and dV, dK with it); dV, dK without dQ
    kwait_dq_read, kstore_dq,             // dQ's tile read by the last reduce-add; this step's share in it
    kwait_turn,                           // the deterministic mode's turn: the key blocks before it have added
    kadd_dq, kwait_dq_done,               // dQ added (atomics; or the bulk reduce-add issued); complete, counted
    kwait_step,                           // the step's end: its Q, dO and dSᵀ may be overwritten
    kwait_dq_tile,                        // a dQ warp waits for its consumer's share
    kstore_dkdv,                          // dK · scale and dV to global memory (once a CTA)
    kevent_end
};
static_assert(FIRST >= kevent_count, "numbered above the forward's events");
static_assert(kevent_end - FIRST <= 32, "one bit per event in a warp's 32-bit mask");
constexpr int NEVENTS = kevent_end - FIRST;

__host__ __device__ constexpr uint32_t bit(uint32_t e) { return 1u << (e - FIRST); }
constexpr uint32_t SPANS = bit(kwait_kv) | bit(kstore_dkdv);       // their start read at TRACE_BEGIN
constexpr uint32_t MARKS = bit(kload_q) | bit(kload_do) | bit(kload_kv);  // instants: TRACE_MARK

// One row, when this warp records the kind and has room; by lane 0 (the other lanes' end is their
// next). MODE 0: a stamp (start 0: the end of the warp's event before it); 1: with its start; 2: an
// instant (start = end). The clock is read behind the branch: a skipped row reads none.
template <uint32_t EVENT, int MODE>
__device__ __forceinline__ void record(TraceWarp& w, int tile, int kv, uint32_t start) {
    if constexpr (MODE == 2) {
        asm volatile(
            "{\n"
            ".reg .pred skip, room;\n"
            ".reg .b32 t, meta;\n"
            ".reg .b64 at, clk;\n"
            "and.b32 t, %1, %3;\n"
            "setp.eq.u32 skip, t, 0;\n"
            "@skip bra.uni TRACE_SKIP;\n"
            "mov.u64 clk, %%clock64;\n"
            "cvt.u32.u64 t, clk;\n"
            "shl.b32 meta, %5, 8;\n"
            "or.b32 meta, meta, %4;\n"
            "mad.wide.s32 at, %0, 16, %7;\n"
            "setp.lt.s32 room, %0, %2;\n"
            "@room st.global.v4.b32 [at], {meta, %6, t, t};\n"
            "add.s32 %0, %0, 1;\n"
            "TRACE_SKIP:\n"
            "}\n"
            : "+r"(w.next)
            : "r"(w.kinds), "r"(w.end), "n"(bit(EVENT)), "n"(EVENT), "r"(tile), "r"(kv), "l"(g_trace.events));
    } else {
        asm volatile(
            "{\n"
            ".reg .pred skip, room;\n"
            ".reg .b32 t, meta;\n"
            ".reg .b64 at, clk;\n"
            "and.b32 t, %1, %3;\n"
            "setp.eq.u32 skip, t, 0;\n"
            "@skip bra.uni TRACE_SKIP;\n"
            "mov.u64 clk, %%clock64;\n"
            "cvt.u32.u64 t, clk;\n"
            "shl.b32 meta, %5, 8;\n"
            "or.b32 meta, meta, %4;\n"
            "mad.wide.s32 at, %0, 16, %8;\n"
            "setp.lt.s32 room, %0, %2;\n"
            "@room st.global.v4.b32 [at], {meta, %6, %7, t};\n"
            "add.s32 %0, %0, 1;\n"
            "TRACE_SKIP:\n"
            "}\n"
            : "+r"(w.next)
            : "r"(w.kinds), "r"(w.end), "n"(bit(EVENT)), "n"(EVENT), "r"(tile), "r"(kv), "r"(MODE ? start : 0u),
              "l"(g_trace.events));
    }
}

template <uint32_t EVENT>
__device__ __forceinline__ void begin(uint32_t (&start)[NEVENTS]) {
    static_assert(EVENT >= FIRST && EVENT < kevent_end, "a backward event");
    if constexpr (SPANS & bit(EVENT)) start[EVENT - FIRST] = trace_now();
}

template <uint32_t EVENT>
__device__ __forceinline__ void end(TraceWarp& w, const uint32_t (&start)[NEVENTS], int tile, int kv) {
    static_assert(!(MARKS & bit(EVENT)), "a copy issued is an instant: TRACE_MARK");
    if constexpr (SPANS & bit(EVENT)) {
        record<EVENT, 1>(w, tile, kv, start[EVENT - FIRST]);
    } else {
        record<EVENT, 0>(w, tile, kv, 0u);
    }
    if constexpr (EVENT == kstore_dkdv) trace_end_time(w);
}

template <uint32_t EVENT>
__device__ __forceinline__ void mark(TraceWarp& w, int tile, int kv) {
    static_assert(MARKS & bit(EVENT), "only a copy issued is an instant");
    record<EVENT, 2>(w, tile, kv, 0u);
}

}  // namespace trace_bwd

// The backward's trace points (trace_backward.cuh), in place of the forward's.
#undef TRACE_INIT
#undef TRACE_BEGIN
#undef TRACE_END
#undef TRACE_MARK
#define TRACE_INIT()                                        \
    __shared__ int trace_slot_shared_;                       \
    TraceWarp trace_warp_ = trace_init(&trace_slot_shared_); \
    uint32_t trace_start_[trace_bwd::NEVENTS]
#define TRACE_BEGIN(event) trace_bwd::begin<trace_bwd::k##event>(trace_start_)
#define TRACE_END(event, tile, kv) trace_bwd::end<trace_bwd::k##event>(trace_warp_, trace_start_, (tile), (kv))
#define TRACE_MARK(event, tile, kv) trace_bwd::mark<trace_bwd::k##event>(trace_warp_, (tile), (kv))
#define TRACE_PARAM , TraceWarp &trace_warp_, uint32_t(&trace_start_)[trace_bwd::NEVENTS]
#define TRACE_ARG , trace_warp_, trace_start_
