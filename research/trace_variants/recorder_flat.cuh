// Trace recorder variant "flat" (see recorder_impl.cuh): guard TV_GUARD_NONE, saturating cursor: 1.
#pragma once
#define TV_GUARD TV_GUARD_NONE
#define TV_SATURATE 1
#include "recorder_impl.cuh"
