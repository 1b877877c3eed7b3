// Cross-entropy, stage 02: the online (max, sum) in one pass over the row, 16-byte loads.
//
//   loss[r] = log s + (1 − ε)(m − x[r, t]) + ε (m − Σ x / V),  m = max_c x,  s = Σ_c exp(x − m)
//   dlogits[r, c] = g · (exp(x − m) / s − (1 − ε)[c = t] − ε / V)           (when dlogits is given)
//
// Stage 01 walks a row for its max, then again for the sum. Here one walk gathers the max and the sum
// together (the online softmax: a vector's max first, the running sum rescaled by exp(m_old − m_new)
// when the max grows, one exponential an element), the plain sum and the target's logit beside them;
// the threads' statistics merge in one reduction. The forward alone is then one read of the row; the
// gradient, when asked for, a second walk (from L2 for the shorter rows). Loads are 16 bytes
// (kUnroll vectors of a thread in flight a step), rows up to kWarpMaxCols a warp each (kRowsPerCta a
// CTA), longer ones a CTA of kCtaThreads. Rows or dlogits not aligned to 16 bytes, and the row's tail
// past its last whole vector, are read one element at a time.
//
// Stages 03 and 04 include this file with CE_KERNELS_ONLY defined: these kernels are their path for
// the rows they cannot hold or vectorize.
#include "../common/cross_entropy_row.cuh"

constexpr int kThreads = 256;               // threads per CTA of the warp-per-row kernel
constexpr int kRowsPerCta = kThreads / 32;  // a row per warp
constexpr int kWarpMaxCols = 1024;          // longer rows go to a CTA each
constexpr int kCtaThreads = 512;            // threads per CTA of the CTA-per-row kernel
constexpr int kUnroll = 4;                  // vectors a thread has in flight per loop step

