// Diagnostic recorder (see recorder_fence.cuh): the clock read at the end of each wait of a K/V step only.
#pragma once
#define TV_FENCE_KINDS (trace_bit(kwait_k) | trace_bit(kwait_v) | trace_bit(kwait_kv) | trace_bit(kwait_turn) | trace_bit(kwait_qk) | trace_bit(kwait_pv))
#include "recorder_fence.cuh"
