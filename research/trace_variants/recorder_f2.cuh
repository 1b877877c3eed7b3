// Diagnostic recorder (see recorder_fence.cuh): clock reads at the softmax's and the rescale's end.
#pragma once
#define TV_FENCE_KINDS (trace_bit(ksoftmax) | trace_bit(krescale))
#include "recorder_fence.cuh"
