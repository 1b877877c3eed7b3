// Softmax, stage 06: stage 05's rows in registers, slices and clusters, with a lean element loop.
//
//   y[r, c] = exp(x[r, c] − m[r]) / s[r],   m[r] = max_c x[r, c],   s[r] = Σ_c exp(x[r, c] − m[r])
//
// Stage 05 issues about 24 SASS instructions an element (bf16, a full row): on the way to the pair the
// bounds selects (a compare and an FSEL an element), the running max, one rescale a vector (an exp2f
// and a compare), and exp2f's range check around every MUFU.EX2 (FSETP, two predicated FMULs); on the
// way out a second exp2f with its range check, the scale, the pack. At the copy's rate an SM can issue
// about 31 an element (128 a clock for 4.07 bf16 elements a clock): 24 of them leave the SM short of
// issue slots while it also waits at its barriers. Here the held row is walked with the row's
// decisions taken once, outside the element loop (the cross-entropy's stage 05, applied to softmax):
//
//   1. the loads put −inf past the row's end, so no element is masked; whether all of a thread's
//      vectors lie inside the row is decided once (`whole`): the loads, the sum and the stores of a
//      whole thread have no bounds checks, those of the row's last threads keep them;
//   2. the thread's max first, over its held vectors in packed 16-bit pairs (HMNMX2: half an
//      instruction an element in bf16 and fp16); one max, so no vector is rescaled;
//   3. s = Σ exp(x − m) from that max, with ex2.approx.ftz (one MUFU op: s holds the max's own 1, so
//      the terms below 2^-126 that the flush loses cannot move it); x − m is formed before the multiply
//      by log2 e (an FFMA of x · log2 e − m · log2 e would lose |m| · 2^-24); two chains of adds;
//   4. the pairs merged as stage 05's (shuffles, shared memory, the cluster's distributed shared memory);
//   5. the output as r · (r · (1/s)), r = 2^((x − m) · log2 e / 2): one MUFU op and four FP32
//      instructions an element, exact down to fp32's subnormals without exp2f's range check (r is normal
//      down to 2^-126, where r² is below the smallest subnormal), rounded to T once, as stage 05's.
//
// A row of −inf keeps stage 05's NaN: its max is −inf, s = 0, and x − m = −inf − (−inf) is NaN in every
// element. Configurations, clusters, the launcher and the fallback (stage 02's kernels: rows past 16
// slices of stage 04's clusters, rows not aligned to 16 bytes) are stage 05's, unchanged.
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

// ---- The held vectors: loaded with −inf past the row's end, unpacked with bit operations, maxed packed.

// The vector of T at column c of a row of `cols` elements: 16 bytes at once where the whole vector is
// inside the row, element by element at the row's end, −inf past it (no part of the max or of s).
template <typename T>
__device__ __forceinline__ uint4 load_held(const T* row, int c, int cols) {
    constexpr int kV = kVec16<T>;
    if (c + kV <= cols) return *reinterpret_cast<const uint4*>(row + c);
    T t[kV];
#pragma unroll
    for (int i = 0; i < kV; ++i) t[i] = c + i < cols ? row[c + i] : from_float<T>(-INFINITY);
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

// A held vector in fp32: bf16 by a shift or a mask a value (a bf16 is the top half of its fp32).
template <typename T>
__device__ __forceinline__ void to_floats(const uint4& raw, float (&f)[kVec16<T>]) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    } else {
        unpack<T>(raw, f);
    }
}

// The lane-wise max of two held vectors: two 16-bit values an instruction (max.bf16x2 / max.f16x2,
// which, as fmaxf, return the other operand for one NaN), fmaxf in fp32.
template <typename T>
__device__ __forceinline__ uint4 max_packed(const uint4& a, const uint4& b) {
    if constexpr (std::is_same_v<T, float>) {
        return make_uint4(__float_as_uint(fmaxf(__uint_as_float(a.x), __uint_as_float(b.x))),
                          __float_as_uint(fmaxf(__uint_as_float(a.y), __uint_as_float(b.y))),
                          __float_as_uint(fmaxf(__uint_as_float(a.z), __uint_as_float(b.z))),
                          __float_as_uint(fmaxf(__uint_as_float(a.w), __uint_as_float(b.w))));
    } else {
        using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
        const T2* pa = reinterpret_cast<const T2*>(&a);
        const T2* pb = reinterpret_cast<const T2*>(&b);
        uint4 out;
        T2* po = reinterpret_cast<T2*>(&out);
#pragma unroll
        for (int i = 0; i < 4; ++i) po[i] = __hmax2(pa[i], pb[i]);
        return out;
    }
}

