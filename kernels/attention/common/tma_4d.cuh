// TMA over 4-D tensors [batch, heads, len, 128] with any strides: loads and stores that stop at
// the end of each head's rows. Introduced by stage 17 (masks) and shared by the stages after it.
//
// Stages 07-16 viewed Q, K, V and O as one 2-D matrix [batch * heads * len, 128]: a box of rows
// past the end of one head's sequence would read the next head's rows, so lengths had to be
// multiples of the tile, and the matrix view needs contiguous BHSD. A 4-D map keeps the four axes
// apart — (head_dim, len, heads, batch), innermost first, each with its own stride — so:
//   - a box that runs past `len` is filled with zeros on load and clipped on store, per head;
//   - BHSD and BSHD (and any other layout whose head-dim axis is dense and whose strides are
//     multiples of 16 bytes) are the same map with different strides: no copy.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cuda.h>  // CUtensorMap and its enums only: the driver function is looked up at run time
#include <cuda_runtime.h>

// Copy the box at (col, row, head, batch) into shared memory at `dst`, completing its bytes on the
// mbarrier `bar`. Rows past the tensor's length arrive as zeros (and still count as bytes).
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int col, int row, int head, int batch,
                                            uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
        ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(head), "r"(batch), "r"(bar)
        : "memory");
}

// Copy the box at shared address `src` to (col, row, head, batch) of the tensor; rows past its
// length are not written. Joins the issuing thread's current bulk async-group (tma_store.cuh).
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int col, int row, int head,
                                             int batch) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n"
                 ::"l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(head), "r"(batch), "r"(src)
                 : "memory");
}

// Host: bf16 [batch][heads][len][cols] with element strides (batch, head, row) and a dense last
// axis, read or written in boxes of [box_rows][box_cols] with the 128-byte swizzle (as
// make_tma_2d_bf16 in tma.cuh). The copy engine needs 16-byte aligned bases and strides.
inline int make_tma_4d_bf16(CUtensorMap* map, const void* base, int batch, int heads, int len, int cols,
                            const int64_t strides_elems[3], uint32_t box_rows, uint32_t box_cols, const char* name,
                            char* err, int errlen) {
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
    if (reinterpret_cast<uintptr_t>(base) % 16) {
        snprintf(err, errlen, "%s: the TMA needs a 16-byte aligned base address", name);
        return 1;
    }
    for (int i = 0; i < 3; ++i) {
        if (strides_elems[i] <= 0 || strides_elems[i] % 8 || strides_elems[i] >= (int64_t(1) << 39)) {
            snprintf(err, errlen, "%s: the TMA needs positive strides that are multiples of 8 elements (16 bytes), "
                     "got (batch, head, row) = (%lld, %lld, %lld)", name, (long long)strides_elems[0],
                     (long long)strides_elems[1], (long long)strides_elems[2]);
            return 1;
        }
    }
    const cuuint64_t dims[4] = {cuuint64_t(cols), cuuint64_t(len), cuuint64_t(heads), cuuint64_t(batch)};
    const cuuint64_t strides[3] = {cuuint64_t(strides_elems[2]) * 2, cuuint64_t(strides_elems[1]) * 2,
                                   cuuint64_t(strides_elems[0]) * 2};  // bytes: row, head, batch
    const cuuint32_t box[4] = {box_cols, box_rows, 1, 1};
    const cuuint32_t element_strides[4] = {1, 1, 1, 1};
    const CUresult result = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims, strides, box,
                                   element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (result != CUDA_SUCCESS) {
        snprintf(err, errlen, "%s: cuTensorMapEncodeTiled failed with CUresult %d", name, static_cast<int>(result));
        return 1;
    }
    return 0;
}
