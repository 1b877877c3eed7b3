// Cross-entropy, stage 05: stage 04's rows in registers and clusters, with a lean element loop.
//
//   loss[r] = log s + (1 − ε)(m − x[r, t]) + ε (m − Σ x / V),  m = max_c x,  s = Σ_c exp(x − m)
//   dlogits[r, c] = g · (exp(x − m) / s − (1 − ε)[c = t] − ε / V)           (when dlogits is given)
//
// Stage 04 moves a copy's bytes but issues about 30 SASS instructions an element of the fused forward
// (bf16; 12 for the statistics, 18 for the gradient) where the SM can issue 32 at the copy's rate, and
// 13 of the forward's 16: it is bound by instruction issue, not by memory. They come from the
// element loop: every exp2f is four instructions (the subnormal range's test, halving and squaring
// around MUFU.EX2), the online rescale runs once a vector, Σ x is summed with ε = 0 too, and the
// gradient tests for an ignored row, compares the column with the target and applies g, on and uni
// element by element, under a branch each. Here the held row is walked as follows, every row-level
// decision taken once, outside the loop:
//
//   1. the thread's max over its held vectors, in packed 16-bit pairs (HMNMX2: half an instruction
//      an element in bf16 and fp16); past the row's end the loads hold −inf, so no element is masked;
//   2. s = Σ exp(x − max) from that one max — no rescale — with ex2.approx.ftz (one MUFU op: terms
//      below 2^-126 cannot move s, which holds 1); Σ x in a loop of its own only when ε ≠ 0; the
//      target's logit taken from the registers by the thread that holds it (no load of x[t]);
//   3. the records merged as stage 04's (shuffles, shared memory, the cluster's DSMEM);
//   4. the gradient as r · (r · a) + b, r = 2^((x − m) · log2e / 2), a = g / s, b = −g ε / V: one
//      MUFU op and four FP32 instructions an element, exact down to fp32's subnormals (r is normal
//      down to 2^-126, where its square is below the smallest subnormal); the target's column fixed
//      afterwards by the thread that holds it; an ignored row stored as zeros by a branch of its own.
//
// The targets (and dloss) are loaded after the row's loads are issued, so no row load waits for them.
// Configurations, clusters and the fallback (stage 02's kernels, included below, unchanged: rows
// past 256k bf16 / 128k fp32, rows not aligned to 16 bytes) are stage 04's.
#define CE_KERNELS_ONLY
#include "../02_online-one-pass/kernel.cu"

#include <cooperative_groups.h>
#include <type_traits>

namespace cg = cooperative_groups;

constexpr int kVectorsPerThread = 8;  // 16-byte vectors a thread holds (32 registers)
constexpr int kMaxCtaThreads = 256;   // threads of a CTA holding a slice, below the longest rows
constexpr int kLongCtaThreads = 512;  // … and for rows past kMaxCluster full 256-thread slices
constexpr int kMinCtaThreads = 256;   // short rows are packed kMinCtaThreads / threads_per_row to a CTA
constexpr int kMaxCluster = 8;        // CTAs a row may span (8: the portable cluster size)

__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }

// 2^y in one MUFU op; results below 2^-126 flush to 0 (where only the sum s uses it).
__device__ __forceinline__ float ex2_ftz(float y) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
    return r;
}

// ---- The held vectors: loaded with −inf past the row's end, unpacked with bit operations, maxed packed.

// The vector of T at column c, 16 bytes at once inside the row, element by element at its end, −inf
// past it (no part of the max or of s; Σ x and the stores still look at the column).
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

// A held vector in fp32: bf16 by a shift or a mask a value (a bf16 is the top half of its fp32).
template <typename T>
__device__ __forceinline__ void to_floats(const uint4& raw, float (&f)[kVec16<T>]) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
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
// which, as fmaxf, return the other operand for one NaN).
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

// The row's target in one int: its class (>= 0), kOutOfRange or kIgnored (held so across the merge).
constexpr int kOutOfRange = -1, kIgnored = -2;
__device__ __forceinline__ int target_column(Target tg) { return tg.ignored ? kIgnored : tg.ok ? tg.t : kOutOfRange; }
__device__ __forceinline__ Target target_of(int tcol) { return {tcol < 0 ? 0 : tcol, tcol == kIgnored, tcol >= 0}; }

// ---- The statistics of a thread's held vectors.

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

