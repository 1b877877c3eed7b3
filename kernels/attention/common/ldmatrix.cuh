// ldmatrix: a warp loads four 8x8 bf16 matrices from shared memory into mma.sync fragments.
// Introduced by stage 03 and shared, unchanged, by the later mma.sync stages.
//
// Lanes 8i..8i+7 give the addresses of the 8 rows (16 bytes each) of matrix i; afterwards register
// i of lane t holds row t/4, columns 2(t%4) and 2(t%4)+1 of matrix i — the layout of one mma.sync
// A or B fragment register. The .trans form delivers the transpose: column t/4, rows 2(t%4)..+1.
#pragma once

#include <cstdint>

__device__ __forceinline__ uint32_t smem_addr(const void* ptr) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t row_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row_addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], uint32_t row_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row_addr));
}
