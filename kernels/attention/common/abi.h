// The contract between every stage and the Python binding (kernels/hopattn/native.cpp).
//
// Each stage is compiled into its own shared library that exports two C functions:
//   hopattn_launch   launches the forward pass on a stream, returns 0 or writes an error message;
//   hopattn_describe reports what the compiled kernel needs (threads, shared memory, registers).
// The binding loads a stage with dlopen, so stages never share symbols and each one is cached
// and rebuilt on its own.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

#define HOPATTN_ABI_VERSION 2

struct AttnParams {
    const void* q;  // bf16, [batch, heads, len_q, head_dim] addressed through the strides below
    const void* k;  // bf16, [batch, heads, len_k, head_dim]
    const void* v;  // bf16, [batch, heads, len_k, head_dim]
    void* o;        // bf16, [batch, heads, len_q, head_dim]
    // Strides in elements for (batch, head, row); the head_dim axis is contiguous.
    int64_t q_stride[3];
    int64_t k_stride[3];
    int64_t v_stride[3];
    int64_t o_stride[3];
    int batch, heads, len_q, len_k, head_dim;
    float scale;  // softmax scale, usually 1/sqrt(head_dim)
    int causal;   // 0 or 1 (bottom-right aligned diagonal, as FlashAttention)
    int num_sms;  // multiprocessors on the device (for persistent grids)
    int kv_heads; // heads of k and v: `heads`, or a divisor of it (grouped-query; stages with gqa only)
    float* lse;   // null, or fp32 [batch, heads, len_q]: the log-sum-exp of each row (stages with lse only)
};

struct KernelInfo {
    int abi_version;
    int threads;             // threads per block at launch
    int dynamic_smem;        // bytes of dynamic shared memory at launch
    int static_smem;         // bytes of static shared memory (from cudaFuncGetAttributes)
    int registers;           // registers per thread
    int max_threads;         // maxThreadsPerBlock of the compiled kernel (__launch_bounds__)
    int local_bytes;         // local memory per thread (spills, stack)
    int block_m, block_n;    // tile of query rows per CTA and of KV rows per iteration
};

#define HOPATTN_EXPORT extern "C" __attribute__((visibility("default")))

// Turns a CUDA error into a message for Python and returns from the calling launcher.
#define HOPATTN_CHECK(call, err, errlen)                                                    \
    do {                                                                                    \
        cudaError_t status_ = (call);                                                       \
        if (status_ != cudaSuccess) {                                                       \
            snprintf((err), (errlen), "%s failed: %s", #call, cudaGetErrorString(status_)); \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

// Fills KernelInfo from the compiled kernel's attributes.
template <typename Kernel>
inline int describe_kernel(Kernel kernel, int threads, int dynamic_smem, int block_m, int block_n,
                           KernelInfo* info, char* err, int errlen) {
    cudaFuncAttributes attr;
    HOPATTN_CHECK(cudaFuncGetAttributes(&attr, kernel), err, errlen);
    info->abi_version = HOPATTN_ABI_VERSION;
    info->threads = threads;
    info->dynamic_smem = dynamic_smem;
    info->static_smem = (int)attr.sharedSizeBytes;
    info->registers = attr.numRegs;
    info->max_threads = attr.maxThreadsPerBlock;
    info->local_bytes = (int)attr.localSizeBytes;
    info->block_m = block_m;
    info->block_n = block_n;
    return 0;
}
