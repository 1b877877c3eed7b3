// RMSNorm, stage 02: a row per warp, 16-byte loads, the sum of squares through warp shuffles.
//
// The 32 lanes of a warp read consecutive 16-byte vectors of one row (8 bf16 or fp16, 4 fp32):
// a warp's load instruction is 512 contiguous bytes, four full 128-byte lines, instead of stage
// 01's 32 rows. Each lane sums the squares of its vectors, and five shfl.xor steps add the 32
// partial sums, leaving the total in every lane. The row is still read twice (the second time
// for the output), and one warp does all of a long row alone.
//
// 16-byte accesses need every row to start on a 16-byte boundary: x, out and weight aligned and
// the row strides multiples of 16 bytes. Otherwise the same kernel runs with one element per
// access (kVec = 1). A row length that is not a multiple of the vector ends element by element.
#include "../common/abi_rmsnorm.h"
#include "../common/elements.cuh"

constexpr int kThreads = 256;                 // threads per CTA
constexpr int kRowsPerCta = kThreads / 32;    // a row per warp
constexpr int kUnroll = 4;                    // vectors a lane has in flight per loop step

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

namespace {

// Whether every row of x and out (and weight) starts on a 16-byte boundary.
template <typename T>
bool rows_aligned(const RmsNormParams& p) {
    auto ok = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
    return ok(p.x) && ok(p.out) && ok(p.weight) && (p.x_stride * sizeof(T)) % 16 == 0 &&
           (p.out_stride * sizeof(T)) % 16 == 0;
}

template <typename T>
int launch_typed(const RmsNormParams& p, cudaStream_t stream, char* err, int errlen) {
    const unsigned ctas = (unsigned)((p.rows + kRowsPerCta - 1) / kRowsPerCta);
    if (rows_aligned<T>(p))
        rmsnorm_warp_per_row<T, kVec16<T>><<<ctas, kThreads, 0, stream>>>(p);
    else
        rmsnorm_warp_per_row<T, 1><<<ctas, kThreads, 0, stream>>>(p);
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
        const bool vec = rows_aligned<T>(*p);
        snprintf(info->variant, sizeof(info->variant), "warp per row<%s, %d-byte accesses>", kDtypeName<T>,
                 vec ? 16 : (int)sizeof(T));
        info->threads = kThreads;
        info->rows_per_cta = kRowsPerCta;
        info->threads_per_row = 32;
        info->cluster = 1;
        info->vector_bytes = vec ? 16 : (int)sizeof(T);
        info->elements_per_thread = 0;
        info->dynamic_smem = 0;
        return vec ? rms_describe_kernel(rmsnorm_warp_per_row<T, kVec16<T>>, info, err, errlen)
                   : rms_describe_kernel(rmsnorm_warp_per_row<T, 1>, info, err, errlen);
    });
}
