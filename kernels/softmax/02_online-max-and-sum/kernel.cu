// Softmax, stage 02: the max and the sum in one pass (the online softmax), then the output.
//
//   y[r, c] = exp(x[r, c] − m[r]) / s[r],   m[r] = max_c x[r, c],   s[r] = Σ_c exp(x[r, c] − m[r])
//
// Stage 01 walks a row three times: the max, the sum, the output. The sum needs the max only to
// keep the exponentials in range, and a sum taken against a smaller max can be brought up to a
// larger one afterwards: Σ exp(x − m') = Σ exp(x − m) · exp(m − m'). So each thread keeps a running
// pair (m, s) — at each vector, m' = max(m, the vector's max), s = s · exp(m − m') + Σ exp(x − m')
// — and the pairs of the row's threads merge the same way, (m, s) ⊕ (m', s') = (M, s · exp(m − M) +
// s' · exp(m' − M)) with M = max(m, m'): through shuffles, then shared memory, one reduction of a
// pair where stage 01 had two. Two walks over the row: the pair, then the output. The merge is
// commutative bit for bit (the same two products added), so every lane of the butterfly, and every
// run, gets the same pair. A max of −inf (a chunk with no element yet, or a row of −inf) is never
// rescaled, nor subtracted (exp(−inf − (−inf)) would be NaN): a thread whose elements so far are all
// −inf (a masked stretch of the row) has the pair (−inf, 0); a row of −inf ends with NaN, as in stage 01.
#include "../common/abi_softmax.h"
#include "../../rmsnorm/common/elements.cuh"

constexpr int kThreads = 256;                 // threads per CTA of the warp-per-row kernel
constexpr int kRowsPerCta = kThreads / 32;    // a row per warp
constexpr int kWarpMaxCols = 1024;            // longer rows go to a CTA each
constexpr int kCtaThreads = 512;              // threads per CTA of the CTA-per-row kernel
constexpr int kUnroll = 4;                    // vectors a thread has in flight per loop step
constexpr float kLog2e = 1.4426950408889634f;

// A running max and the sum of exp(x − max) of the elements seen so far.
struct MaxSum {
    float m, s;
};

// s brought from max m to max to (>= m); a max of −inf has no elements behind it: nothing to scale.
__device__ __forceinline__ float rescale(float s, float m, float to) {
    return m == to ? s : s * exp2f((m - to) * kLog2e);
}

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
    const float m = fmaxf(a.m, b.m);
    return {m, rescale(a.s, a.m, m) + rescale(b.s, b.m, m)};  // merge(a, b) and merge(b, a): the same bits
}

// kVec more elements into the pair: one rescale a vector, one exponential an element.
template <int kVec>
__device__ __forceinline__ MaxSum add_elements(MaxSum a, const float (&v)[kVec]) {
    float m = a.m;
#pragma unroll
    for (int i = 0; i < kVec; ++i) m = fmaxf(m, v[i]);
    float s = rescale(a.s, a.m, m);
    const float base = m == -INFINITY ? 0.0f : m;  // all −inf so far: exp(−inf − 0) = 0, not exp(NaN)
#pragma unroll
    for (int i = 0; i < kVec; ++i) s += exp2f((v[i] - base) * kLog2e);
    return {m, s};
}

__device__ __forceinline__ MaxSum warp_merge(MaxSum v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
        v = merge(v, {__shfl_xor_sync(0xffffffffu, v.m, offset), __shfl_xor_sync(0xffffffffu, v.s, offset)});
    return v;  // every lane holds the same pair
}

// The pair merged over the kWarps warps of a row (shuffles, then shared memory), the same in every thread.
template <int kWarps>
__device__ __forceinline__ MaxSum row_merge(MaxSum v, MaxSum* warp_vals) {
    v = warp_merge(v);
    if constexpr (kWarps > 1) {
        if (threadIdx.x % 32 == 0) warp_vals[threadIdx.x / 32] = v;
        __syncthreads();
        v = warp_vals[0];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) v = merge(v, warp_vals[w]);  // the same order in every thread
    }
    return v;
}

// kThreadsPerRow threads a row: 32 (a warp; kRowsPerCta rows a CTA) or kCtaThreads (a CTA).
template <typename T, int kVec, int kThreadsPerRow>
__global__ void __launch_bounds__(kThreadsPerRow == 32 ? kThreads : kThreadsPerRow)
    softmax_two_passes(SoftmaxParams p) {
    constexpr int kRows = kThreadsPerRow == 32 ? kRowsPerCta : 1;
    constexpr int kWarps = kThreadsPerRow / 32;
    __shared__ MaxSum warp_vals[kWarps];
    const int t = threadIdx.x % kThreadsPerRow;
    const int64_t row = (int64_t)blockIdx.x * kRows + threadIdx.x / kThreadsPerRow;
    if (row >= p.rows) return;  // only in the warp-per-row kernel (a CTA's row always exists): no barrier there
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    T* y = static_cast<T*>(p.y) + row * p.y_stride;
    const int cols = (int)p.cols;
    const int body = cols / kVec * kVec;  // the vector part; the tail element by element

    MaxSum pair = {-INFINITY, 0.0f};  // 1. the max and the sum together
#pragma unroll kUnroll
    for (int c = t * kVec; c < body; c += kThreadsPerRow * kVec) {
        float v[kVec];
        load_floats<T, kVec>(x + c, v);
        pair = add_elements<kVec>(pair, v);
    }
    for (int c = body + t; c < cols; c += kThreadsPerRow) {
        const float v[1] = {to_float(x[c])};
        pair = add_elements<1>(pair, v);
    }
    pair = row_merge<kWarps>(pair, warp_vals);
    const float m = pair.m, inv = 1.0f / pair.s;

#pragma unroll kUnroll
    for (int c = t * kVec; c < body; c += kThreadsPerRow * kVec) {  // 2. the output, the row read again
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
        softmax_two_passes<T, kVec, 32><<<(unsigned)((p.rows + kRowsPerCta - 1) / kRowsPerCta), kThreads, 0, stream>>>(p);
    else
        softmax_two_passes<T, kVec, kCtaThreads><<<(unsigned)p.rows, kCtaThreads, 0, stream>>>(p);
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
    snprintf(info->variant, sizeof(info->variant), "%s per row, online, two passes<%s, %d-byte accesses>",
             warp ? "warp" : "CTA", kDtypeName<T>, kVec * (int)sizeof(T));
    info->threads = warp ? kThreads : kCtaThreads;
    info->rows_per_cta = warp ? kRowsPerCta : 1;
    info->threads_per_row = warp ? 32 : kCtaThreads;
    info->cluster = 1;
    info->vector_bytes = kVec * (int)sizeof(T);
    info->elements_per_thread = 0;
    info->dynamic_smem = 0;
    return warp ? softmax_describe_kernel(softmax_two_passes<T, kVec, 32>, info, err, errlen)
                : softmax_describe_kernel(softmax_two_passes<T, kVec, kCtaThreads>, info, err, errlen);
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