// m, s = Σ exp(x − m) and the target's logit (0 unless this thread holds column tt; tt < 0: none) of
// the thread's vectors; Σ x is left 0 (held_plain_sum adds it when ε ≠ 0).
template <typename T, int kHeld, int kThreadsPerRow>
__device__ __forceinline__ RowStats held_stats(const uint4 (&held)[kHeld], int first, int t, int cols, int tt) {
    constexpr int kV = kVec16<T>;
    RowStats st = empty_stats();
    st.m = held_max<T>(held);
    const float base = st.m == -INFINITY ? 0.0f : st.m;  // nothing but −inf: exp(−inf − 0) = 0, not NaN
    float s0 = 0.0f, s1 = 0.0f;                          // two chains of adds, not one
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
        const int c = (first + k * kThreadsPerRow + t) * kV;
        if (c >= cols) break;  // past the row's end: every later k is too
        float f[kV];
        to_floats<T>(held[k], f);
#pragma unroll
        for (int i = 0; i < kV; ++i) {
            const float e = ex2_ftz((f[i] - base) * kLog2e);  // x − m first: exact for huge logits
            if (i % 2) s1 += e;
            else s0 += e;
        }
        if ((unsigned)(tt - c) < (unsigned)kV) {  // this vector holds the target's column
#pragma unroll
            for (int i = 0; i < kV; ++i)
                if (c + i == tt) st.xt = f[i];
        }
    }
    st.s = s0 + s1;
    return st;
}

// Σ x of the thread's vectors (label smoothing's term), the columns past the row's end left out.
template <typename T, int kHeld, int kThreadsPerRow>
__device__ __forceinline__ float held_plain_sum(const uint4 (&held)[kHeld], int first, int t, int cols) {
    constexpr int kV = kVec16<T>;
    float sx = 0.0f;
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
        const int c = (first + k * kThreadsPerRow + t) * kV;
        if (c >= cols) break;
        float f[kV];
        to_floats<T>(held[k], f);
#pragma unroll
        for (int i = 0; i < kV; ++i) sx += c + i < cols ? f[i] : 0.0f;
    }
    return sx;
}

// ---- The gradient: dl = r · (r · a) + b, r = 2^((x − m) log2e / 2); the target's column adds −g (1 − ε).

struct LeanGrad {
    float m, a, b, bt;  // bt: b − g (1 − ε), the target's column
    int t;              // the target's column; −1: none (out of range)
};

__device__ __forceinline__ LeanGrad lean_grad(const CrossEntropyParams& p, float g_in, RowStats st, Target tg) {
    const float eps = p.label_smoothing;
    const float g = tg.ok ? p.grad_scale * g_in : NAN;  // out of range: the row's gradient is NaN, as its loss
    const float b = -g * (eps / (float)p.cols);
    return {st.m, g / st.s, b, b - g * (1.0f - eps), tg.ok ? tg.t : -1};
}

constexpr float kHalfLog2e = 0.5f * kLog2e;

__device__ __forceinline__ float grad_element(const LeanGrad& gr, float x, float b) {
    const float r = ex2_ftz((x - gr.m) * kHalfLog2e);  // normal down to 2^-126: r² reaches every subnormal
    return fmaf(r, r * gr.a, b);
}

template <typename T>
__device__ __forceinline__ uint4 grad_vector(const LeanGrad& gr, const uint4& raw, int c) {
    constexpr int kV = kVec16<T>;
    float f[kV], out[kV];
    to_floats<T>(raw, f);
#pragma unroll
    for (int i = 0; i < kV; ++i) out[i] = grad_element(gr, f[i], gr.b);
    if ((unsigned)(gr.t - c) < (unsigned)kV) {  // the target's column, in the thread that holds it: again
#pragma unroll
        for (int i = 0; i < kV; ++i)
            if (c + i == gr.t) out[i] = grad_element(gr, f[i], gr.bt);
    }
    return pack<T>(out);
}

