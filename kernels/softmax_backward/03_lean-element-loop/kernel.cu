// Softmax backward, stage 03: stage 02's rows in registers and clusters, with a lean element loop.
//
//   dx[r, c] = y[r, c] · (dy[r, c] − d[r]),   d[r] = Σ_c y[r, c] · dy[r, c]
//
// Stage 02 holds y and dy packed, 16 registers a thread, yet compiles to 47–49 registers (59 in the
// clusters): its keep_packed is an empty asm, which vanishes before ptxas, so ptxas reuses the dot's
// 32 unpacked fp32 values for dx and keeps them all alive across the reduction. At 48 or 64 registers
// a 1024-thread CTA takes all of an SM's 64K registers: at 16k, 64k and 256k bf16 columns an SM holds
// one CTA, which loads, waits at its barriers with nothing in flight, then stores. Its whole path (a
// thread whose vectors all lie inside the row) also spends more instructions on the row's bookkeeping
// than on its 16 elements: a bounds check a vector on the way in and out, two instructions for the
// upper bf16 of a pair, and every thread adding all 32 warp sums (8 LDS.128, 32 FADD). Here the held
// row is walked with the row's decisions taken once, outside the element loop:
//
//   1. whether all of a thread's vectors lie inside the row is decided once (`whole`): the loads and
//      stores of a whole thread have no bounds checks; those of the row's last threads keep stage 02's;
//   2. a bf16 unpacks by a shift or a mask for the dot (one instruction an element) and by a prmt for
//      dx (`to_floats_again`: the same values by instructions ptxas cannot match with the dot's), so the
//      dot's fp32 values die at the dot and only y and dy packed, 16 registers, live across the
//      reduction (fp16: an identity prmt that ptxas keeps, then its conversion);
//   3. a row's partial sums (its warps', then its cluster's CTAs') are read one a lane and added by
//      shuffles (for 32 warps: 1 LDS and 5 SHFL + FADD, not 8 LDS.128 and 32 FADD), the same bits in
//      every thread of every CTA;
//   4. so every configuration fits 32 registers, which __launch_bounds__ holds the compiler to
//      (kSmThreads / CTA threads CTAs an SM): two 1024-thread CTAs an SM at 16k–256k, where stage 02
//      has one, so that one CTA's loads overlap the other's reduction, barriers and stores.
//
// The arithmetic is stage 02's: fp32, d = fmaf(y, dy, d) over a thread's elements in stage 02's order,
// dx = y · (dy − d) rounded to T once; only the order in which the warps' and CTAs' sums are added
// differs (a fixed butterfly: the result repeats bit for bit). Configurations, clusters, the launcher
// and the fallback (stage 01's kernels: longer rows, rows not aligned to 16 bytes, a GPU where no
// cluster of the size fits) are stage 02's, unchanged (the source below `namespace {` is byte for byte
// stage 02's).
#include "../../softmax/common/abi_softmax.h"
#include "../../rmsnorm/common/elements.cuh"

#include <cooperative_groups.h>
#include <type_traits>

namespace cg = cooperative_groups;

// Stage 01's kernels: the path for rows this stage's kernel cannot hold or vectorize.
constexpr int kThreads = 256;                 // threads per CTA of the warp-per-row kernel
constexpr int kRowsPerCta = kThreads / 32;    // a row per warp
constexpr int kWarpMaxCols = 1024;            // longer rows go to a CTA each
constexpr int kCtaThreads = 512;              // threads per CTA of the CTA-per-row kernel
constexpr int kUnroll = 4;                    // vectors of y (and of dy) a thread has in flight per loop step

// This stage's kernel: y and dy in registers.
constexpr int kVectorsPerThread = 2;          // 16-byte vectors of y, and of dy, a thread holds (16 registers)
constexpr int kMaxThreadsPerRow = 1024;       // the most threads a row gets in one CTA
constexpr int kMinCtaThreads = 256;           // short rows are packed kMinCtaThreads / threads_per_row to a CTA
constexpr int kMaxCluster = 16;               // CTAs a row may span (past 8: a non-portable cluster size)
constexpr int kSmThreads = 2048;              // threads an SM holds: kSmThreads / CTA threads CTAs an SM, 32 registers

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

