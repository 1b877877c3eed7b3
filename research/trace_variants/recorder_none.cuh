// Diagnostic recorder (see recorder_fence.cuh): no step trace points; every other event records.
#pragma once
#define TV_FENCE_KINDS 0u
#include "recorder_fence.cuh"
