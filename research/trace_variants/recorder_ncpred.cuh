// Diagnostic recorder: no step trace points; of the other events, the wait for Q only, recorded by
// recorder_pred.cuh's predicated record (no branch).
#pragma once
#include "recorder_pred.cuh"
template <uint32_t EVENT>
__device__ __forceinline__ void trace_end_ncpred(TraceWarp& w, const uint32_t (&start)[kevent_count], int tile, int kv) {
    if constexpr (EVENT == kwait_q) trace_record_pred<EVENT>(w, tile, kv, start[EVENT]);
}
#undef TRACE_END
#undef TRACE_MARK
#undef TRACE_BEGIN
#define TRACE_BEGIN(event) \
    if constexpr (k##event == kwait_q) trace_start_[kwait_q] = trace_now()
#define TRACE_END(event, tile, kv) trace_end_ncpred<k##event>(trace_warp_, trace_start_, (tile), (kv))
#define TRACE_MARK(event, tile, kv) \
    do {                            \
    } while (0)