// ---- The held vectors: 16 bytes at once inside the row, element by element at its end, zeros past it.

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

// A held vector in fp32: a bf16 by a shift or a mask (a bf16 is the top half of its fp32), one
// instruction a value; fp16 by its conversion (one HADD2.F32 a value); fp32 as it is.
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

// A held vector in fp32 for dx: the same values as to_floats, by instructions ptxas cannot match with
// the dot's unpack, so that the dot's fp32 values die at the dot and only y and dy packed (16 registers)
// are live across the reduction. Stage 02's keep_packed, an empty asm, vanished before ptxas, which
// then kept all 32 fp32 values of the dot for dx. bf16: prmt, the value's two bytes on top of two zero
// bytes (the dot shifts and masks); fp16: its conversion after an identity prmt that ptxas keeps (a
// conversion has no second form); fp32: as it is.
template <typename T>
__device__ __forceinline__ void to_floats_again(const uint4& raw, float (&f)[kVec16<T>]) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            f[2 * i] = __uint_as_float(__byte_perm(w[i], 0u, 0x1044));      // bytes 1, 0 over two zero bytes
            f[2 * i + 1] = __uint_as_float(__byte_perm(w[i], 0u, 0x3244));  // bytes 3, 2 over two zero bytes
        }
    } else if constexpr (std::is_same_v<T, __half>) {
        uint4 v = raw;
        asm volatile("prmt.b32 %0, %0, 0, 0x3210;" : "+r"(v.x));
        asm volatile("prmt.b32 %0, %0, 0, 0x3210;" : "+r"(v.y));
        asm volatile("prmt.b32 %0, %0, 0, 0x3210;" : "+r"(v.z));
        asm volatile("prmt.b32 %0, %0, 0, 0x3210;" : "+r"(v.w));
        unpack<T>(v, f);
    } else {
        unpack<T>(raw, f);
    }
}

// The sum of v over the kN lanes of each aligned group of kN (a power of two, at most 32): the same
// butterfly in every group, so every lane of every group holds the same bits when the groups hold the
// same values.
template <int kN>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
    for (int offset = kN / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }

