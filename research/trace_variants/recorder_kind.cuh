// Trace recorder variant "kind" (see recorder_impl.cuh): guard TV_GUARD_KIND, saturating cursor: 1.
#pragma once
#define TV_GUARD TV_GUARD_KIND
#define TV_SATURATE 1
#include "recorder_impl.cuh"
