// Cross-entropy, stage 03: the row held in registers, read once; the gradient written from them.
//
//   loss[r] = log s + (1 − ε)(m − x[r, t]) + ε (m − Σ x / V),  m = max_c x,  s = Σ_c exp(x − m)
//   dlogits[r, c] = g · (exp(x − m) / s − (1 − ε)[c = t] − ε / V)           (when dlogits is given)
//
// Stage 02 reads a row once for the loss but twice when it also writes the gradient. Here each thread
// loads its share of the row, kVectorsPerThread 16-byte vectors at most, into registers (packed: four
// registers a vector whatever the type), every load in flight before the first is used, and thread 0
// the target's logit beside them; computes its statistics from them, merges them with the row's
// (shuffles, then shared memory), writes loss and lse, and the gradient from the same registers. The
// fused forward is then a read and a write of every element: a copy's traffic.
//
// A row gets the fewest threads that hold it (softmax stage 03's configurations): a warp with 1, 2,
// 4 or 8 vectors a thread up to 256, 512, 1024, 2048 bf16 columns (half in fp32), then 64 …
// kMaxThreadsPerRow = 512 threads of 8 vectors, up to 32k bf16 or fp16 columns and 16k fp32 (a
// 1024-thread CTA, 64 registers a thread at most, spilled 84 bytes: the gradient's constants and the
// target take the registers softmax stage 03's 1024-thread CTA had to spare). Rows that need
// fewer than kMinCtaThreads threads are packed several to a CTA; the last CTA's rows past the end
// load nothing and still reach the barrier. Longer rows, and rows not aligned to 16 bytes, run stage
// 02's kernels (included below, unchanged).
#define CE_KERNELS_ONLY
#include "../02_online-one-pass/kernel.cu"

#include <type_traits>

constexpr int kVectorsPerThread = 8;   // 16-byte vectors a thread holds (32 registers)
constexpr int kMaxThreadsPerRow = 512;   // the most threads a row gets (1024 would spill: see below)
constexpr int kMinCtaThreads = 256;    // short rows are packed kMinCtaThreads / threads_per_row to a CTA

// kThreadsPerRow threads hold a row, kHeld vectors each (vector k of thread t: k · kThreadsPerRow + t,
// so each of the kHeld loads of a warp is 512 contiguous bytes); kRows rows per CTA.
template <typename T, int kThreadsPerRow, int kHeld, int kRows>
__global__ void __launch_bounds__(kThreadsPerRow * kRows) cross_entropy_rows(CrossEntropyParams p) {
    constexpr int kV = kVec16<T>;
    constexpr int kWarpsPerRow = kThreadsPerRow / 32;
    __shared__ RowStats warp_vals[kRows][kWarpsPerRow];
    const int t = threadIdx.x % kThreadsPerRow, r = threadIdx.x / kThreadsPerRow;
    const int64_t row = (int64_t)blockIdx.x * kRows + r;
    const bool live = row < p.rows;  // the last CTA's extra rows still reach the barrier
    const int cols = (int)p.cols;
    const T* x = static_cast<const T*>(p.logits) + (live ? row : 0) * p.logits_stride;
    const Target tg = live ? read_target(p, row) : Target{0, true, false};

    uint4 held[kHeld];
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {  // every load in flight before the first is used
        const int c = (k * kThreadsPerRow + t) * kV;
        held[k] = live ? load_part<T>(x, c, cols) : make_uint4(0, 0, 0, 0);
    }
    RowStats st = empty_stats();
    st.xt = target_logit(x, tg, t == 0);
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
        const int c = (k * kThreadsPerRow + t) * kV;
        if (!live || c >= cols) break;  // vectors past the row's end: those of every later k are too
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
    if (!live) return;
    if (t == 0) write_loss(p, row, st, tg);
    if (!p.dlogits) return;
    const GradRow grad = grad_row(p, row, st, tg);
    T* dl = static_cast<T*>(p.dlogits) + row * p.dlogits_stride;
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
        const int c = (k * kThreadsPerRow + t) * kV;
        if (c >= cols) break;
        store_part<T>(dl, c, cols, grad_held<T>(grad, held[k], c));
    }
}

namespace {

template <int kThreadsPerRow_, int kHeld_>
struct Config {
    static constexpr int kThreadsPerRow = kThreadsPerRow_, kHeld = kHeld_;
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
    if (cols <= kMaxThreadsPerRow * kN * kV) return f(Config<kMaxThreadsPerRow, kN>{});
    return f(nullptr);
}

template <typename T>
int launch_typed(const CrossEntropyParams& p, cudaStream_t stream, char* err, int errlen) {
    const bool aligned = ce_rows_aligned<T>(p);
    with_config<T>(p.cols, [&](auto config) {
        using C = decltype(config);
        if constexpr (std::is_same_v<C, std::nullptr_t>) {
            launch_online_any<T>(p, stream);
        } else if (!aligned) {
            launch_online<T, 1>(p, stream);
        } else {
            const unsigned ctas = (unsigned)((p.rows + C::kRows - 1) / C::kRows);
            cross_entropy_rows<T, C::kThreadsPerRow, C::kHeld, C::kRows><<<ctas, C::kThreadsPerRow * C::kRows, 0, stream>>>(p);
        }
        return 0;
    });
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
                snprintf(info->variant, sizeof(info->variant), "row in registers<%s, %d threads/row, %d vectors>",
                         kDtypeName<T>, C::kThreadsPerRow, C::kHeld);
                info->threads = C::kThreadsPerRow * C::kRows;
                info->rows_per_cta = C::kRows;
                info->threads_per_row = C::kThreadsPerRow;
                info->cluster = 1;
                info->vector_bytes = 16;
                info->elements_per_thread = C::kHeld * kVec16<T>;
                info->dynamic_smem = 0;
                return cross_entropy_describe_kernel(cross_entropy_rows<T, C::kThreadsPerRow, C::kHeld, C::kRows>,
                                                     info, err, errlen);
            }
        });
    });
}