// kThreadsPerRow threads of each of kCluster CTAs hold a row, kHeld vectors of y and of dy each
// (vector k of thread t of the CTA of rank q: (q · kHeld + k) · kThreadsPerRow + t); kRows rows per
// CTA when kCluster is 1. kSmThreads / (kThreadsPerRow · kRows) CTAs an SM: at most 32 registers.
template <typename T, int kThreadsPerRow, int kHeld, int kRows, int kCluster>
__global__ void __launch_bounds__(kThreadsPerRow * kRows, kSmThreads / (kThreadsPerRow * kRows))
    softmax_bwd_rows(SoftmaxBackwardParams p) {
    static_assert(kCluster == 1 || kRows == 1, "a cluster shares one row");
    constexpr int kV = kVec16<T>;
    constexpr int kWarpsPerRow = kThreadsPerRow / 32;
    __shared__ float warp_sums[kRows][kWarpsPerRow];
    __shared__ float cta_sums[kCluster];  // slot q: the sum of the cluster's CTA of rank q
    if constexpr (kCluster > 1) cluster_arrive_relaxed();
    const int t = threadIdx.x % kThreadsPerRow, r = threadIdx.x / kThreadsPerRow;
    const int lane = (int)threadIdx.x % 32;
    const int rank = kCluster > 1 ? (int)blockIdx.x % kCluster : 0;
    const int64_t row = kCluster > 1 ? (int64_t)blockIdx.x / kCluster : (int64_t)blockIdx.x * kRows + r;
    const bool live = row < p.rows;  // the last CTA's extra rows still reach the barrier
    const int cols = (int)p.cols;
    const T* y = static_cast<const T*>(p.y) + (live ? row : 0) * p.y_stride;
    const T* dy = static_cast<const T*>(p.dy) + (live ? row : 0) * p.dy_stride;
    const int first = rank * kHeld * kThreadsPerRow;  // the CTA's first vector of the row
    // The row's one decision: all of this thread's vectors inside the row (no check below), or not.
    const bool whole = live && (first + (kHeld - 1) * kThreadsPerRow + t + 1) * kV <= cols;

    uint4 y_held[kHeld], dy_held[kHeld];
    if (whole) {
#pragma unroll
        for (int k = 0; k < kHeld; ++k) {  // every load in flight before the first is used
            const int c = (first + k * kThreadsPerRow + t) * kV;
            y_held[k] = *reinterpret_cast<const uint4*>(y + c);
            dy_held[k] = *reinterpret_cast<const uint4*>(dy + c);
        }
    } else {
#pragma unroll
        for (int k = 0; k < kHeld; ++k) {
            const int c = (first + k * kThreadsPerRow + t) * kV;
            y_held[k] = live ? load_part<T>(y, c, cols) : make_uint4(0, 0, 0, 0);
            dy_held[k] = live ? load_part<T>(dy, c, cols) : make_uint4(0, 0, 0, 0);
        }
    }
    float d = 0.0f;  // zeros past the row's end add nothing; stage 02's order
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
        float yv[kV], g[kV];
        to_floats<T>(y_held[k], yv);
        to_floats<T>(dy_held[k], g);
#pragma unroll
        for (int i = 0; i < kV; ++i) d = fmaf(yv[i], g[i], d);
    }
    d = warp_sum(d);
    if constexpr (kWarpsPerRow > 1) {
        if (t % 32 == 0) warp_sums[r][t / 32] = d;
        __syncthreads();
        d = group_sum<kWarpsPerRow>(warp_sums[r][lane % kWarpsPerRow]);  // a sum a lane, then the butterfly
    }
    if constexpr (kCluster > 1) {
        cg::cluster_group cluster = cg::this_cluster();
        cluster_wait();  // every CTA of the cluster has started
        if (threadIdx.x < kCluster) *cluster.map_shared_rank(&cta_sums[rank], (int)threadIdx.x) = d;
        cluster.sync();  // release and acquire: all kCluster sums are in every CTA's cta_sums
        d = group_sum<kCluster>(cta_sums[lane % kCluster]);  // the same bits in every CTA
    }
    if (!live) return;
    T* dx = static_cast<T*>(p.dx) + row * p.dx_stride;
    if (whole) {
#pragma unroll
        for (int k = 0; k < kHeld; ++k) {
            const int c = (first + k * kThreadsPerRow + t) * kV;
            float yv[kV], g[kV];
            to_floats_again<T>(y_held[k], yv);
            to_floats_again<T>(dy_held[k], g);
#pragma unroll
            for (int i = 0; i < kV; ++i) g[i] = yv[i] * (g[i] - d);
            *reinterpret_cast<uint4*>(dx + c) = pack<T>(g);
        }
    } else {
#pragma unroll
        for (int k = 0; k < kHeld; ++k) {
            const int c = (first + k * kThreadsPerRow + t) * kV;
            if (c >= cols) break;  // vectors past the row's end: those of every later k are too
            float yv[kV], g[kV];
            to_floats_again<T>(y_held[k], yv);
            to_floats_again<T>(dy_held[k], g);
#pragma unroll
            for (int i = 0; i < kV; ++i) g[i] = yv[i] * (g[i] - d);
            store_part<T>(dx, c, cols, pack<T>(g));
        }
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
    if (cols <= 32 * kN * kV) return f(Config<32, kN>{});
    if (cols <= 64 * kN * kV) return f(Config<64, kN>{});
    if (cols <= 128 * kN * kV) return f(Config<128, kN>{});
    if (cols <= 256 * kN * kV) return f(Config<256, kN>{});
    if (cols <= 512 * kN * kV) return f(Config<512, kN>{});
    constexpr int64_t kCta = kMaxThreadsPerRow * kN * kV;  // what one CTA holds
    if (cols <= kCta) return f(Config<kMaxThreadsPerRow, kN>{});
    if (cols <= 2 * kCta) return f(Config<kMaxThreadsPerRow, kN, 2>{});
    if (cols <= 4 * kCta) return f(Config<kMaxThreadsPerRow, kN, 4>{});
    if (cols <= 8 * kCta) return f(Config<kMaxThreadsPerRow, kN, 8>{});
    if (cols <= kMaxCluster * kCta) return f(Config<kMaxThreadsPerRow, kN, kMaxCluster>{});
    return f(nullptr);
}

