// RMSNorm, stage 03: a row per CTA for long rows, the sum of squares through shared memory.
//
// Stage 02 gives a whole row to one warp: at 256k columns a warp reads 512 KB, twice, while the
// grid has only rows / 8 CTAs. Here a row longer than kWarpMaxCols goes to a CTA of kCtaThreads
// threads: each warp sums its share through shuffles as before, lane 0 of each warp writes its sum
// to shared memory, and after a barrier every thread adds the kCtaThreads / 32 sums in the same
// order (the total is identical in every thread, and from run to run). Rows up to kWarpMaxCols
// keep stage 02's warp per row. The row is still read twice.
//
// 16-byte accesses need every row to start on a 16-byte boundary; otherwise the same kernels run
// with one element per access (kVec = 1). A row length that is not a multiple of the vector ends
// element by element.
#include "../common/abi_rmsnorm.h"
#include "../common/elements.cuh"

constexpr int kThreads = 256;                 // threads per CTA of the warp-per-row kernel
constexpr int kRowsPerCta = kThreads / 32;    // a row per warp
constexpr int kWarpMaxCols = 1024;            // longer rows go to a CTA each
constexpr int kCtaThreads = 512;              // threads per CTA of the CTA-per-row kernel
constexpr int kCtaWarps = kCtaThreads / 32;
constexpr int kUnroll = 4;                    // vectors a thread has in flight per loop step

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;  // every lane holds the same total: the butterfly adds in the same order everywhere
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads) rmsnorm_warp_per_row(RmsNormParams p) {
    const int lane = threadIdx.x % 32;
    const int64_t row = (int64_t)blockIdx.x * kRowsPerCta + threadIdx.x / 32;
    if (row >= p.rows) return;  // the whole warp: the shuffles below always see 32 lanes
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    const T* weight = static_cast<const T*>(p.weight);
    T* out = static_cast<T*>(p.out) + row * p.out_stride;
    const int cols = (int)p.cols;
    const int body = cols / kVec * kVec;  // the vector part; the tail element by element

    float sum = 0.0f;
#pragma unroll kUnroll
    for (int c = lane * kVec; c < body; c += 32 * kVec) {
        float v[kVec];
        load_floats<T, kVec>(x + c, v);
#pragma unroll
        for (int i = 0; i < kVec; ++i) sum = fmaf(v[i], v[i], sum);
    }
    for (int c = body + lane; c < cols; c += 32) {
        const float v = to_float(x[c]);
        sum = fmaf(v, v, sum);
    }
    const float rstd = rsqrtf(warp_sum(sum) / (float)cols + p.eps);
    if (lane == 0 && p.rstd) p.rstd[row] = rstd;

#pragma unroll kUnroll
    for (int c = lane * kVec; c < body; c += 32 * kVec) {
        float v[kVec], w[kVec];
        load_floats<T, kVec>(x + c, v);
        if (weight) load_floats<T, kVec>(weight + c, w);
#pragma unroll
        for (int i = 0; i < kVec; ++i) v[i] = weight ? v[i] * rstd * w[i] : v[i] * rstd;
        store_floats<T, kVec>(out + c, v);
    }
    for (int c = body + lane; c < cols; c += 32) {
        float y = to_float(x[c]) * rstd;
        if (weight) y *= to_float(weight[c]);
        out[c] = from_float<T>(y);
    }
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kCtaThreads) rmsnorm_cta_per_row(RmsNormParams p) {
    __shared__ float warp_sums[kCtaWarps];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t row = blockIdx.x;
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    const T* weight = static_cast<const T*>(p.weight);
    T* out = static_cast<T*>(p.out) + row * p.out_stride;
    const int cols = (int)p.cols;
    const int body = cols / kVec * kVec;

    float sum = 0.0f;
#pragma unroll kUnroll
    for (int c = threadIdx.x * kVec; c < body; c += kCtaThreads * kVec) {
        float v[kVec];
        load_floats<T, kVec>(x + c, v);
#pragma unroll
        for (int i = 0; i < kVec; ++i) sum = fmaf(v[i], v[i], sum);
    }
    for (int c = body + threadIdx.x; c < cols; c += kCtaThreads) {
        const float v = to_float(x[c]);
        sum = fmaf(v, v, sum);
    }
    sum = warp_sum(sum);
    if (lane == 0) warp_sums[warp] = sum;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kCtaWarps; ++w) total += warp_sums[w];  // a broadcast read, the same order everywhere
    const float rstd = rsqrtf(total / (float)cols + p.eps);
    if (threadIdx.x == 0 && p.rstd) p.rstd[row] = rstd;

