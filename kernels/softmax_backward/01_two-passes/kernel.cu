// Softmax backward, stage 01: a row per warp (a CTA per long row), two passes over y and dy.
//
//   dx[r, c] = y[r, c] · (dy[r, c] − d[r]),   d[r] = Σ_c y[r, c] · dy[r, c]
//
// The backward of y = softmax(x) needs only y (the forward's output) and the gradient dy of it:
// dx = diag(y) · dy − y · (yᵀ dy), a dot along each row, then an element-wise product. It reads y and
// dy and writes dx: 6 bytes an element in bf16, as the RMSNorm backward, and no sum across rows.
// A warp takes a row of up to kWarpMaxCols columns, a CTA of kCtaThreads a longer one (16-byte
// loads, shuffles then shared memory, as the forward's stages); the dot in fp32, dx rounded once. The
// rows are walked twice: the dot, then dx. Any length, rows a stride apart, bf16/fp16/fp32; rows not
// aligned to 16 bytes run one element per access.
#include "../../softmax/common/abi_softmax.h"
#include "../../rmsnorm/common/elements.cuh"

constexpr int kThreads = 256;                 // threads per CTA of the warp-per-row kernel
constexpr int kRowsPerCta = kThreads / 32;    // a row per warp
constexpr int kWarpMaxCols = 1024;            // longer rows go to a CTA each
constexpr int kCtaThreads = 512;              // threads per CTA of the CTA-per-row kernel
constexpr int kUnroll = 4;                    // vectors of y (and of dy) a thread has in flight per loop step

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;  // every lane holds the same total: the butterfly adds in the same order everywhere
}

// kThreadsPerRow threads a row: 32 (a warp; kRowsPerCta rows a CTA) or kCtaThreads (a CTA).
template <typename T, int kVec, int kThreadsPerRow>
__global__ void __launch_bounds__(kThreadsPerRow == 32 ? kThreads : kThreadsPerRow)
    softmax_bwd_two_passes(SoftmaxBackwardParams p) {
    constexpr int kRows = kThreadsPerRow == 32 ? kRowsPerCta : 1;
    constexpr int kWarps = kThreadsPerRow / 32;
    __shared__ float warp_sums[kWarps];
    const int t = threadIdx.x % kThreadsPerRow;
    const int64_t row = (int64_t)blockIdx.x * kRows + threadIdx.x / kThreadsPerRow;
    if (row >= p.rows) return;  // only in the warp-per-row kernel (a CTA's row always exists): no barrier there
    const T* y = static_cast<const T*>(p.y) + row * p.y_stride;
    const T* dy = static_cast<const T*>(p.dy) + row * p.dy_stride;
    T* dx = static_cast<T*>(p.dx) + row * p.dx_stride;
    const int cols = (int)p.cols;
    const int body = cols / kVec * kVec;

    float d = 0.0f;  // 1. the dot
#pragma unroll kUnroll
    for (int c = t * kVec; c < body; c += kThreadsPerRow * kVec) {
        float yv[kVec], g[kVec];
        load_floats<T, kVec>(y + c, yv);
        load_floats<T, kVec>(dy + c, g);
#pragma unroll
        for (int i = 0; i < kVec; ++i) d = fmaf(yv[i], g[i], d);
    }
    for (int c = body + t; c < cols; c += kThreadsPerRow) d = fmaf(to_float(y[c]), to_float(dy[c]), d);
    d = warp_sum(d);
    if constexpr (kWarps > 1) {
        if (t % 32 == 0) warp_sums[t / 32] = d;
        __syncthreads();
        d = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) d += warp_sums[w];  // the same order in every thread
    }

#pragma unroll kUnroll
    for (int c = t * kVec; c < body; c += kThreadsPerRow * kVec) {  // 2. dx, y and dy read again
        float yv[kVec], g[kVec];
        load_floats<T, kVec>(y + c, yv);
        load_floats<T, kVec>(dy + c, g);
#pragma unroll
        for (int i = 0; i < kVec; ++i) g[i] = yv[i] * (g[i] - d);
        store_floats<T, kVec>(dx + c, g);
    }
    for (int c = body + t; c < cols; c += kThreadsPerRow) dx[c] = from_float<T>(to_float(y[c]) * (to_float(dy[c]) - d));
}

namespace {

template <typename T>
bool rows_aligned(const SoftmaxBackwardParams& p) {
    auto ok = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
    return ok(p.y) && ok(p.dy) && ok(p.dx) && (p.y_stride * sizeof(T)) % 16 == 0 &&
           (p.dy_stride * sizeof(T)) % 16 == 0 && (p.dx_stride * sizeof(T)) % 16 == 0;
}

template <typename T, int kVec>
void launch_vec(const SoftmaxBackwardParams& p, cudaStream_t stream) {
    if (p.cols <= kWarpMaxCols)
        softmax_bwd_two_passes<T, kVec, 32>
            <<<(unsigned)((p.rows + kRowsPerCta - 1) / kRowsPerCta), kThreads, 0, stream>>>(p);
    else
        softmax_bwd_two_passes<T, kVec, kCtaThreads><<<(unsigned)p.rows, kCtaThreads, 0, stream>>>(p);
}

template <typename T>
int launch_typed(const SoftmaxBackwardParams& p, cudaStream_t stream, char* err, int errlen) {
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
int describe_vec(const SoftmaxBackwardParams& p, RmsKernelInfo* info, char* err, int errlen) {
    const bool warp = p.cols <= kWarpMaxCols;
    snprintf(info->variant, sizeof(info->variant), "%s per row, two passes<%s, %d-byte accesses>",
             warp ? "warp" : "CTA", kDtypeName<T>, kVec * (int)sizeof(T));
    info->threads = warp ? kThreads : kCtaThreads;
    info->rows_per_cta = warp ? kRowsPerCta : 1;
    info->threads_per_row = warp ? 32 : kCtaThreads;
    info->cluster = 1;
    info->vector_bytes = kVec * (int)sizeof(T);
    info->elements_per_thread = 0;
    info->dynamic_smem = 0;
    return warp ? softmax_describe_kernel(softmax_bwd_two_passes<T, kVec, 32>, info, err, errlen)
                : softmax_describe_kernel(softmax_bwd_two_passes<T, kVec, kCtaThreads>, info, err, errlen);
}

}  // namespace

HOPATTN_EXPORT int hopattn_softmax_backward_launch(const SoftmaxBackwardParams* p, cudaStream_t stream, char* err,
                                                   int errlen) {
    if (softmax_backward_check_params(p, err, errlen)) return 1;
    if (p->rows == 0) return 0;
    return rms_dispatch(p->dtype, [&](auto t) { return launch_typed<decltype(t)>(*p, stream, err, errlen); });
}

HOPATTN_EXPORT int hopattn_softmax_backward_describe(const SoftmaxBackwardParams* p, RmsKernelInfo* info, char* err,
                                                     int errlen) {
    if (softmax_backward_check_params(p, err, errlen)) return 1;
    return rms_dispatch(p->dtype, [&](auto t) {
        using T = decltype(t);
        return rows_aligned<T>(*p) ? describe_vec<T, kVec16<T>>(*p, info, err, errlen)
                                   : describe_vec<T, 1>(*p, info, err, errlen);
    });
}