// kThreadsPerRow threads of each of kCluster CTAs hold a row, kHeld vectors each (vector k of thread t
// of the CTA of rank q: (q · kHeld + k) · kThreadsPerRow + t); kRows rows per CTA when kCluster is 1.
template <typename T, int kThreadsPerRow, int kHeld, int kRows, int kCluster>
__global__ void __launch_bounds__(kThreadsPerRow * kRows) cross_entropy_lean_rows(CrossEntropyParams p) {
    static_assert(kCluster == 1 || kRows == 1, "a cluster shares one row");
    constexpr int kV = kVec16<T>;
    constexpr int kWarpsPerRow = kThreadsPerRow / 32;
    __shared__ RowStats warp_vals[kRows][kWarpsPerRow];
    __shared__ RowStats cta_vals[kCluster];  // slot q: the statistics of the cluster's CTA of rank q
    if constexpr (kCluster > 1) cluster_arrive_relaxed();
    const int t = threadIdx.x % kThreadsPerRow, r = threadIdx.x / kThreadsPerRow;
    const int rank = kCluster > 1 ? (int)(blockIdx.x % kCluster) : 0;  // a cluster: kCluster consecutive CTAs
    const int64_t row = kCluster > 1 ? (int64_t)(blockIdx.x / kCluster) : (int64_t)blockIdx.x * kRows + r;
    const int first = rank * kHeld * kThreadsPerRow;  // the CTA's first vector of the row
    const bool live = row < p.rows;  // the last CTA's extra rows still reach the barriers
    const int cols = (int)p.cols;
    const T* x = static_cast<const T*>(p.logits) + (live ? row : 0) * p.logits_stride;

    uint4 held[kHeld];
    const uint4 none = load_held<T>(x, cols, cols);  // a vector of −inf
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {  // every load in flight before the first is used
        const int c = (first + k * kThreadsPerRow + t) * kV;
        held[k] = live ? load_held<T>(x, c, cols) : none;
    }
    // Loaded after the row is asked for: the row's loads do not wait for these.
    const int tcol = live ? target_column(read_target(p, row)) : kIgnored;  // one register across the merge
    const float g_in = live && p.dloss ? p.dloss[row * p.dloss_stride] : 1.0f;

    RowStats st = held_stats<T, kHeld, kThreadsPerRow>(held, first, t, cols, tcol);
    if (p.label_smoothing != 0.0f) st.sx = held_plain_sum<T, kHeld, kThreadsPerRow>(held, first, t, cols);
#pragma unroll
    for (int k = 0; k < kHeld; ++k) keep_packed(held[k]);
    st = warp_merge(st);
    if constexpr (kWarpsPerRow > 1) {
        if (t % 32 == 0) warp_vals[r][t / 32] = st;
        __syncthreads();
        st = warp_vals[r][0];
#pragma unroll
        for (int w = 1; w < kWarpsPerRow; ++w) st = merge(st, warp_vals[r][w]);  // the same order everywhere
    }
    if constexpr (kCluster > 1) {
        cg::cluster_group cluster = cg::this_cluster();
        cluster_wait();  // every CTA of the cluster has started
        if (threadIdx.x < kCluster) *cluster.map_shared_rank(&cta_vals[rank], (int)threadIdx.x) = st;
        cluster.sync();  // release and acquire: all kCluster records are in every CTA's cta_vals
        st = cta_vals[0];
#pragma unroll
        for (int q = 1; q < kCluster; ++q) st = merge(st, cta_vals[q]);  // rank order, in every CTA
    }
    if (!live) return;
    const Target tg = target_of(tcol);
    if (rank == 0 && t == 0) write_loss(p, row, st, tg);
    if (!p.dlogits) return;
    T* dl = static_cast<T*>(p.dlogits) + row * p.dlogits_stride;
    if (tg.ignored) {  // loss 0, gradient exactly 0, whatever the logits hold
#pragma unroll
        for (int k = 0; k < kHeld; ++k) {
            const int c = (first + k * kThreadsPerRow + t) * kV;
            if (c >= cols) break;
            store_part<T>(dl, c, cols, make_uint4(0, 0, 0, 0));
        }
        return;
    }
    const LeanGrad gr = lean_grad(p, g_in, st, tg);
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
        const int c = (first + k * kThreadsPerRow + t) * kV;
        if (c >= cols) break;
        store_part<T>(dl, c, cols, grad_vector<T>(gr, held[k], c));
    }
}

