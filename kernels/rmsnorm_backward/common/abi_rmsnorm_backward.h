// The contract between every RMSNorm backward stage (Part II, kernels/rmsnorm_backward/NN_slug/kernel.cu)
// and its Python binding (kernels/hopattn/rowwise_native.cpp), beside the forward's (abi_rmsnorm.h,
// whose element types, error macro and export attribute it uses).
//
// A stage is compiled into its own shared library and exports:
//   hopattn_rmsnorm_backward_workspace  the fp32 scratch a launch with these parameters needs, in bytes
//                                       (the weight gradient's partial sums, the rows' coefficients);
//   hopattn_rmsnorm_backward_launch     runs the backward on a stream; returns 0, or 1 with an error message;
//   hopattn_rmsnorm_backward_describe   which kernels the launch would run, and what they need.
#pragma once

#include "../../rmsnorm/common/abi_rmsnorm.h"

#define HOPATTN_RMSNORM_BACKWARD_ABI_VERSION 1

// With x̂ = x · rstd[r] (rstd saved by the forward) and g = weight · dy (dy where there is no weight),
//
//   dx[r, c] = rstd[r] · (g[r, c] − x̂[r, c] · m[r]),   m[r] = rstd[r] · (Σ_c x[r, c] · g[r, c] + drstd[r]) / cols
//   dw[c]    = Σ_r dy[r, c] · x̂[r, c]
//
// (m is mean_c(x̂ · g), plus the part of the gradient that reaches x through rstd itself when rstd
// reached the loss: d rstd / d x[c] = −rstd³ · x[c] / cols). Every product and sum in fp32; dx and dw
// rounded once. Rows are addressed through their strides (elements); the column axis is contiguous.
struct RmsNormBackwardParams {
    const void* x;         // [rows, cols], row r at x + r · x_stride: the forward's input
    const void* weight;    // [cols], contiguous; null: no weight (as if all ones)
    const void* dy;        // [rows, cols], row r at dy + r · dy_stride: the gradient of the forward's output
    const float* rstd;     // fp32 [rows], contiguous: the forward's 1 / sqrt(mean(x²) + eps)
    const float* drstd;    // null, or fp32 [rows], contiguous: the gradient of rstd
    void* dx;              // [rows, cols], row r at dx + r · dx_stride
    void* dw;              // null (no weight gradient), or [cols] of weight's type; needs weight
    void* workspace;       // fp32 scratch of at least hopattn_rmsnorm_backward_workspace's bytes, 16-byte aligned
    int64_t workspace_bytes;
    int64_t rows;          // >= 0
    int64_t cols;          // >= 1
    int64_t x_stride;      // >= cols
    int64_t dy_stride;     // >= cols
    int64_t dx_stride;     // >= cols
    int dtype;             // RmsDtype: x, weight, dy, dx and dw
    int num_sms;           // multiprocessors of the device (persistent grids size themselves by it)
};

// What hopattn_rmsnorm_backward_describe reports: the main kernel chosen for the parameters, its
// grid, and the attributes of it and of the kernel that sums the weight gradient's partials.
struct RmsBackwardInfo {
    int abi_version;
    char variant[96];         // e.g. "rows<bf16, 256 threads/row, 2 vectors>, persistent"
    int threads;              // threads per CTA of the main kernel
    int rows_per_cta;         // rows one CTA holds at a time
    int threads_per_row;      // threads that share a row, within one CTA
    int cluster;              // CTAs of a cluster that share a row (1: no cluster)
    int vector_bytes;         // bytes per global load and store of x, dy and dx
    int elements_per_thread;  // of x (and of dy) held on chip per thread (0: not held, read twice)
    int64_t ctas;             // CTAs of the main kernel's grid, for these rows
    int64_t partial_rows;     // fp32 rows of the weight gradient's partial sums (0: none)
    int reads;                // times each element of x and dy leaves memory
    int dynamic_smem;
    int static_smem;
    int registers;
    int max_threads;
    int local_bytes;          // local memory per thread (spills, stack) of the main kernel
    int sum_registers;        // the partial-sum kernel's registers (0: none runs)
    int sum_local_bytes;
};

// The checks every stage makes before a launch (the Python side makes them first, with the argument
// names); returns 0, or 1 with a message.
inline int rms_backward_check_params(const RmsNormBackwardParams* p, char* err, int errlen) {
    const char* why = nullptr;
    if (p->dtype < RMS_BF16 || p->dtype > RMS_FP32) why = "dtype must be RMS_BF16, RMS_FP16 or RMS_FP32";
    else if (p->rows < 0 || p->cols < 1) why = "rows must be >= 0 and cols >= 1";
    else if (p->cols > INT32_MAX) why = "cols must fit in 32 bits";
    else if (p->x_stride < p->cols || p->dy_stride < p->cols || p->dx_stride < p->cols) why = "row strides must be >= cols";
    else if (p->dw && !p->weight) why = "dw needs weight";
    else if (p->rows > 0 && (!p->x || !p->dy || !p->rstd || !p->dx)) why = "x, dy, rstd and dx must be given";
    else if (p->workspace_bytes < 0 || (p->workspace_bytes > 0 && !p->workspace)) why = "workspace_bytes without a workspace";
    else if (reinterpret_cast<uintptr_t>(p->workspace) % 16) why = "the workspace must be 16-byte aligned";
    if (why) {
        snprintf(err, errlen, "%s", why);
        return 1;
    }
    return 0;
}

// Fills the main kernel's attributes of RmsBackwardInfo.
template <typename Kernel>
inline int rms_backward_describe_kernel(Kernel kernel, RmsBackwardInfo* info, char* err, int errlen) {
    cudaFuncAttributes attr;
    RMS_CHECK(cudaFuncGetAttributes(&attr, kernel), err, errlen);
    info->abi_version = HOPATTN_RMSNORM_BACKWARD_ABI_VERSION;
    info->static_smem = (int)attr.sharedSizeBytes;
    info->registers = attr.numRegs;
    info->max_threads = attr.maxThreadsPerBlock;
    info->local_bytes = (int)attr.localSizeBytes;
    return 0;
}

// Fills the partial-sum kernel's attributes of RmsBackwardInfo.
template <typename Kernel>
inline int rms_backward_describe_sum(Kernel kernel, RmsBackwardInfo* info, char* err, int errlen) {
    cudaFuncAttributes attr;
    RMS_CHECK(cudaFuncGetAttributes(&attr, kernel), err, errlen);
    info->sum_registers = attr.numRegs;
    info->sum_local_bytes = (int)attr.localSizeBytes;
    return 0;
}

// A launch with no rows still owes a weight gradient: zeros.
inline int rms_backward_no_rows(const RmsNormBackwardParams* p, cudaStream_t stream, char* err, int errlen) {
    const size_t bytes = p->dtype == RMS_FP32 ? 4 : 2;
    if (p->dw) RMS_CHECK(cudaMemsetAsync(p->dw, 0, (size_t)p->cols * bytes, stream), err, errlen);
    return 0;
}
