// Softmax, stage 01: a row per warp (a CTA per long row), three passes over the row.
//
//   y[r, c] = exp(x[r, c] − m[r]) / s[r],   m[r] = max_c x[r, c],   s[r] = Σ_c exp(x[r, c] − m[r])
//
// The textbook algorithm, with what the RMSNorm forward's stages 02 and 03 already taught: a warp
// takes a row of up to kWarpMaxCols columns (lane l reads the 16-byte vectors l, l + 32, ...: 512
// contiguous bytes per load instruction), a CTA of kCtaThreads a longer one; shuffles, then shared
// memory, reduce across the row. Three walks over the row: the max (so that no exponential
// overflows), the sum of exp(x − max), then the output. exp is exp2 of (x − m) · log2(e), in fp32,
// the output rounded once. A row of −inf gives NaN (0 / 0), as torch.softmax does. Any length, rows a
// stride apart, bf16/fp16/fp32; rows not aligned to 16 bytes run one element per access.
#include "../common/abi_softmax.h"
#include "../../rmsnorm/common/elements.cuh"

constexpr int kThreads = 256;                 // threads per CTA of the warp-per-row kernel
constexpr int kRowsPerCta = kThreads / 32;    // a row per warp
constexpr int kWarpMaxCols = 1024;            // longer rows go to a CTA each
constexpr int kCtaThreads = 512;              // threads per CTA of the CTA-per-row kernel
constexpr int kUnroll = 4;                    // vectors a thread has in flight per loop step
constexpr float kLog2e = 1.4426950408889634f;

struct Max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Sum {
    __device__ float operator()(float a, float b) const { return a + b; }
};

template <typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;  // every lane holds the same value: the butterfly combines in the same order everywhere
}

// v combined over the kWarps warps of a row (shuffles, then shared memory), the same in every thread.
template <int kWarps, typename Op>
__device__ __forceinline__ float row_reduce(float v, Op op, float* warp_vals) {
    v = warp_reduce(v, op);
    if constexpr (kWarps > 1) {
        __syncthreads();  // the previous reduction's reads of warp_vals are over
        if (threadIdx.x % 32 == 0) warp_vals[threadIdx.x / 32] = v;
        __syncthreads();
        v = warp_vals[0];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) v = op(v, warp_vals[w]);  // the same order in every thread
    }
    return v;
}

// kThreadsPerRow threads a row: 32 (a warp; kRowsPerCta rows a CTA) or kCtaThreads (a CTA).
template <typename T, int kVec, int kThreadsPerRow>
__global__ void __launch_bounds__(kThreadsPerRow == 32 ? kThreads : kThreadsPerRow)
    softmax_three_passes(SoftmaxParams p) {
    constexpr int kRows = kThreadsPerRow == 32 ? kRowsPerCta : 1;
    constexpr int kWarps = kThreadsPerRow / 32;
    __shared__ float warp_vals[kWarps];
    const int t = threadIdx.x % kThreadsPerRow;
    const int64_t row = (int64_t)blockIdx.x * kRows + threadIdx.x / kThreadsPerRow;
    if (row >= p.rows) return;  // only in the warp-per-row kernel (a CTA's row always exists): no barrier there
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    T* y = static_cast<T*>(p.y) + row * p.y_stride;
    const int cols = (int)p.cols;
    const int body = cols / kVec * kVec;  // the vector part; the tail element by element

    float m = -INFINITY;  // 1. the max
#pragma unroll kUnroll
    for (int c = t * kVec; c < body; c += kThreadsPerRow * kVec) {
        float v[kVec];
        load_floats<T, kVec>(x + c, v);
#pragma unroll
        for (int i = 0; i < kVec; ++i) m = fmaxf(m, v[i]);
    }
    for (int c = body + t; c < cols; c += kThreadsPerRow) m = fmaxf(m, to_float(x[c]));
    m = row_reduce<kWarps>(m, Max{}, warp_vals);

    float s = 0.0f;  // 2. the sum of exp(x − m), the row read again
#pragma unroll kUnroll
    for (int c = t * kVec; c < body; c += kThreadsPerRow * kVec) {
        float v[kVec];
        load_floats<T, kVec>(x + c, v);
#pragma unroll
        for (int i = 0; i < kVec; ++i) s += exp2f((v[i] - m) * kLog2e);
    }
    for (int c = body + t; c < cols; c += kThreadsPerRow) s += exp2f((to_float(x[c]) - m) * kLog2e);
    s = row_reduce<kWarps>(s, Sum{}, warp_vals);
    const float inv = 1.0f / s;

#pragma unroll kUnroll
    for (int c = t * kVec; c < body; c += kThreadsPerRow * kVec) {  // 3. the output, the row read a third time
        float v[kVec];
        load_floats<T, kVec>(x + c, v);
#pragma unroll
        for (int i = 0; i < kVec; ++i) v[i] = exp2f((v[i] - m) * kLog2e) * inv;
        store_floats<T, kVec>(y + c, v);
    }
    for (int c = body + t; c < cols; c += kThreadsPerRow) y[c] = from_float<T>(exp2f((to_float(x[c]) - m) * kLog2e) * inv);
}

