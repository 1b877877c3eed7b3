// Bulk reduce-add from shared to global memory (sm_90): the copy engine adds a contiguous run of
// floats into global memory, as one operation. Introduced by backward stage 04.
//
// A red.global.add.v4.f32 is one request to L2 per 16 bytes, issued by a thread that then has to
// keep issuing; a bulk reduce-add hands a whole tile (here 16 KB) to the TMA unit, which sends it
// to L2 in full lines while the threads go on. The source must stay untouched until the operation
// has read it: cp.async.bulk.wait_group.read (attention/common/tma_store.cuh) before it is written
// again, and before the CTA exits.
#pragma once

#include <cstdint>

// global[0 .. bytes/4) += shared[0 .. bytes/4) (fp32), both 16-byte aligned, bytes a multiple of 16.
// Joins the issuing thread's current bulk async-group (bulk_commit_group closes it).
__device__ __forceinline__ void bulk_reduce_add_f32(float* global, uint32_t shared, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 ::"l"(global), "r"(shared), "r"(bytes)
                 : "memory");
}