// 2^y in one MUFU op; results below 2^-126 flush to 0 (used where no such result can matter).
__device__ __forceinline__ float ex2_ftz(float y) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
    return r;
}

constexpr float kHalfLog2e = 0.5f * kLog2e;

// ---- A thread's pair: the max first, then s from it.

// The max of the thread's vectors (those past the row's end hold −inf), packed until the last step.
template <typename T, int kHeld>
__device__ __forceinline__ float held_max(const uint4 (&held)[kHeld]) {
    uint4 v = held[0];
#pragma unroll
    for (int k = 1; k < kHeld; ++k) v = max_packed<T>(v, held[k]);
    float f[kVec16<T>];
    to_floats<T>(v, f);
    float m = f[0];
#pragma unroll
    for (int i = 1; i < kVec16<T>; ++i) m = fmaxf(m, f[i]);
    return m;
}

// (m, Σ exp(x − m)) of the thread's vectors; kWhole: all of them inside the row (no check); otherwise
// those past the row's end are skipped (they hold −inf: they would add 0).
template <typename T, int kHeld, int kThreadsPerRow, bool kWhole>
__device__ __forceinline__ MaxSum held_pair(const uint4 (&held)[kHeld], int first, int t, int cols) {
    constexpr int kV = kVec16<T>;
    const float m = held_max<T>(held);
    const float base = m == -INFINITY ? 0.0f : m;  // nothing but −inf: exp(−inf − 0) = 0, not exp(NaN)
    float s0 = 0.0f, s1 = 0.0f;                    // two chains of adds, not one
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
        if (!kWhole && (first + k * kThreadsPerRow + t) * kV >= cols) break;  // every later k is past it too
        float f[kV];
        to_floats<T>(held[k], f);
#pragma unroll
        for (int i = 0; i < kV; ++i) {
            const float e = ex2_ftz((f[i] - base) * kLog2e);  // x − m first: exact for huge x
            if (i % 2) s1 += e;
            else s0 += e;
        }
    }
    return {m, s0 + s1};
}

// The output of a held vector: r · (r · inv), r = 2^((x − m) log2 e / 2), rounded to T once.
template <typename T>
__device__ __forceinline__ uint4 out_vector(const uint4& raw, float m, float inv) {
    float f[kVec16<T>];
    to_floats<T>(raw, f);
#pragma unroll
    for (int i = 0; i < kVec16<T>; ++i) {
        const float r = ex2_ftz((f[i] - m) * kHalfLog2e);  // normal down to 2^-126: r² reaches every subnormal
        f[i] = r * (r * inv);
    }
    return pack<T>(f);
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
    // The row's one decision: all of this thread's vectors inside the row (no check below), or not.
    const bool whole = live && (first + (kHeld - 1) * kThreadsPerRow + t + 1) * kV <= cols;

    uint4 held[kHeld];
    if (whole) {
#pragma unroll
        for (int k = 0; k < kHeld; ++k)  // every load in flight before the first is used
            held[k] = *reinterpret_cast<const uint4*>(x + (first + k * kThreadsPerRow + t) * kV);
    } else {
        const uint4 none = load_held<T>(x, cols, cols);  // a vector of −inf
#pragma unroll
        for (int k = 0; k < kHeld; ++k) {
            const int c = (first + k * kThreadsPerRow + t) * kV;
            held[k] = live ? load_held<T>(x, c, cols) : none;
        }
    }
    MaxSum pair = whole ? held_pair<T, kHeld, kThreadsPerRow, true>(held, first, t, cols)
                        : held_pair<T, kHeld, kThreadsPerRow, false>(held, first, t, cols);
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
    const float m = pair.m, inv = 1.0f / pair.s;  // a row of −inf: m = −inf, inv = inf, every y NaN
    T* y = static_cast<T*>(p.y) + row * p.y_stride;
    if (whole) {
#pragma unroll
        for (int k = 0; k < kHeld; ++k) {
            const int c = (first + k * kThreadsPerRow + t) * kV;
            *reinterpret_cast<uint4*>(y + c) = out_vector<T>(held[k], m, inv);
        }
    } else {
#pragma unroll
        for (int k = 0; k < kHeld; ++k) {
            const int c = (first + k * kThreadsPerRow + t) * kV;
            if (c >= cols) break;
            store_part<T>(y, c, cols, out_vector<T>(held[k], m, inv));
        }
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
