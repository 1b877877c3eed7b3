// Softmax, stage 05: a long row cut into slices of 256-thread CTAs, four of them an SM, so that one
// CTA's exponentials run while another's loads and stores are in flight.
//
//   y[r, c] = exp(x[r, c] − m[r]) / s[r],   m[r] = max_c x[r, c],   s[r] = Σ_c exp(x[r, c] − m[r])
//
// Stage 04 holds a row of 32k–64k bf16 columns in one 1024-thread CTA and longer rows in clusters of
// such CTAs. At 57–59 registers a thread (allocated as 64), a 1024-thread CTA takes all of an SM's 64K
// registers: one CTA an SM, whose loads, exponentials and stores follow one another with nothing else
// in flight, where every element costs some 24 instructions (two exponentials, each with exp2f's range
// check, the bounds selects, the max and the sum). Here a row longer than a 512-thread CTA holds (32k
// bf16 columns, 16k fp32) is cut into slices of kSliceThreads = 256 threads × 8 vectors, one per CTA
// of a cluster of 4, 8 or kMaxCluster = 16 (past 8 a non-portable size, allowed where the GPU fits
// it), their pairs merged as stage 04 merges them. A slice's CTA compiles to 52–57 registers a
// thread, at most 64: four CTAs an SM (64K registers), the CTA shape stage 04 runs at 16k, where
// several CTAs share an SM. The kernel is stage 04's; only the launcher's configurations change.
// Rows past 16 slices (256k bf16, 128k fp32 columns) keep stage 04's clusters of kWideCluster = 8
// 1024-thread CTAs (up to 512k bf16 columns), as does a GPU that fits no cluster of 16. Shorter rows
// keep stage 04's configurations (the same SASS); longer rows, and rows not aligned to 16 bytes, run
// stage 02's kernels.
#include "../common/abi_softmax.h"
#include "../../rmsnorm/common/elements.cuh"

#include <cooperative_groups.h>
#include <type_traits>

namespace cg = cooperative_groups;

// Stage 02's kernels: the path for rows this stage's kernel cannot hold or vectorize.
constexpr int kThreads = 256;                 // threads per CTA of the warp-per-row kernel
constexpr int kRowsPerCta = kThreads / 32;    // a row per warp
constexpr int kWarpMaxCols = 1024;            // longer rows go to a CTA each
constexpr int kCtaThreads = 512;              // threads per CTA of the CTA-per-row kernel
constexpr int kUnroll = 4;                    // vectors a thread has in flight per loop step
constexpr float kLog2e = 1.4426950408889634f;

// This stage's kernel: the row in registers.
constexpr int kVectorsPerThread = 8;          // 16-byte vectors a thread holds (32 registers)
constexpr int kMaxThreadsPerRow = 1024;       // the most threads a row gets in one CTA (stage 04's, past 16 slices)
constexpr int kMinCtaThreads = 256;           // short rows are packed kMinCtaThreads / threads_per_row to a CTA
constexpr int kSliceThreads = 256;            // threads of a CTA that holds a slice of a long row
constexpr int kMaxCluster = 16;               // slices a row may span (past 8: a non-portable cluster size)
constexpr int kWideCluster = 8;               // stage 04's 1024-thread CTAs a longer row spans (portable)

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

// The vector of T at column c of a row of `cols` elements: 16 bytes at once where the whole vector is
// inside the row, element by element at the row's end, zeros past it.
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

// An empty asm that says it changes v: the compiler keeps the packed registers and unpacks them again
// for the output, instead of keeping the unpacked fp32 values (twice the registers) across the merge.
__device__ __forceinline__ void keep_packed(uint4& v) {
    asm volatile("" : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w));
}

// The cluster barrier in two halves (barrier.cluster.arrive / wait): the arrive says this CTA has
// started (its shared memory may be written by its peers), the wait waits for every CTA's arrive.
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }

