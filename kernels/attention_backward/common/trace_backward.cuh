// The backward's trace points: the forward's (attention/common/trace.cuh: TRACE_INIT, TRACE_BEGIN,
// TRACE_END, TRACE_MARK) and two more for a kernel cut into functions, which pass the trace state on
// as a parameter:
//
//   __device__ void consumer_role(const Smem& s, int wg TRACE_PARAM);   after a function's last parameter
//   consumer_role(s, wg TRACE_ARG);                                     and after its call's last argument
//
// Compiled without -DHOPATTN_TRACE every one is empty (TRACE_PARAM and TRACE_ARG are nothing at all),
// so a stage's machine code is what it is without them (tests/test_trace_points.py compares the SASS).
// The traced build force-includes the backward's recorder (trace_recorder_backward.cuh), which names
// the backward's events (trace_bwd::TraceBackwardEvent, without the k prefix here too) and records
// them. `tile` counts the key blocks the CTA has started (0: one per CTA), `kv` the query-block step
// within it (-1: none).
#pragma once

#include "../../attention/common/trace.cuh"

#ifndef HOPATTN_TRACE_RECORDER  // defined by the recorders in the traced build

#define TRACE_PARAM
#define TRACE_ARG

#endif
