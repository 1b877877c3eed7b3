// The contract between every RMSNorm stage (Part II, kernels/rmsnorm/NN_slug/kernel.cu) and its
// Python binding (kernels/hopattn/rowwise_native.cpp).
//
// A stage is compiled into its own shared library, as an attention stage is, and exports:
//   hopattn_rmsnorm_launch    runs the forward on a stream; returns 0, or 1 with an error message;
//   hopattn_rmsnorm_describe  which kernel the launch would run for these parameters, and what the
//                             compiled kernel needs (threads, rows per CTA, cluster, registers).
// Self-contained (the attention ABI is not included): a change there never touches this lineage.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

#define HOPATTN_RMSNORM_ABI_VERSION 1

// Element types of x, weight and out (out has x's type; weight too, when given).
enum RmsDtype : int { RMS_BF16 = 0, RMS_FP16 = 1, RMS_FP32 = 2 };

// out[r, c] = x[r, c] · rstd[r] · weight[c], rstd[r] = 1 / sqrt(mean_c x[r, c]² + eps), every
// product and sum in fp32, out rounded once. Rows are addressed through their strides (elements);
// the column axis is contiguous.
struct RmsNormParams {
    const void* x;       // [rows, cols], row r at x + r · x_stride
    const void* weight;  // [cols], contiguous; null: no weight (as if all ones)
    void* out;           // [rows, cols], row r at out + r · out_stride
    float* rstd;         // null, or fp32 [rows], contiguous: 1 / sqrt(mean(x²) + eps), for the backward
    int64_t rows;        // >= 0
    int64_t cols;        // >= 1
    int64_t x_stride;    // >= cols
    int64_t out_stride;  // >= cols
    float eps;           // >= 0
    int dtype;           // RmsDtype
    int num_sms;         // multiprocessors of the device (for grids that size themselves by it)
};

// What hopattn_rmsnorm_describe reports: the kernel chosen for the parameters, and its attributes.
struct RmsKernelInfo {
    int abi_version;
    char variant[64];      // which kernel and configuration, e.g. "rows<bf16, 128 threads/row, 8 vectors>"
    int threads;           // threads per CTA at launch
    int rows_per_cta;      // rows one CTA normalizes (at a time)
    int threads_per_row;   // threads that share a row, within one CTA
    int cluster;           // CTAs of a cluster that share a row (1: no cluster)
    int vector_bytes;      // bytes per global load and store (16, or the element size on the scalar path)
    int elements_per_thread;  // of the row held on chip per thread (0: the row is read twice, not held)
    int dynamic_smem;      // bytes of dynamic shared memory at launch
    int static_smem;       // bytes of static shared memory (cudaFuncGetAttributes)
    int registers;         // registers per thread
    int max_threads;       // maxThreadsPerBlock of the compiled kernel
    int local_bytes;       // local memory per thread (spills, stack)
};

#ifndef HOPATTN_EXPORT
#define HOPATTN_EXPORT extern "C" __attribute__((visibility("default")))
#endif

// Turns a CUDA error into a message for Python and returns 1 from the calling function.
#define RMS_CHECK(call, err, errlen)                                                        \
    do {                                                                                    \
        cudaError_t status_ = (call);                                                       \
        if (status_ != cudaSuccess) {                                                       \
            snprintf((err), (errlen), "%s failed: %s", #call, cudaGetErrorString(status_)); \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

// The checks every stage makes before a launch (the Python side makes them first, with the
// argument names); returns 0, or 1 with a message.
inline int rms_check_params(const RmsNormParams* p, char* err, int errlen) {
    const char* why = nullptr;
    if (p->dtype < RMS_BF16 || p->dtype > RMS_FP32) why = "dtype must be RMS_BF16, RMS_FP16 or RMS_FP32";
    else if (p->rows < 0 || p->cols < 1) why = "rows must be >= 0 and cols >= 1";
    else if (p->cols > INT32_MAX) why = "cols must fit in 32 bits";
    else if (p->x_stride < p->cols || p->out_stride < p->cols) why = "row strides must be >= cols";
    else if (!(p->eps >= 0.0f)) why = "eps must be >= 0";
    else if (p->rows > 0 && (!p->x || !p->out)) why = "x and out must be given";
    if (why) {
        snprintf(err, errlen, "%s", why);
        return 1;
    }
    return 0;
}

// Fills the attributes of RmsKernelInfo from the compiled kernel.
template <typename Kernel>
inline int rms_describe_kernel(Kernel kernel, RmsKernelInfo* info, char* err, int errlen) {
    cudaFuncAttributes attr;
    RMS_CHECK(cudaFuncGetAttributes(&attr, kernel), err, errlen);
    info->abi_version = HOPATTN_RMSNORM_ABI_VERSION;
    info->static_smem = (int)attr.sharedSizeBytes;
    info->registers = attr.numRegs;
    info->max_threads = attr.maxThreadsPerBlock;
    info->local_bytes = (int)attr.localSizeBytes;
    return 0;
}
