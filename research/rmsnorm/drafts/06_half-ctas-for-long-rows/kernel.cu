// RMSNorm, stage 06: half-size CTAs for the long rows, two an SM.
//
// Stage 05 holds a row of 64k bf16 or fp16 columns (32k fp32) in one CTA of 1024 threads x 8 vectors
// and a longer row in a cluster of 2, 4 or 8 such CTAs. That CTA compiles to 56-64 registers, so it
// is alone on its SM (1024 x 56 of the SM's 65536): it loads its 128 KB, waits for the last load,
// reduces (shuffles, a barrier, at 128k-512k the cluster's barrier), then stores, and while it waits
// and reduces nothing of its SM's is in flight; the next CTA starts only when it has gone. Here a row
// longer than a 512-thread CTA holds (32k bf16 or fp16 columns, 16k fp32) is cut into slices of
// kSliceThreads = 512 threads x 8 vectors (64 KB), one per CTA of a cluster of 2, 4 or 8: 64k bf16
// columns in 2 slices, 128k in 4, 256k in 8. A slice's CTA is held to 64 registers
// (__launch_bounds__ with kSmThreads / CTA threads CTAs an SM), so two share an SM, and one's loads
// are in flight while the other reduces. The kernel is stage 05's (the slices' sums meet through
// distributed shared memory as stage 05's CTAs' do); only the launcher's configurations and the
// launch bounds are new. Rows past 8 slices (256k bf16, 128k fp32) keep stage 05's clusters of up
// to 8 CTAs of 1024 threads (up to 512k bf16 columns); shorter rows keep stage 04's configurations;
// rows not aligned to 16 bytes, and longer rows, run stage 03's kernels, kept below unchanged.
#include "../common/abi_rmsnorm.h"
#include "../common/elements.cuh"

#include <cooperative_groups.h>
#include <type_traits>

namespace cg = cooperative_groups;

// Stage 03's two kernels: the path for rows this stage's kernel cannot hold or vectorize.
constexpr int kThreads = 256;                 // threads per CTA of the warp-per-row kernel
constexpr int kRowsPerCta = kThreads / 32;    // a row per warp
constexpr int kWarpMaxCols = 1024;            // longer rows go to a CTA each
constexpr int kCtaThreads = 512;              // threads per CTA of the CTA-per-row kernel
constexpr int kCtaWarps = kCtaThreads / 32;
constexpr int kUnroll = 4;                    // vectors a thread has in flight per loop step

// This stage's kernel: the row in registers.
constexpr int kVectorsPerThread = 8;          // 16-byte vectors a thread holds (32 registers)
constexpr int kMaxThreadsPerRow = 1024;       // the most threads a row gets (one CTA)
constexpr int kMinCtaThreads = 256;           // short rows are packed kMinCtaThreads / threads_per_row to a CTA
constexpr int kMaxCluster = 8;                // CTAs a row may span (8: the portable cluster size)
constexpr int kSliceThreads = 512;            // a long row's slices: CTAs of 512 threads x 8 vectors, two an SM
constexpr int kSmThreads = 1024;              // __launch_bounds__: kSmThreads / CTA threads CTAs an SM (64 registers)

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


// The vector of T at column c of a row of `cols` elements: 16 bytes at once where the whole vector
// is inside the row, element by element at the row's end, zeros past it.
template <typename T>
__device__ __forceinline__ uint4 load_part(const T* row, int c, int cols) {
    constexpr int kV = kVec16<T>;
    if (c + kV <= cols) return *reinterpret_cast<const uint4*>(row + c);
    T t[kV];
#pragma unroll
    for (int i = 0; i < kV; ++i) t[i] = c + i < cols ? row[c + i] : T(0.0f);
    uint4 raw;
    memcpy(&raw, t, 16);
    return raw;
}