// kThreadsPerRow threads of each of kCluster CTAs hold a row, kHeld vectors each (vector k of thread t
// of the CTA of rank q: (q · kHeld + k) · kThreadsPerRow + t, so each of the kHeld loads of a warp is
// 512 contiguous bytes); kRows rows per CTA when kCluster is 1.
template <typename T, int kThreadsPerRow, int kHeld, int kRows, int kCluster>
__global__ void __launch_bounds__(kThreadsPerRow * kRows) softmax_rows(SoftmaxParams p) {
    static_assert(kCluster == 1 || kRows == 1, "a cluster shares one row");
    constexpr int kV = kVec16<T>;
    constexpr int kWarpsPerRow = kThreadsPerRow / 32;
    __shared__ MaxSum warp_vals[kRows][kWarpsPerRow];
    __shared__ MaxSum cta_vals[kCluster];  // slot q: the pair of the cluster's CTA of rank q
    if constexpr (kCluster > 1) cluster_arrive_relaxed();
    const int t = threadIdx.x % kThreadsPerRow, r = threadIdx.x / kThreadsPerRow;
    const int rank = kCluster > 1 ? (int)blockIdx.x % kCluster : 0;  // the cluster spans kCluster consecutive CTAs
    const int64_t row = kCluster > 1 ? (int64_t)blockIdx.x / kCluster : (int64_t)blockIdx.x * kRows + r;
    const int first = rank * kHeld * kThreadsPerRow;  // the CTA's first vector of the row
    const bool live = row < p.rows;  // the last CTA's extra rows still reach the barrier
    const int cols = (int)p.cols;
    const T* x = static_cast<const T*>(p.x) + (live ? row : 0) * p.x_stride;

    uint4 held[kHeld];
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {  // every load in flight before the first is used
        const int c = (first + k * kThreadsPerRow + t) * kV;
        held[k] = live ? load_part<T>(x, c, cols) : make_uint4(0, 0, 0, 0);
    }
    MaxSum pair = {-INFINITY, 0.0f};
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
        const int c = (first + k * kThreadsPerRow + t) * kV;
        if (!live || c >= cols) break;  // vectors past the row's end: those of every later k are too
        float f[kV];
        unpack<T>(held[k], f);
#pragma unroll
        for (int i = 0; i < kV; ++i)
            if (c + i >= cols) f[i] = -INFINITY;  // past the row's end: no part of the max or the sum
        pair = add_elements<kV>(pair, f);
    }
#pragma unroll
    for (int k = 0; k < kHeld; ++k) keep_packed(held[k]);
    pair = warp_merge(pair);
    if constexpr (kWarpsPerRow > 1) {
        if (t % 32 == 0) warp_vals[r][t / 32] = pair;
        __syncthreads();
        pair = warp_vals[r][0];
#pragma unroll
        for (int w = 1; w < kWarpsPerRow; ++w) pair = merge(pair, warp_vals[r][w]);  // the same order everywhere
    }
    if constexpr (kCluster > 1) {
        cg::cluster_group cluster = cg::this_cluster();
        cluster_wait();  // every CTA of the cluster has started
        if (threadIdx.x < kCluster) *cluster.map_shared_rank(&cta_vals[rank], (int)threadIdx.x) = pair;
        cluster.sync();  // release and acquire: all kCluster pairs are in every CTA's cta_vals
        pair = cta_vals[0];
#pragma unroll
        for (int q = 1; q < kCluster; ++q) pair = merge(pair, cta_vals[q]);  // rank order, in every CTA
    }
    if (!live) return;
    const float m = pair.m, inv = 1.0f / pair.s;
    T* y = static_cast<T*>(p.y) + row * p.y_stride;
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
        const int c = (first + k * kThreadsPerRow + t) * kV;
        if (c >= cols) break;
        float f[kV];
        unpack<T>(held[k], f);
#pragma unroll
        for (int i = 0; i < kV; ++i) f[i] = exp2f((f[i] - m) * kLog2e) * inv;
        store_part<T>(y, c, cols, pack<T>(f));
    }
}

namespace {

template <typename T>
bool rows_aligned(const SoftmaxParams& p) {
    auto ok = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
    return ok(p.x) && ok(p.y) && (p.x_stride * sizeof(T)) % 16 == 0 && (p.y_stride * sizeof(T)) % 16 == 0;
}

template <int kThreadsPerRow_, int kHeld_, int kCluster_ = 1>
struct Config {
    static constexpr int kThreadsPerRow = kThreadsPerRow_, kHeld = kHeld_, kCluster = kCluster_;
    static constexpr int kRows = kThreadsPerRow_ >= kMinCtaThreads ? 1 : kMinCtaThreads / kThreadsPerRow_;
};

// f(Config<...>{}) for the smallest configuration that holds a row of `cols` elements of T;
// f(nullptr) when none does. Past a 512-thread CTA, a row is cut into slices of kSliceThreads; past
// kMaxCluster slices, it takes stage 04's clusters of 1024-thread CTAs.
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
    constexpr int64_t kSlice = kSliceThreads * kN * kV;  // what one slice's CTA holds
    if (cols <= 4 * kSlice) return f(Config<kSliceThreads, kN, 4>{});
    if (cols <= 8 * kSlice) return f(Config<kSliceThreads, kN, 8>{});
    if (cols <= kMaxCluster * kSlice) return f(Config<kSliceThreads, kN, kMaxCluster>{});
    constexpr int64_t kCta = kMaxThreadsPerRow * kN * kV;  // what one of stage 04's CTAs holds
    if (cols <= kWideCluster * kCta) return f(Config<kMaxThreadsPerRow, kN, kWideCluster>{});
    return f(nullptr);
}

template <typename T, typename C>
constexpr auto rows_kernel = softmax_rows<T, C::kThreadsPerRow, C::kHeld, C::kRows, C::kCluster>;

