// Cross-entropy, stage 04: a cluster of CTAs holds a long row, their statistics merged through
// distributed shared memory.
//
//   loss[r] = log s + (1 − ε)(m − x[r, t]) + ε (m − Σ x / V),  m = max_c x,  s = Σ_c exp(x − m)
//   dlogits[r, c] = g · (exp(x − m) / s − (1 − ε)[c = t] − ε / V)           (when dlogits is given)
//
// Stage 03 holds a row in one CTA, up to 512 threads of 8 vectors (32k bf16 columns), one such CTA an
// SM (90 registers a thread): between one CTA's last store and the next one's first load the SM's
// memory pipe idles, and rows past 32k are read twice (stage 02's kernels). Here no CTA holds more than
// kMaxCtaThreads = 256 threads × 8 vectors (16k bf16 or fp16 columns, 8k fp32: 62 registers, four
// CTAs an SM, one's loads in flight while another reduces or writes), and a longer row is cut into
// kCluster = 2, 4 or 8 consecutive slices, one per CTA of a thread-block cluster, each held in
// registers as stage 03 holds a row (8 CTAs of 512 threads past 128k bf16, up to 256k). Each CTA
// merges its slice's statistics (shuffles, then shared memory); thread q of every CTA writes them
// into slot [rank] of CTA q's shared memory (st.shared::cluster); one cluster barrier (release,
// acquire) makes the kCluster records visible, and every thread merges them in rank order — the same
// statistics in every CTA, every run. A CTA writes into its peers only after all have started (a
// relaxed cluster arrive at the start, its wait just before the first remote store), as softmax stage
// 04 does. The target's logit is loaded by thread 0 of the CTA of rank 0. Rows up to 256k bf16 or
// fp16 columns (128k fp32) are read once; longer rows, and rows not aligned to 16 bytes, run stage
// 02's kernels (included below, unchanged).
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

// kThreadsPerRow threads of each of kCluster CTAs hold a row, kHeld vectors each (vector k of thread t
// of the CTA of rank q: (q · kHeld + k) · kThreadsPerRow + t); kRows rows per CTA when kCluster is 1.
template <typename T, int kThreadsPerRow, int kHeld, int kRows, int kCluster>
__global__ void __launch_bounds__(kThreadsPerRow * kRows) cross_entropy_cluster_rows(CrossEntropyParams p) {
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
    const Target tg = live ? read_target(p, row) : Target{0, true, false};

    uint4 held[kHeld];
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {  // every load in flight before the first is used
        const int c = (first + k * kThreadsPerRow + t) * kV;
        held[k] = live ? load_part<T>(x, c, cols) : make_uint4(0, 0, 0, 0);
    }
    RowStats st = empty_stats();
    st.xt = target_logit(x, tg, rank == 0 && t == 0);
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
        const int c = (first + k * kThreadsPerRow + t) * kV;
        if (!live || c >= cols) break;  // past the row's end: every later k is too
        st = add_held<T>(st, held[k], c, cols);
    }
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
    if (rank == 0 && t == 0) write_loss(p, row, st, tg);
    if (!p.dlogits) return;
    const GradRow grad = grad_row(p, row, st, tg);
    T* dl = static_cast<T*>(p.dlogits) + row * p.dlogits_stride;
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
        const int c = (first + k * kThreadsPerRow + t) * kV;
        if (c >= cols) break;
        store_part<T>(dl, c, cols, grad_held<T>(grad, held[k], c));
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
    constexpr int64_t kCta = kMaxCtaThreads * kN * kV;  // what one CTA of a cluster holds
    if (cols <= kCta) return f(Config<kMaxCtaThreads, kN>{});
    if (cols <= 2 * kCta) return f(Config<kMaxCtaThreads, kN, 2>{});
    if (cols <= 4 * kCta) return f(Config<kMaxCtaThreads, kN, 4>{});
    if (cols <= kMaxCluster * kCta) return f(Config<kMaxCtaThreads, kN, kMaxCluster>{});
    if (cols <= (int64_t)kMaxCluster * kLongCtaThreads * kN * kV) return f(Config<kLongCtaThreads, kN, kMaxCluster>{});
    return f(nullptr);
}

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
    return cudaLaunchKernelEx(&config, cross_entropy_cluster_rows<T, C::kThreadsPerRow, C::kHeld, 1, C::kCluster>, p);
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
            cross_entropy_cluster_rows<T, C::kThreadsPerRow, C::kHeld, C::kRows, 1>
                <<<ctas, C::kThreadsPerRow * C::kRows, 0, stream>>>(p);
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
                         "row in registers<%s, %d threads/row, %d vectors, cluster %d>", kDtypeName<T>,
                         C::kThreadsPerRow, C::kHeld, C::kCluster);
                info->threads = C::kThreadsPerRow * C::kRows;
                info->rows_per_cta = C::kRows;
                info->threads_per_row = C::kThreadsPerRow;
                info->cluster = C::kCluster;
                info->vector_bytes = 16;
                info->elements_per_thread = C::kHeld * kVec16<T>;
                info->dynamic_smem = 0;
                return cross_entropy_describe_kernel(
                    cross_entropy_cluster_rows<T, C::kThreadsPerRow, C::kHeld, C::kRows, C::kCluster>, info, err, errlen);
            }
        });
    });
}