template <typename T>
__device__ __forceinline__ void store_part(T* row, int c, int cols, const uint4& raw) {
    constexpr int kV = kVec16<T>;
    if (c + kV <= cols) {
        *reinterpret_cast<uint4*>(row + c) = raw;
        return;
    }
    T t[kV];
    memcpy(t, &raw, 16);
#pragma unroll
    for (int i = 0; i < kV; ++i)
        if (c + i < cols) row[c + i] = t[i];
}

// The cluster barrier in two halves (barrier.cluster.arrive / wait): the arrive says this CTA has
// started (its shared memory may be written by its peers), the wait waits for every CTA's arrive.
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }

// A slice's CTAs an SM, as __launch_bounds__' second argument: kSmThreads / kSliceThreads = 2 (at most
// 64 registers a thread) for the slices' clusters; 0, no bound, for every other configuration, whose
// code is then stage 05's.
template <int kThreadsPerRow, int kCluster>
constexpr int kSliceBound = kCluster > 1 && kThreadsPerRow == kSliceThreads ? kSmThreads / kSliceThreads : 0;

// kThreadsPerRow threads of each of kCluster CTAs hold a row, kHeld vectors each (vector k of
// thread t of the CTA of rank q: (q · kHeld + k) · kThreadsPerRow + t, so each of the kHeld loads
// of a warp is 512 contiguous bytes); kRows rows per CTA when kCluster is 1.
template <typename T, int kThreadsPerRow, int kHeld, int kRows, int kCluster>
__global__ void __launch_bounds__(kThreadsPerRow * kRows, kSliceBound<kThreadsPerRow, kCluster>)
    rmsnorm_rows(RmsNormParams p) {
    static_assert(kCluster == 1 || kRows == 1, "a cluster shares one row");
    constexpr int kV = kVec16<T>;
    constexpr int kWarpsPerRow = kThreadsPerRow / 32;
    __shared__ float warp_sums[kRows][kWarpsPerRow];
    __shared__ float cta_sums[kCluster];  // slot q: the sum of the cluster's CTA of rank q
    if constexpr (kCluster > 1) cluster_arrive_relaxed();
    const int t = threadIdx.x % kThreadsPerRow, r = threadIdx.x / kThreadsPerRow;
    const int rank = kCluster > 1 ? (int)blockIdx.x % kCluster : 0;  // the cluster spans kCluster consecutive CTAs
    const int64_t row = kCluster > 1 ? (int64_t)blockIdx.x / kCluster : (int64_t)blockIdx.x * kRows + r;
    const bool live = row < p.rows;  // the last CTA's extra rows still reach the barrier
    const int cols = (int)p.cols;
    const T* x = static_cast<const T*>(p.x) + (live ? row : 0) * p.x_stride;
    const int first = rank * kHeld * kThreadsPerRow;  // the CTA's first vector of the row

    uint4 held[kHeld];
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {  // every load in flight before the first is used
        const int c = (first + k * kThreadsPerRow + t) * kV;
        held[k] = live ? load_part<T>(x, c, cols) : make_uint4(0, 0, 0, 0);
    }
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
        float f[kV];
        unpack<T>(held[k], f);
#pragma unroll
        for (int i = 0; i < kV; ++i) sum = fmaf(f[i], f[i], sum);
    }
    sum = warp_sum(sum);
    if constexpr (kWarpsPerRow > 1) {
        if (t % 32 == 0) warp_sums[r][t / 32] = sum;
        __syncthreads();
        sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarpsPerRow; ++w) sum += warp_sums[r][w];  // the same order in every thread
    }
    if constexpr (kCluster > 1) {
        cg::cluster_group cluster = cg::this_cluster();
        cluster_wait();  // every CTA of the cluster has started
        if (threadIdx.x < kCluster) *cluster.map_shared_rank(&cta_sums[rank], (int)threadIdx.x) = sum;
        cluster.sync();  // release and acquire: all kCluster sums are in every CTA's cta_sums
        sum = 0.0f;
#pragma unroll
        for (int q = 0; q < kCluster; ++q) sum += cta_sums[q];  // rank order, in every CTA
    }
    if (!live) return;
    const float rstd = rsqrtf(sum / (float)cols + p.eps);
    if (t == 0 && rank == 0 && p.rstd) p.rstd[row] = rstd;

    const T* weight = static_cast<const T*>(p.weight);
    T* out = static_cast<T*>(p.out) + row * p.out_stride;
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
        const int c = (first + k * kThreadsPerRow + t) * kV;
        if (c >= cols) break;  // vectors past the row's end: those of every later k are too
        float f[kV], w[kV];
        unpack<T>(held[k], f);
        if (weight) unpack<T>(load_part<T>(weight, c, cols), w);
