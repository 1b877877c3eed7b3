// TMA: bulk tensor copies from global to shared memory by the copy engine (sm_90).
// Introduced by stage 07 and shared by every later stage that loads with TMA.
//
// The host describes a tensor once (a CUtensorMap: base address, sizes, strides, the box one copy
// moves and how the box is swizzled in shared memory); one thread then moves a whole box with one
// instruction, and the bytes are counted against an mbarrier (see mbarrier.cuh) as they land.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cuda.h>  // CUtensorMap and its enums only: the driver function is looked up at run time
#include <cuda_runtime.h>

// Copy the box at coordinates (col, row) of a 2-D tensor into shared memory at `dst`, completing
// `bytes` of transactions on the mbarrier `bar`. The destination must be aligned as the swizzle
// requires (1024 bytes for the 128-byte swizzle).
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int col, int row, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
        ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(bar)
        : "memory");
}

// Host: a row-major bf16 matrix [rows][cols] (row pitch `row_bytes`) read in boxes of
// [box_rows][box_cols], stored in shared memory with the 128-byte swizzle: 16-byte chunk c of box
// row r lands at chunk c ^ (r % 8) of that 128-byte row. box_cols * 2 must be at most 128.
// cuTensorMapEncodeTiled is a driver function; it is fetched through the runtime so that the
// stage library does not link libcuda.
inline int make_tma_2d_bf16(CUtensorMap* map, const void* base, uint64_t rows, uint64_t cols, uint64_t row_bytes,
                            uint32_t box_rows, uint32_t box_cols, char* err, int errlen) {
    using EncodeFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                  const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    static EncodeFn encode = nullptr;
    if (encode == nullptr) {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult found;
        cudaError_t status = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                                              &found);
        if (status != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
            snprintf(err, errlen, "cuTensorMapEncodeTiled not found in the driver (%s)", cudaGetErrorString(status));
            return 1;
        }
        encode = reinterpret_cast<EncodeFn>(fn);
    }
    if (reinterpret_cast<uintptr_t>(base) % 16 || row_bytes % 16) {
        snprintf(err, errlen, "TMA needs 16-byte aligned tensors and row pitches");
        return 1;
    }
    const cuuint64_t dims[2] = {cols, rows};          // innermost first
    const cuuint64_t strides[1] = {row_bytes};        // bytes between rows (dimension 0 is dense)
    const cuuint32_t box[2] = {box_cols, box_rows};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUresult result = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box,
                                   element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (result != CUDA_SUCCESS) {
        snprintf(err, errlen, "cuTensorMapEncodeTiled failed with CUresult %d", static_cast<int>(result));
        return 1;
    }
    return 0;
}
