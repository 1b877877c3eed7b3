// Trace recorder variant "cursor" (see recorder_impl.cuh): guard TV_GUARD_CURSOR, saturating cursor: 0.
#pragma once
#define TV_GUARD TV_GUARD_CURSOR
#define TV_SATURATE 0
#include "recorder_impl.cuh"
