// Bulk copy from global to shared memory (sm_90): a contiguous run of bytes, completing on an
// mbarrier like a tensor copy. Introduced by backward stage 06 (the row statistics of a step).
#pragma once

#include <cstdint>

// shared[0 .. bytes) = global[0 .. bytes), both 16-byte aligned, bytes a multiple of 16; the bytes
// count towards `bar`'s transaction count (announced by the caller's arrive.expect_tx).
__device__ __forceinline__ void bulk_load(uint32_t shared, const void* global, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(shared), "l"(global), "r"(bytes), "r"(bar)
                 : "memory");
}
