// RMSNorm backward, stage 01: two plain kernels, a row per thread for dx and a column per thread for dw.
//
//   x̂ = x · rstd[r],  g = weight · dy,  m[r] = rstd[r] · (Σ_c x · g + drstd[r]) / cols
//   dx[r, c] = rstd[r] · (g[r, c] − x̂[r, c] · m[r])          (a sum along each row)
//   dw[c]    = Σ_r dy[r, c] · x̂[r, c]                        (a sum down each column)
//
// The backward has the forward's sum along a row, and a second sum across the rows: dw. The
// plainest correct way keeps them apart. The first kernel gives each thread a row and walks it
// twice, one element at a time (the sum of x · g, then dx), as the forward's stage 01 does; the
// second gives each thread a column and walks it down every row, reading x and dy a third time. Each
// dw[c] is one thread's sum in row order: the same bits on every run. Any row length, any row
// strides, bf16/fp16/fp32.
#include "../common/abi_rmsnorm_backward.h"
#include "../../rmsnorm/common/elements.cuh"

constexpr int kThreads = 128;  // threads per CTA of both kernels: a row each (dx), a column each (dw)

template <typename T>
__global__ void __launch_bounds__(kThreads) rmsnorm_bwd_row_per_thread(RmsNormBackwardParams p) {
    const int64_t row = (int64_t)blockIdx.x * kThreads + threadIdx.x;
    if (row >= p.rows) return;
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    const T* dy = static_cast<const T*>(p.dy) + row * p.dy_stride;
    const T* weight = static_cast<const T*>(p.weight);
    T* dx = static_cast<T*>(p.dx) + row * p.dx_stride;

    float dot = 0.0f;  // Σ x · g, in fp32 whatever T is
    for (int64_t c = 0; c < p.cols; ++c) {
        const float g = weight ? to_float(dy[c]) * to_float(weight[c]) : to_float(dy[c]);
        dot = fmaf(to_float(x[c]), g, dot);
    }
    const float rstd = p.rstd[row];
    const float m = rstd * (dot + (p.drstd ? p.drstd[row] : 0.0f)) / (float)p.cols;

    for (int64_t c = 0; c < p.cols; ++c) {  // the row again: from L1 or L2 if it is still there
        const float g = weight ? to_float(dy[c]) * to_float(weight[c]) : to_float(dy[c]);
        const float xhat = to_float(x[c]) * rstd;
        dx[c] = from_float<T>(rstd * fmaf(-xhat, m, g));
    }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) rmsnorm_bwd_dw_column_per_thread(RmsNormBackwardParams p) {
    const int64_t c = (int64_t)blockIdx.x * kThreads + threadIdx.x;
    if (c >= p.cols) return;
    const T* x = static_cast<const T*>(p.x) + c;
    const T* dy = static_cast<const T*>(p.dy) + c;
    float sum = 0.0f;  // row order: the same bits every run
    for (int64_t r = 0; r < p.rows; ++r) {  // neighbouring threads read neighbouring columns of row r
        const float xhat = to_float(x[r * p.x_stride]) * p.rstd[r];
        sum = fmaf(to_float(dy[r * p.dy_stride]), xhat, sum);
    }
    static_cast<T*>(p.dw)[c] = from_float<T>(sum);
}

namespace {

template <typename T>
int launch_typed(const RmsNormBackwardParams& p, cudaStream_t stream, char* err, int errlen) {
    const int64_t row_ctas = (p.rows + kThreads - 1) / kThreads;
    const int64_t col_ctas = (p.cols + kThreads - 1) / kThreads;
    if (row_ctas > INT32_MAX) {
        snprintf(err, errlen, "rows must be below 2^31 · %d", kThreads);
        return 1;
    }
    rmsnorm_bwd_row_per_thread<T><<<(unsigned)row_ctas, kThreads, 0, stream>>>(p);
    RMS_CHECK(cudaGetLastError(), err, errlen);
    if (p.dw) {
        rmsnorm_bwd_dw_column_per_thread<T><<<(unsigned)col_ctas, kThreads, 0, stream>>>(p);
        RMS_CHECK(cudaGetLastError(), err, errlen);
    }
    return 0;
}

}  // namespace

HOPATTN_EXPORT int hopattn_rmsnorm_backward_workspace(const RmsNormBackwardParams* p, int64_t* bytes, char* err,
                                                      int errlen) {
    if (rms_backward_check_params(p, err, errlen)) return 1;
    *bytes = 0;  // no scratch: each dw[c] is one thread's sum
    return 0;
}

HOPATTN_EXPORT int hopattn_rmsnorm_backward_launch(const RmsNormBackwardParams* p, cudaStream_t stream, char* err,
                                                   int errlen) {
    if (rms_backward_check_params(p, err, errlen)) return 1;
    if (p->rows == 0) return rms_backward_no_rows(p, stream, err, errlen);
    return rms_dispatch(p->dtype, [&](auto t) { return launch_typed<decltype(t)>(*p, stream, err, errlen); });
}

HOPATTN_EXPORT int hopattn_rmsnorm_backward_describe(const RmsNormBackwardParams* p, RmsBackwardInfo* info, char* err,
                                                     int errlen) {
    if (rms_backward_check_params(p, err, errlen)) return 1;
    return rms_dispatch(p->dtype, [&](auto t) {
        using T = decltype(t);
        snprintf(info->variant, sizeof(info->variant), "row per thread, column per thread<%s>", kDtypeName<T>);
        info->threads = kThreads;
        info->rows_per_cta = kThreads;
        info->threads_per_row = 1;
        info->cluster = 1;
        info->vector_bytes = (int)sizeof(T);
        info->elements_per_thread = 0;
        info->ctas = (p->rows + kThreads - 1) / kThreads;
        info->partial_rows = 0;
        info->reads = p->dw ? 3 : 2;
        info->dynamic_smem = 0;
        if (rms_backward_describe_kernel(rmsnorm_bwd_row_per_thread<T>, info, err, errlen)) return 1;
        return rms_backward_describe_sum(rmsnorm_bwd_dw_column_per_thread<T>, info, err, errlen);
    });
}
