// Per-warp event traces, for the timeline diagrams: what each warp of a CTA did, and when.
//
// Compiled with -DHOPATTN_TRACE, the trace points of a stage record, for lane 0 of every warp of
// the CTAs that run on one chosen SM, the SM cycle counter (clock64) at the start and the end of
// each event: loads issued, waits on data, buffers and turns, the two GEMMs, the softmax, the
// epilogue. Compiled without the flag every macro below is empty, so the stage's machine code is
// exactly what it is without trace points (tests/test_trace_points.py compares the SASS).
//
// The recorder itself lives in trace_recorder.cuh, which no stage includes: the traced build
// force-includes it (nvcc -include, see hopattn.build), so changing how events are recorded does not
// change any stage's sources, their hash, or the numbers measured from them.
//
//   TRACE_INIT();                  once per kernel, at the top, by every thread (claims a slot)
//   TRACE_BEGIN(qk);               the start of an event: reads the clock into a local
//   TRACE_END(qk, tile, kv);       its end: one record (event, output tile, K/V step, start, end)
//   TRACE_MARK(load_k, tile, kv);  an instant (an issued copy): start == end
//
// Events are named by the enumerators of TraceEvent (trace_recorder.cuh) without the k prefix. `tile` counts the output
// tiles this CTA has started (0, 1, ...), `kv` the K/V step within it (-1: none). The host side
// (bench.trace, through hopattn_trace_setup) gives the buffers and reads them back after the launch.
#pragma once

#ifndef HOPATTN_TRACE_RECORDER  // defined by trace_recorder.cuh in the traced build

#define TRACE_INIT() \
    do {             \
    } while (0)
#define TRACE_BEGIN(event) \
    do {                   \
    } while (0)
#define TRACE_END(event, tile, kv) \
    do {                           \
    } while (0)
#define TRACE_MARK(event, tile, kv) \
    do {                            \
    } while (0)

#endif