// Whether a cluster of C::kCluster CTAs fits on this GPU at all (16, a non-portable size, needs a GPC
// with 16 SMs free); where none does, stage 01's kernels run instead.
template <typename T, typename C>
bool cluster_fits() {
    auto kernel = softmax_bwd_rows<T, C::kThreadsPerRow, C::kHeld, 1, C::kCluster>;
    if constexpr (C::kCluster > 8) {
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
            cudaGetLastError();  // not sticky: cleared, and the fallback runs
            return false;
        }
    }
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(C::kCluster);
    config.blockDim = dim3(C::kThreadsPerRow);
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = C::kCluster;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return clusters > 0;
}

template <typename T, typename C>
cudaError_t launch_cluster(const SoftmaxBackwardParams& p, cudaStream_t stream) {
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
    auto kernel = softmax_bwd_rows<T, C::kThreadsPerRow, C::kHeld, 1, C::kCluster>;
    if constexpr (C::kCluster > 8) {
        const cudaError_t allowed = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        if (allowed != cudaSuccess) return allowed;
    }
    return cudaLaunchKernelEx(&config, kernel, p);
}

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
        } else if constexpr (C::kCluster > 1) {
            if (cluster_fits<T, C>()) launched = launch_cluster<T, C>(p, stream);
            else launch_vec<T, kVec16<T>>(p, stream);
        } else {
            const unsigned ctas = (unsigned)((p.rows + C::kRows - 1) / C::kRows);
            softmax_bwd_rows<T, C::kThreadsPerRow, C::kHeld, C::kRows, 1>
                <<<ctas, C::kThreadsPerRow * C::kRows, 0, stream>>>(p);
        }
        return 0;
    });
    RMS_CHECK(launched, err, errlen);
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
        const bool aligned = rows_aligned<T>(*p);
        return with_config<T>(p->cols, [&](auto config) -> int {
            using C = decltype(config);
            if constexpr (std::is_same_v<C, std::nullptr_t>) {
                return aligned ? describe_vec<T, kVec16<T>>(*p, info, err, errlen) : describe_vec<T, 1>(*p, info, err, errlen);
            } else {
                if (!aligned) return describe_vec<T, 1>(*p, info, err, errlen);
                if constexpr (C::kCluster > 1) {
                    if (!cluster_fits<T, C>()) return describe_vec<T, kVec16<T>>(*p, info, err, errlen);
                }
                snprintf(info->variant, sizeof(info->variant), "y and dy in registers<%s, %d threads/row, %d vectors, cluster %d>",
                         kDtypeName<T>, C::kThreadsPerRow, C::kHeld, C::kCluster);
                info->threads = C::kThreadsPerRow * C::kRows;
                info->rows_per_cta = C::kRows;
                info->threads_per_row = C::kThreadsPerRow;
                info->cluster = C::kCluster;
                info->vector_bytes = 16;
                info->elements_per_thread = C::kHeld * kVec16<T>;
                info->dynamic_smem = 0;
                return softmax_describe_kernel(softmax_bwd_rows<T, C::kThreadsPerRow, C::kHeld, C::kRows, C::kCluster>,
                                               info, err, errlen);
            }
        });
    });
}