// The launch configuration of a cluster of C::kCluster CTAs, a row each cluster.
template <typename C>
struct ClusterLaunch {
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute attribute[1];
    ClusterLaunch(int64_t rows, cudaStream_t stream) {
        config.gridDim = dim3((unsigned)(rows * C::kCluster));  // kCluster consecutive CTAs form a cluster
        config.blockDim = dim3(C::kThreadsPerRow);
        config.stream = stream;
        attribute[0].id = cudaLaunchAttributeClusterDimension;
        attribute[0].val.clusterDim.x = C::kCluster;
        attribute[0].val.clusterDim.y = 1;
        attribute[0].val.clusterDim.z = 1;
        config.attrs = attribute;
        config.numAttrs = 1;
    }
};

// Whether a cluster of C::kCluster CTAs fits on this GPU (past 8, a non-portable size, the kernel must
// allow it, and the GPU may refuse); the errors of asking are cleared, not left sticky.
template <typename T, typename C>
bool cluster_fits() {
    if constexpr (C::kCluster > kWideCluster) {
        if (cudaFuncSetAttribute(rows_kernel<T, C>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
            cudaGetLastError();
            return false;
        }
    }
    ClusterLaunch<C> launch(1, nullptr);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, rows_kernel<T, C>, &launch.config) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return clusters > 0;
}

// g(C{}), or g() of stage 04's widest configuration (which holds any row C holds) where C is a
// cluster of more than kWideCluster slices and the GPU fits none.
template <typename T, typename C, typename G>
int with_fitting(G&& g) {
    if constexpr (C::kCluster > kWideCluster) {
        if (!cluster_fits<T, C>()) return g(Config<kMaxThreadsPerRow, kVectorsPerThread, kWideCluster>{});
    }
    return g(C{});
}

template <typename T, int kVec>
void launch_vec(const SoftmaxParams& p, cudaStream_t stream) {
    if (p.cols <= kWarpMaxCols)
        softmax_two_passes<T, kVec, 32><<<(unsigned)((p.rows + kRowsPerCta - 1) / kRowsPerCta), kThreads, 0, stream>>>(p);
    else
        softmax_two_passes<T, kVec, kCtaThreads><<<(unsigned)p.rows, kCtaThreads, 0, stream>>>(p);
}

// The row held in registers by configuration C: a cluster launch, or CTAs of C::kRows rows.
template <typename T, typename C>
cudaError_t launch_held(const SoftmaxParams& p, cudaStream_t stream) {
    if constexpr (C::kCluster > 1) {
        ClusterLaunch<C> launch(p.rows, stream);
        return cudaLaunchKernelEx(&launch.config, rows_kernel<T, C>, p);
    } else {
        const unsigned ctas = (unsigned)((p.rows + C::kRows - 1) / C::kRows);
        rows_kernel<T, C><<<ctas, C::kThreadsPerRow * C::kRows, 0, stream>>>(p);
        return cudaSuccess;
    }
}

template <typename T>
int launch_typed(const SoftmaxParams& p, cudaStream_t stream, char* err, int errlen) {
    if (p.rows > INT32_MAX / kMaxCluster) {
        snprintf(err, errlen, "rows must be below 2^31 / %d (the grid holds a cluster per row)", kMaxCluster);
        return 1;
    }
    const bool aligned = rows_aligned<T>(p);
    cudaError_t launched = cudaSuccess;
    with_config<T>(p.cols, [&](auto config) {
        using C = decltype(config);
        if constexpr (std::is_same_v<C, std::nullptr_t>) {
            if (aligned) launch_vec<T, kVec16<T>>(p, stream);
            else launch_vec<T, 1>(p, stream);
        } else if (!aligned) {
            launch_vec<T, 1>(p, stream);
        } else {
            with_fitting<T, C>([&](auto fitting) {
                launched = launch_held<T, decltype(fitting)>(p, stream);
                return 0;
            });
        }
        return 0;
    });
    RMS_CHECK(launched, err, errlen);
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

template <typename T, typename C>
int describe_held(RmsKernelInfo* info, char* err, int errlen) {
    snprintf(info->variant, sizeof(info->variant), "row in registers<%s, %d threads/row, %d vectors, cluster %d>",
             kDtypeName<T>, C::kThreadsPerRow, C::kHeld, C::kCluster);
    info->threads = C::kThreadsPerRow * C::kRows;
    info->rows_per_cta = C::kRows;
    info->threads_per_row = C::kThreadsPerRow;
    info->cluster = C::kCluster;
    info->vector_bytes = 16;
    info->elements_per_thread = C::kHeld * kVec16<T>;
    info->dynamic_smem = 0;
    return softmax_describe_kernel(rows_kernel<T, C>, info, err, errlen);
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
        const bool aligned = rows_aligned<T>(*p);
        return with_config<T>(p->cols, [&](auto config) -> int {
            using C = decltype(config);
            if constexpr (std::is_same_v<C, std::nullptr_t>) {
                return aligned ? describe_vec<T, kVec16<T>>(*p, info, err, errlen) : describe_vec<T, 1>(*p, info, err, errlen);
            } else {
                if (!aligned) return describe_vec<T, 1>(*p, info, err, errlen);
                return with_fitting<T, C>([&](auto fitting) { return describe_held<T, decltype(fitting)>(info, err, errlen); });
            }
        });
    });
}
