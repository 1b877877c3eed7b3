// Diagnostic recorder (see recorder_fence.cuh): no step trace points; of the other events, the producer's only.
#pragma once
#define TV_FENCE_KINDS 0u
#define TV_KEEP_OTHERS TRACE_PRODUCER_KINDS
#include "recorder_fence.cuh"