#pragma unroll
        for (int i = 0; i < kV; ++i) f[i] = weight ? f[i] * rstd * w[i] : f[i] * rstd;
        store_part<T>(out, c, cols, pack<T>(f));
    }
}

namespace {

template <int kThreadsPerRow_, int kHeld_, int kCluster_ = 1>
struct Config {
    static constexpr int kThreadsPerRow = kThreadsPerRow_, kHeld = kHeld_, kCluster = kCluster_;
    static constexpr int kRows = kThreadsPerRow_ >= kMinCtaThreads ? 1 : kMinCtaThreads / kThreadsPerRow_;
};

// f(Config<...>{}) for the smallest configuration that holds a row of `cols` elements of T;
// f(nullptr) when none does.
template <typename T, typename F>
int with_config(int64_t cols, F&& f) {
    constexpr int kV = kVec16<T>, kN = kVectorsPerThread;
    if (cols <= 32 * 1 * kV) return f(Config<32, 1>{});
    if (cols <= 32 * 2 * kV) return f(Config<32, 2>{});
    if (cols <= 32 * 4 * kV) return f(Config<32, 4>{});
    if (cols <= 32 * kN * kV) return f(Config<32, kN>{});
    if (cols <= 64 * kN * kV) return f(Config<64, kN>{});
    if (cols <= 128 * kN * kV) return f(Config<128, kN>{});
    if (cols <= 256 * kN * kV) return f(Config<256, kN>{});
    if (cols <= 512 * kN * kV) return f(Config<512, kN>{});
    constexpr int64_t kSlice = kSliceThreads * kN * kV;  // what one slice's CTA holds (32k bf16 columns)
    if (cols <= 2 * kSlice) return f(Config<kSliceThreads, kN, 2>{});
    if (cols <= 4 * kSlice) return f(Config<kSliceThreads, kN, 4>{});
    if (cols <= kMaxCluster * kSlice) return f(Config<kSliceThreads, kN, kMaxCluster>{});
    constexpr int64_t kCta = kMaxThreadsPerRow * kN * kV;  // past 8 slices: stage 05's 1024-thread CTAs
    if (cols <= kMaxCluster * kCta) return f(Config<kMaxThreadsPerRow, kN, kMaxCluster>{});
    return f(nullptr);
}

// Whether every row of x and out (and weight) starts on a 16-byte boundary.
template <typename T>
bool rows_aligned(const RmsNormParams& p) {
    auto ok = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
    return ok(p.x) && ok(p.out) && ok(p.weight) && (p.x_stride * sizeof(T)) % 16 == 0 &&
           (p.out_stride * sizeof(T)) % 16 == 0;
}

template <typename T, int kVec>
void launch_two_pass(const RmsNormParams& p, cudaStream_t stream) {
    if (p.cols <= kWarpMaxCols)
        rmsnorm_warp_per_row<T, kVec><<<(unsigned)((p.rows + kRowsPerCta - 1) / kRowsPerCta), kThreads, 0, stream>>>(p);
    else
        rmsnorm_cta_per_row<T, kVec><<<(unsigned)p.rows, kCtaThreads, 0, stream>>>(p);
}

// A cluster launch: kCluster consecutive CTAs of the grid form a cluster.
template <typename T, typename C>
cudaError_t launch_cluster(const RmsNormParams& p, cudaStream_t stream) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3((unsigned)(p.rows * C::kCluster));
    config.blockDim = dim3(C::kThreadsPerRow);
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = C::kCluster;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, rmsnorm_rows<T, C::kThreadsPerRow, C::kHeld, 1, C::kCluster>, p);
}