// The statistics merged over the kWarps warps of a row (shuffles, then shared memory), the same in
// every thread.
template <int kWarps>
__device__ __forceinline__ RowStats row_merge(RowStats v, RowStats* warp_vals) {
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
    cross_entropy_online(CrossEntropyParams p) {
    constexpr int kRows = kThreadsPerRow == 32 ? kRowsPerCta : 1;
    constexpr int kWarps = kThreadsPerRow / 32;
    __shared__ RowStats warp_vals[kWarps];
    const int t = threadIdx.x % kThreadsPerRow;
    const int64_t row = (int64_t)blockIdx.x * kRows + threadIdx.x / kThreadsPerRow;
    if (row >= p.rows) return;  // only in the warp-per-row kernel (a CTA's row always exists): no barrier there
    const T* x = static_cast<const T*>(p.logits) + row * p.logits_stride;
    const int cols = (int)p.cols;
    const int body = cols / kVec * kVec;  // the vector part; the tail element by element
    const Target tg = read_target(p, row);

    RowStats st = empty_stats();  // 1. max, sum, plain sum, together
    st.xt = target_logit(x, tg, t == 0);
#pragma unroll kUnroll
    for (int c = t * kVec; c < body; c += kThreadsPerRow * kVec) {
        float v[kVec];
        load_floats<T, kVec>(x + c, v);
        st = add_elements<kVec>(st, v);
    }
    for (int c = body + t; c < cols; c += kThreadsPerRow) {
        const float v[1] = {to_float(x[c])};
        st = add_elements<1>(st, v);
    }
    st = row_merge<kWarps>(st, warp_vals);  // x[r, t] consumed: in place, no write comes before
    if (t == 0) write_loss(p, row, st, tg);
    if (!p.dlogits) return;

    const GradRow grad = grad_row(p, row, st, tg);  // 2. the gradient, the row read again
    T* dl = static_cast<T*>(p.dlogits) + row * p.dlogits_stride;
#pragma unroll kUnroll
    for (int c = t * kVec; c < body; c += kThreadsPerRow * kVec) {
        float v[kVec];
        load_floats<T, kVec>(x + c, v);
#pragma unroll
        for (int i = 0; i < kVec; ++i) v[i] = grad(v[i], c + i);
        store_floats<T, kVec>(dl + c, v);
    }
    for (int c = body + t; c < cols; c += kThreadsPerRow) dl[c] = from_float<T>(grad(to_float(x[c]), c));
}

// Whether the 16-byte kernels may run: logits (and dlogits, when given) and their row strides aligned.
template <typename T>
bool ce_rows_aligned(const CrossEntropyParams& p) {
    auto ok = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
    return ok(p.logits) && (p.logits_stride * (int64_t)sizeof(T)) % 16 == 0 &&
           (!p.dlogits || (ok(p.dlogits) && (p.dlogits_stride * (int64_t)sizeof(T)) % 16 == 0));
}

template <typename T, int kVec>
void launch_online(const CrossEntropyParams& p, cudaStream_t stream) {
    if (p.cols <= kWarpMaxCols)
        cross_entropy_online<T, kVec, 32><<<(unsigned)((p.rows + kRowsPerCta - 1) / kRowsPerCta), kThreads, 0, stream>>>(p);
    else
        cross_entropy_online<T, kVec, kCtaThreads><<<(unsigned)p.rows, kCtaThreads, 0, stream>>>(p);
}

template <typename T>
void launch_online_any(const CrossEntropyParams& p, cudaStream_t stream) {
    if (ce_rows_aligned<T>(p)) launch_online<T, kVec16<T>>(p, stream);
    else launch_online<T, 1>(p, stream);
}

template <typename T, int kVec>
int describe_online(const CrossEntropyParams& p, RmsKernelInfo* info, char* err, int errlen) {
    const bool warp = p.cols <= kWarpMaxCols;
    snprintf(info->variant, sizeof(info->variant), "%s per row, online, one pass<%s, %d-byte accesses>",
             warp ? "warp" : "CTA", kDtypeName<T>, kVec * (int)sizeof(T));
    info->threads = warp ? kThreads : kCtaThreads;
    info->rows_per_cta = warp ? kRowsPerCta : 1;
    info->threads_per_row = warp ? 32 : kCtaThreads;
    info->cluster = 1;
    info->vector_bytes = kVec * (int)sizeof(T);
    info->elements_per_thread = 0;
    info->dynamic_smem = 0;
    return warp ? cross_entropy_describe_kernel(cross_entropy_online<T, kVec, 32>, info, err, errlen)
                : cross_entropy_describe_kernel(cross_entropy_online<T, kVec, kCtaThreads>, info, err, errlen);
}

template <typename T>
int describe_online_any(const CrossEntropyParams& p, RmsKernelInfo* info, char* err, int errlen) {
    return ce_rows_aligned<T>(p) ? describe_online<T, kVec16<T>>(p, info, err, errlen)
                                 : describe_online<T, 1>(p, info, err, errlen);
}

#ifndef CE_KERNELS_ONLY

HOPATTN_EXPORT int hopattn_cross_entropy_launch(const CrossEntropyParams* p, cudaStream_t stream, char* err, int errlen) {
    if (cross_entropy_check_params(p, err, errlen)) return 1;
    if (p->rows == 0) return 0;
    return rms_dispatch(p->dtype, [&](auto t) {
        launch_online_any<decltype(t)>(*p, stream);
        RMS_CHECK(cudaGetLastError(), err, errlen);
        return 0;
    });
}

HOPATTN_EXPORT int hopattn_cross_entropy_describe(const CrossEntropyParams* p, RmsKernelInfo* info, char* err,
                                                  int errlen) {
    if (cross_entropy_check_params(p, err, errlen)) return 1;
    return rms_dispatch(p->dtype, [&](auto t) { return describe_online_any<decltype(t)>(*p, info, err, errlen); });
}

#endif  // CE_KERNELS_ONLY
