// Diagnostic recorder (see recorder_fence.cuh): no step trace points; of the other events, the store only.
#pragma once
#define TV_FENCE_KINDS 0u
#define TV_KEEP_OTHERS trace_bit(kstore)
#include "recorder_fence.cuh"