template <typename T>
int launch_typed(const RmsNormParams& p, cudaStream_t stream, char* err, int errlen) {
    if (p.rows > INT32_MAX / kMaxCluster) {
        snprintf(err, errlen, "rows must be below 2^31 / %d (the grid holds a cluster per row)", kMaxCluster);
        return 1;
    }
    const bool aligned = rows_aligned<T>(p);
    cudaError_t launched = cudaSuccess;
    with_config<T>(p.cols, [&](auto config) {
        using C = decltype(config);
        if constexpr (std::is_same_v<C, std::nullptr_t>) {
            if (aligned)
                launch_two_pass<T, kVec16<T>>(p, stream);
            else
                launch_two_pass<T, 1>(p, stream);
        } else if (!aligned) {
            launch_two_pass<T, 1>(p, stream);
        } else if constexpr (C::kCluster > 1) {
            launched = launch_cluster<T, C>(p, stream);
        } else {
            const unsigned ctas = (unsigned)((p.rows + C::kRows - 1) / C::kRows);
            rmsnorm_rows<T, C::kThreadsPerRow, C::kHeld, C::kRows, 1>
                <<<ctas, C::kThreadsPerRow * C::kRows, 0, stream>>>(p);
        }
        return 0;
    });
    RMS_CHECK(launched, err, errlen);
    RMS_CHECK(cudaGetLastError(), err, errlen);
    return 0;
}

template <typename T, int kVec>
int describe_two_pass(const RmsNormParams& p, RmsKernelInfo* info, char* err, int errlen) {
    const bool warp = p.cols <= kWarpMaxCols;
    snprintf(info->variant, sizeof(info->variant), "%s per row, read twice<%s, %d-byte accesses>",
             warp ? "warp" : "CTA", kDtypeName<T>, kVec * (int)sizeof(T));
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

template <typename T>
int describe_typed(const RmsNormParams& p, RmsKernelInfo* info, char* err, int errlen) {
    const bool aligned = rows_aligned<T>(p);
    return with_config<T>(p.cols, [&](auto config) {
        using C = decltype(config);
        if constexpr (std::is_same_v<C, std::nullptr_t>) {
            return aligned ? describe_two_pass<T, kVec16<T>>(p, info, err, errlen)
                           : describe_two_pass<T, 1>(p, info, err, errlen);
        } else {
            if (!aligned) return describe_two_pass<T, 1>(p, info, err, errlen);
            snprintf(info->variant, sizeof(info->variant), "row in registers<%s, %d threads/row, %d vectors, cluster %d>",
                     kDtypeName<T>, C::kThreadsPerRow, C::kHeld, C::kCluster);
            info->threads = C::kThreadsPerRow * C::kRows;
            info->rows_per_cta = C::kRows;
            info->threads_per_row = C::kThreadsPerRow;
            info->cluster = C::kCluster;
            info->vector_bytes = 16;
            info->elements_per_thread = C::kHeld * kVec16<T>;
            info->dynamic_smem = 0;
            return rms_describe_kernel(rmsnorm_rows<T, C::kThreadsPerRow, C::kHeld, C::kRows, C::kCluster>, info, err,
                                       errlen);
        }
    });
}

}  // namespace

HOPATTN_EXPORT int hopattn_rmsnorm_launch(const RmsNormParams* p, cudaStream_t stream, char* err, int errlen) {
    if (rms_check_params(p, err, errlen)) return 1;
    if (p->rows == 0) return 0;
    return rms_dispatch(p->dtype, [&](auto t) { return launch_typed<decltype(t)>(*p, stream, err, errlen); });
}

HOPATTN_EXPORT int hopattn_rmsnorm_describe(const RmsNormParams* p, RmsKernelInfo* info, char* err, int errlen) {
    if (rms_check_params(p, err, errlen)) return 1;
    return rms_dispatch(p->dtype, [&](auto t) { return describe_typed<decltype(t)>(*p, info, err, errlen); });
}