namespace {

template <typename T>
bool rows_aligned(const SoftmaxParams& p) {
    auto ok = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
    return ok(p.x) && ok(p.y) && (p.x_stride * sizeof(T)) % 16 == 0 && (p.y_stride * sizeof(T)) % 16 == 0;
}

template <typename T, int kVec>
void launch_vec(const SoftmaxParams& p, cudaStream_t stream) {
    if (p.cols <= kWarpMaxCols)
        softmax_three_passes<T, kVec, 32><<<(unsigned)((p.rows + kRowsPerCta - 1) / kRowsPerCta), kThreads, 0, stream>>>(p);
    else
        softmax_three_passes<T, kVec, kCtaThreads><<<(unsigned)p.rows, kCtaThreads, 0, stream>>>(p);
}

template <typename T>
int launch_typed(const SoftmaxParams& p, cudaStream_t stream, char* err, int errlen) {
    if (p.rows > INT32_MAX) {
        snprintf(err, errlen, "rows must fit in 31 bits (a CTA per row)");
        return 1;
    }
    if (rows_aligned<T>(p)) launch_vec<T, kVec16<T>>(p, stream);
    else launch_vec<T, 1>(p, stream);
    RMS_CHECK(cudaGetLastError(), err, errlen);
    return 0;
}

template <typename T, int kVec>
int describe_vec(const SoftmaxParams& p, RmsKernelInfo* info, char* err, int errlen) {
    const bool warp = p.cols <= kWarpMaxCols;
    snprintf(info->variant, sizeof(info->variant), "%s per row, three passes<%s, %d-byte accesses>",
             warp ? "warp" : "CTA", kDtypeName<T>, kVec * (int)sizeof(T));
    info->threads = warp ? kThreads : kCtaThreads;
    info->rows_per_cta = warp ? kRowsPerCta : 1;
    info->threads_per_row = warp ? 32 : kCtaThreads;
    info->cluster = 1;
    info->vector_bytes = kVec * (int)sizeof(T);
    info->elements_per_thread = 0;
    info->dynamic_smem = 0;
    return warp ? softmax_describe_kernel(softmax_three_passes<T, kVec, 32>, info, err, errlen)
                : softmax_describe_kernel(softmax_three_passes<T, kVec, kCtaThreads>, info, err, errlen);
}

}  // namespace

HOPATTN_EXPORT int hopattn_softmax_launch(const SoftmaxParams* p, cudaStream_t stream, char* err, int errlen) {
    if (softmax_check_params(p, err, errlen)) return 1;
    if (p->rows == 0) return 0;
    return rms_dispatch(p->dtype, [&](auto t) { return launch_typed<decltype(t)>(*p, stream, err, errlen); });
}

HOPATTN_EXPORT int hopattn_softmax_describe(const SoftmaxParams* p, RmsKernelInfo* info, char* err, int errlen) {
    if (softmax_check_params(p, err, errlen)) return 1;
    return rms_dispatch(p->dtype, [&](auto t) {
        using T = decltype(t);
        return rows_aligned<T>(*p) ? describe_vec<T, kVec16<T>>(*p, info, err, errlen)
                                   : describe_vec<T, 1>(*p, info, err, errlen);
    });
}