#pragma unroll kUnroll
    for (int c = threadIdx.x * kVec; c < body; c += kCtaThreads * kVec) {
        float v[kVec], w[kVec];
        load_floats<T, kVec>(x + c, v);
        if (weight) load_floats<T, kVec>(weight + c, w);
#pragma unroll
        for (int i = 0; i < kVec; ++i) v[i] = weight ? v[i] * rstd * w[i] : v[i] * rstd;
        store_floats<T, kVec>(out + c, v);
    }
    for (int c = body + threadIdx.x; c < cols; c += kCtaThreads) {
        float y = to_float(x[c]) * rstd;
        if (weight) y *= to_float(weight[c]);
        out[c] = from_float<T>(y);
    }
}

namespace {

// Whether every row of x and out (and weight) starts on a 16-byte boundary.
template <typename T>
bool rows_aligned(const RmsNormParams& p) {
    auto ok = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
    return ok(p.x) && ok(p.out) && ok(p.weight) && (p.x_stride * sizeof(T)) % 16 == 0 &&
           (p.out_stride * sizeof(T)) % 16 == 0;
}

template <typename T, int kVec>
void launch_vec(const RmsNormParams& p, cudaStream_t stream) {
    if (p.cols <= kWarpMaxCols)
        rmsnorm_warp_per_row<T, kVec><<<(unsigned)((p.rows + kRowsPerCta - 1) / kRowsPerCta), kThreads, 0, stream>>>(p);
    else
        rmsnorm_cta_per_row<T, kVec><<<(unsigned)p.rows, kCtaThreads, 0, stream>>>(p);
}

template <typename T>
int launch_typed(const RmsNormParams& p, cudaStream_t stream, char* err, int errlen) {
    if (p.rows > INT32_MAX) {
        snprintf(err, errlen, "rows must fit in 31 bits (a CTA per row)");
        return 1;
    }
    if (rows_aligned<T>(p))
        launch_vec<T, kVec16<T>>(p, stream);
    else
        launch_vec<T, 1>(p, stream);
    RMS_CHECK(cudaGetLastError(), err, errlen);
    return 0;
}

template <typename T, int kVec>
int describe_vec(const RmsNormParams& p, RmsKernelInfo* info, char* err, int errlen) {
    const bool warp = p.cols <= kWarpMaxCols;
    snprintf(info->variant, sizeof(info->variant), "%s per row<%s, %d-byte accesses>", warp ? "warp" : "CTA",
             kDtypeName<T>, kVec * (int)sizeof(T));
    info->threads = warp ? kThreads : kCtaThreads;
    info->rows_per_cta = warp ? kRowsPerCta : 1;
    info->threads_per_row = warp ? 32 : kCtaThreads;
    info->cluster = 1;
    info->vector_bytes = kVec * (int)sizeof(T);
    info->elements_per_thread = 0;
    info->dynamic_smem = 0;
    return warp ? rms_describe_kernel(rmsnorm_warp_per_row<T, kVec>, info, err, errlen)
                : rms_describe_kernel(rmsnorm_cta_per_row<T, kVec>, info, err, errlen);
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
        return rows_aligned<T>(*p) ? describe_vec<T, kVec16<T>>(*p, info, err, errlen)
                                   : describe_vec<T, 1>(*p, info, err, errlen);
    });
}
