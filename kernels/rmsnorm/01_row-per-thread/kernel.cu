// RMSNorm, stage 01: a row per thread.
//
//   out[r, c] = x[r, c] · rstd[r] · weight[c],   rstd[r] = 1 / sqrt(mean_c x[r, c]² + eps)
//
// The plainest correct kernel: each thread walks its own row twice, once for the sum of squares
// and once to write the output, one element at a time. Neighbouring threads read different rows,
// a row stride apart, so every load instruction of a warp touches 32 rows: nothing is coalesced,
// and the grid has only rows / 128 CTAs. Any row length, any row strides, bf16/fp16/fp32.
#include "../common/abi_rmsnorm.h"
#include "../common/elements.cuh"

constexpr int kThreads = 128;  // threads per CTA, one row each

template <typename T>
__global__ void __launch_bounds__(kThreads) rmsnorm_row_per_thread(RmsNormParams p) {
    const int64_t row = (int64_t)blockIdx.x * kThreads + threadIdx.x;
    if (row >= p.rows) return;
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    const T* weight = static_cast<const T*>(p.weight);
    T* out = static_cast<T*>(p.out) + row * p.out_stride;

    float sum = 0.0f;  // fp32 accumulation, whatever T is
    for (int64_t c = 0; c < p.cols; ++c) {
        const float v = to_float(x[c]);
        sum = fmaf(v, v, sum);
    }
    const float rstd = rsqrtf(sum / (float)p.cols + p.eps);
    if (p.rstd) p.rstd[row] = rstd;

    for (int64_t c = 0; c < p.cols; ++c) {  // the row again: from L1 or L2 if it is still there
        float y = to_float(x[c]) * rstd;
        if (weight) y *= to_float(weight[c]);
        out[c] = from_float<T>(y);
    }
}

namespace {

template <typename T>
int launch_typed(const RmsNormParams& p, cudaStream_t stream, char* err, int errlen) {
    const int64_t ctas = (p.rows + kThreads - 1) / kThreads;
    rmsnorm_row_per_thread<T><<<(unsigned)ctas, kThreads, 0, stream>>>(p);
    RMS_CHECK(cudaGetLastError(), err, errlen);
    return 0;
}

}  // namespace

HOPATTN_EXPORT int hopattn_rmsnorm_launch(const RmsNormParams* p, cudaStream_t stream, char* err, int errlen) {
    if (rms_check_params(p, err, errlen)) return 1;
    if (p->rows == 0) return 0;
    return rms_dispatch(p->dtype, [&](auto t) { return launch_typed<decltype(t)>(*p, stream, err, errlen); });
}

HOPATTN_EXPORT int hopattn_rmsnorm_describe(const RmsNormParams* p, RmsKernelInfo* info, char* err, int errlen) {
    if (rms_check_params(p, err, errlen)) return 1;
    return rms_dispatch(p->dtype, [&](auto t) {
        using T = decltype(t);
        snprintf(info->variant, sizeof(info->variant), "row per thread<%s>", kDtypeName<T>);
        info->threads = kThreads;
        info->rows_per_cta = kThreads;
        info->threads_per_row = 1;
        info->cluster = 1;
        info->vector_bytes = (int)sizeof(T);
        info->elements_per_thread = 0;
        info->dynamic_smem = 0;
        return rms_describe_kernel(rmsnorm_row_per_thread<T>, info, err, errlen);
    });
}