namespace {

template <int kThreadsPerRow_, int kHeld_, int kCluster_ = 1>
struct Config {
    static constexpr int kThreadsPerRow = kThreadsPerRow_, kHeld = kHeld_, kCluster = kCluster_;
    static constexpr int kRows = kThreadsPerRow_ >= kMinCtaThreads ? 1 : kMinCtaThreads / kThreadsPerRow_;
};

// f(Config<...>{}) for the smallest configuration that holds a row of `cols` elements of T;
// f(nullptr) when none does (stage 04's table).
template <typename T, typename F>
int with_config(int64_t cols, F&& f) {
    constexpr int kV = kVec16<T>, kN = kVectorsPerThread;
    if (cols <= 32 * 1 * kV) return f(Config<32, 1>{});
    if (cols <= 32 * 2 * kV) return f(Config<32, 2>{});
    if (cols <= 32 * 4 * kV) return f(Config<32, 4>{});
    if (cols <= 32 * kN * kV) return f(Config<32, kN>{});
    if (cols <= 64 * kN * kV) return f(Config<64, kN>{});
    if (cols <= 128 * kN * kV) return f(Config<128, kN>{});
    constexpr int64_t kCta = kMaxCtaThreads * kN * kV;  // what one CTA of a cluster holds
    if (cols <= kCta) return f(Config<kMaxCtaThreads, kN>{});
    if (cols <= 2 * kCta) return f(Config<kMaxCtaThreads, kN, 2>{});
    if (cols <= 4 * kCta) return f(Config<kMaxCtaThreads, kN, 4>{});
    if (cols <= kMaxCluster * kCta) return f(Config<kMaxCtaThreads, kN, kMaxCluster>{});
    if (cols <= (int64_t)kMaxCluster * kLongCtaThreads * kN * kV) return f(Config<kLongCtaThreads, kN, kMaxCluster>{});
    return f(nullptr);
}

template <typename T, typename C>
constexpr auto kLeanKernel = cross_entropy_lean_rows<T, C::kThreadsPerRow, C::kHeld, C::kRows, C::kCluster>;

// A cluster launch: kCluster consecutive CTAs of the grid form a cluster, a row each cluster.
template <typename T, typename C>
cudaError_t launch_cluster(const CrossEntropyParams& p, cudaStream_t stream) {
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
    return cudaLaunchKernelEx(&config, kLeanKernel<T, C>, p);
}

template <typename T>
int launch_typed(const CrossEntropyParams& p, cudaStream_t stream, char* err, int errlen) {
    const bool aligned = ce_rows_aligned<T>(p);
    cudaError_t launched = cudaSuccess;
    with_config<T>(p.cols, [&](auto config) {
        using C = decltype(config);
        if constexpr (std::is_same_v<C, std::nullptr_t>) {
            launch_online_any<T>(p, stream);
        } else if (!aligned) {
            launch_online<T, 1>(p, stream);
        } else if constexpr (C::kCluster > 1) {
            launched = launch_cluster<T, C>(p, stream);
        } else {
            const unsigned ctas = (unsigned)((p.rows + C::kRows - 1) / C::kRows);
            kLeanKernel<T, C><<<ctas, C::kThreadsPerRow * C::kRows, 0, stream>>>(p);
        }
        return 0;
    });
    RMS_CHECK(launched, err, errlen);
    RMS_CHECK(cudaGetLastError(), err, errlen);
    return 0;
}

}  // namespace

HOPATTN_EXPORT int hopattn_cross_entropy_launch(const CrossEntropyParams* p, cudaStream_t stream, char* err, int errlen) {
    if (cross_entropy_check_params(p, err, errlen)) return 1;
    if (p->rows == 0) return 0;
    return rms_dispatch(p->dtype, [&](auto t) { return launch_typed<decltype(t)>(*p, stream, err, errlen); });
}

HOPATTN_EXPORT int hopattn_cross_entropy_describe(const CrossEntropyParams* p, RmsKernelInfo* info, char* err,
                                                  int errlen) {
    if (cross_entropy_check_params(p, err, errlen)) return 1;
    return rms_dispatch(p->dtype, [&](auto t) {
        using T = decltype(t);
        const bool aligned = ce_rows_aligned<T>(*p);
        return with_config<T>(p->cols, [&](auto config) -> int {
            using C = decltype(config);
            if constexpr (std::is_same_v<C, std::nullptr_t>) {
                return describe_online_any<T>(*p, info, err, errlen);
            } else {
                if (!aligned) return describe_online<T, 1>(*p, info, err, errlen);
                snprintf(info->variant, sizeof(info->variant),
                         "lean row in registers<%s, %d threads/row, %d vectors, cluster %d>", kDtypeName<T>,
                         C::kThreadsPerRow, C::kHeld, C::kCluster);
                info->threads = C::kThreadsPerRow * C::kRows;
                info->rows_per_cta = C::kRows;
                info->threads_per_row = C::kThreadsPerRow;
                info->cluster = C::kCluster;
                info->vector_bytes = 16;
                info->elements_per_thread = C::kHeld * kVec16<T>;
                info->dynamic_smem = 0;
                return cross_entropy_describe_kernel(kLeanKernel<T, C>, info, err, errlen);
            }
        });
    });
}
