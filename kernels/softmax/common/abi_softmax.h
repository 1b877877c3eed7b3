// The contract between every softmax stage, forward (kernels/softmax/NN_slug/kernel.cu) and backward
// (kernels/softmax_backward/NN_slug/kernel.cu), and the Python binding (kernels/hopattn/rowwise_native.cpp).
// The element types, the error macro, the export attribute and the kernel-info record are the RMSNorm
// lineage's (kernels/rmsnorm/common/abi_rmsnorm.h): Part II's rowwise lineages share them.
//
// A forward stage exports hopattn_softmax_launch and hopattn_softmax_describe; a backward stage
// hopattn_softmax_backward_launch and hopattn_softmax_backward_describe. Each returns 0, or 1 with a
// message in err.
#pragma once

#include "../../rmsnorm/common/abi_rmsnorm.h"

#define HOPATTN_SOFTMAX_ABI_VERSION 1

// y[r, c] = exp(x[r, c] − max_c x[r, c]) / Σ_c exp(x[r, c] − max_c x[r, c]), over the last axis, in
// fp32, y rounded once. A row of −inf gives NaN (0 / 0), as torch.softmax does.
struct SoftmaxParams {
    const void* x;       // [rows, cols], row r at x + r · x_stride
    void* y;             // [rows, cols], row r at y + r · y_stride
    int64_t rows;        // >= 0
    int64_t cols;        // >= 1
    int64_t x_stride;    // >= cols
    int64_t y_stride;    // >= cols
    int dtype;           // RmsDtype: x and y
    int num_sms;
};

// dx[r, c] = y[r, c] · (dy[r, c] − Σ_c y[r, c] · dy[r, c]), from the forward's output y, in fp32.
struct SoftmaxBackwardParams {
    const void* y;       // [rows, cols], row r at y + r · y_stride: the forward's output
    const void* dy;      // [rows, cols], row r at dy + r · dy_stride
    void* dx;            // [rows, cols], row r at dx + r · dx_stride
    int64_t rows;
    int64_t cols;
    int64_t y_stride;
    int64_t dy_stride;
    int64_t dx_stride;
    int dtype;
    int num_sms;
};

inline int softmax_check_params(const SoftmaxParams* p, char* err, int errlen) {
    const char* why = nullptr;
    if (p->dtype < RMS_BF16 || p->dtype > RMS_FP32) why = "dtype must be RMS_BF16, RMS_FP16 or RMS_FP32";
    else if (p->rows < 0 || p->cols < 1) why = "rows must be >= 0 and cols >= 1";
    else if (p->cols > INT32_MAX) why = "cols must fit in 32 bits";
    else if (p->x_stride < p->cols || p->y_stride < p->cols) why = "row strides must be >= cols";
    else if (p->rows > 0 && (!p->x || !p->y)) why = "x and y must be given";
    if (why) {
        snprintf(err, errlen, "%s", why);
        return 1;
    }
    return 0;
}

inline int softmax_backward_check_params(const SoftmaxBackwardParams* p, char* err, int errlen) {
    const char* why = nullptr;
    if (p->dtype < RMS_BF16 || p->dtype > RMS_FP32) why = "dtype must be RMS_BF16, RMS_FP16 or RMS_FP32";
    else if (p->rows < 0 || p->cols < 1) why = "rows must be >= 0 and cols >= 1";
    else if (p->cols > INT32_MAX) why = "cols must fit in 32 bits";
    else if (p->y_stride < p->cols || p->dy_stride < p->cols || p->dx_stride < p->cols) why = "row strides must be >= cols";
    else if (p->rows > 0 && (!p->y || !p->dy || !p->dx)) why = "y, dy and dx must be given";
    if (why) {
        snprintf(err, errlen, "%s", why);
        return 1;
    }
    return 0;
}

// Fills the attributes of RmsKernelInfo (the rowwise lineages' record) from the compiled kernel, with
// this ABI's version.
template <typename Kernel>
inline int softmax_describe_kernel(Kernel kernel, RmsKernelInfo* info, char* err, int errlen) {
    if (rms_describe_kernel(kernel, info, err, errlen)) return 1;
    info->abi_version = HOPATTN_SOFTMAX_ABI_VERSION;
    return 0;
}
