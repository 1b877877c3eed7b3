// Diagnostic recorder (see recorder_fence.cuh): f2 and the GEMMs' issue (QK, PV).
#pragma once
#define TV_FENCE_KINDS (trace_bit(ksoftmax) | trace_bit(krescale) | trace_bit(kqk) | trace_bit(kpv))
#include "recorder_fence.cuh"
