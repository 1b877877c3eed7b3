// Diagnostic recorder (see recorder_fence.cuh): f6 and the turn.
#pragma once
#define TV_FENCE_KINDS (trace_bit(ksoftmax) | trace_bit(krescale) | trace_bit(kqk) | trace_bit(kpv) | \
                        trace_bit(kwait_qk) | trace_bit(kwait_pv) | trace_bit(kwait_turn))
#include "recorder_fence.cuh"
