// Diagnostic recorder (see recorder_fence.cuh): the clock read at the softmax's end only.
#pragma once
#define TV_FENCE_KINDS trace_bit(ksoftmax)
#include "recorder_fence.cuh"
