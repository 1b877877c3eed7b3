// Cross-entropy, stage 01: a row per CTA, three passes over it.
//
//   loss[r] = log s + (1 − ε)(m − x[r, t]) + ε (m − Σ x / V),  m = max_c x,  s = Σ_c exp(x − m)
//   dlogits[r, c] = g · (exp(x − m) / s − (1 − ε)[c = t] − ε / V)           (when dlogits is given)
//
// The textbook order: pass 1 the row's max; pass 2 the sum of exp(x − m), the plain sum of x (label
// smoothing's term) and the target's logit (one load by thread 0); pass 3, only when the gradient is
// asked for, the gradient. A CTA of kThreads threads per row whatever its length, thread j reading
// elements j, j + kThreads, … one at a time (coalesced, 2 or 4 bytes an access). Each pass ends in a
// CTA reduction (shuffles, then shared memory). The correct baseline the later stages are checked
// against; nothing is vectorized and nothing is held.
#include "../common/cross_entropy_row.cuh"

constexpr int kThreads = 512;  // threads per CTA, a row each
constexpr int kWarps = kThreads / 32;

// The max over the CTA, the same in every thread.
__device__ __forceinline__ float cta_max(float v, float* scratch) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    v = scratch[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v = fmaxf(v, scratch[w]);
    return v;
}

// The statistics over the CTA (their sums; the max is already the row's), the same in every thread.
__device__ __forceinline__ RowStats cta_merge(RowStats v, RowStats* scratch) {
    v = warp_merge(v);
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    v = scratch[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v = merge(v, scratch[w]);  // the same order in every thread
    return v;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) cross_entropy_three_passes(CrossEntropyParams p) {
    __shared__ float max_scratch[kWarps];
    __shared__ RowStats scratch[kWarps];
    const int64_t row = blockIdx.x;
    const int cols = (int)p.cols;
    const T* x = static_cast<const T*>(p.logits) + row * p.logits_stride;
    const Target tg = read_target(p, row);

    float m = -INFINITY;  // 1. the max
    for (int c = threadIdx.x; c < cols; c += kThreads) m = fmaxf(m, to_float(x[c]));
    m = cta_max(m, max_scratch);

    // 2. the sum of exp(x − m) (m is the row's: no rescaling), the sum of x, the target's logit
    const float base = m == -INFINITY ? 0.0f : m;
    RowStats st = {m, 0.0f, 0.0f, target_logit(x, tg, threadIdx.x == 0)};
    for (int c = threadIdx.x; c < cols; c += kThreads) {
        const float v = to_float(x[c]);
        st.s += exp2f((v - base) * kLog2e);
        st.sx += v;
    }
    st = cta_merge(st, scratch);  // every x[r, t] read is consumed here: in place, no write comes before
    if (threadIdx.x == 0) write_loss(p, row, st, tg);
    if (!p.dlogits) return;

    const GradRow grad = grad_row(p, row, st, tg);  // 3. the gradient, the row read a third time
    T* dl = static_cast<T*>(p.dlogits) + row * p.dlogits_stride;
    for (int c = threadIdx.x; c < cols; c += kThreads) dl[c] = from_float<T>(grad(to_float(x[c]), c));
}

namespace {

template <typename T>
int launch_typed(const CrossEntropyParams& p, cudaStream_t stream, char* err, int errlen) {
    cross_entropy_three_passes<T><<<(unsigned)p.rows, kThreads, 0, stream>>>(p);
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
        snprintf(info->variant, sizeof(info->variant), "CTA per row, three passes<%s>", kDtypeName<T>);
        info->threads = kThreads;
        info->rows_per_cta = 1;
        info->threads_per_row = kThreads;
        info->cluster = 1;
        info->vector_bytes = (int)sizeof(T);
        info->elements_per_thread = 0;
        info->dynamic_smem = 0;
        return cross_entropy_describe_kernel(cross_entropy_three_passes<T>, info, err, errlen);
    });
}
