// The real recorder without the waits for K and V as stamps (prepared, not timed): their trace
// points read no clock, so their time counts in the event after them (the turn, or the QK issue),
// and a K/V step holds two clock reads fewer. What it would buy: one to four points of kernel time
// at stages 16-22 (`f7` against `fence` in bench/logs/trace-recorders-nvidia-h200-20261201T2005.log).
// A change of what the timelines show: the waits for K and V disappear from stages 16-22's pages
// (the older stages' wait for K/V, one event, stays).
#pragma once
#include "../../kernels/attention/common/trace_recorder.cuh"

template <uint32_t EVENT>
__device__ __forceinline__ void trace_end_nokv(TraceWarp& w, uint32_t (&stamp)[TRACE_NSTAMPS],
                                               const uint32_t (&start)[kevent_count], int tile, int kv) {
    if constexpr (EVENT != kwait_k && EVENT != kwait_v) trace_end<EVENT>(w, stamp, start, tile, kv);
}

#undef TRACE_END
#define TRACE_END(event, tile, kv) trace_end_nokv<k##event>(trace_warp_, trace_stamp_, trace_start_, (tile), (kv))
