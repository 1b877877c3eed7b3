// Diagnostic recorder (see recorder_fence.cuh): the clock read at the end of the GEMMs' issue only (QK, PV).
#pragma once
#define TV_FENCE_KINDS (trace_bit(kqk) | trace_bit(kpv))
#include "recorder_fence.cuh"
