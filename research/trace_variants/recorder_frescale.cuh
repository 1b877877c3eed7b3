// Diagnostic recorder (see recorder_fence.cuh): the clock read at the rescale's end only.
#pragma once
#define TV_FENCE_KINDS trace_bit(krescale)
#include "recorder_fence.cuh"
