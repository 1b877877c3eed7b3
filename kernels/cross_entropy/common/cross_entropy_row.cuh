// What every cross-entropy stage computes of a row, whatever holds it (abi_cross_entropy.h has the
// formulas): the row's statistics and their merge, the target, and the loss, lse and gradient from
// them. The stages differ in how the row reaches these functions, never in what they compute.
#pragma once

#include "abi_cross_entropy.h"

#if __has_include("../../rmsnorm/common/elements.cuh")
#include "../../rmsnorm/common/elements.cuh"
#else
#include "../../../kernels/rmsnorm/common/elements.cuh"
#endif

constexpr float kLog2e = 1.4426950408889634f;

// A running max m, the sum s of exp(x − m), the plain sum sx of x (label smoothing's term) and the
// target's logit xt (contributed by one thread of the row, 0 from every other) of the elements seen.
struct RowStats {
    float m, s, sx, xt;
};

__device__ __forceinline__ RowStats empty_stats() { return {-INFINITY, 0.0f, 0.0f, 0.0f}; }

// s brought from max m to max to (>= m); a max of −inf has no elements behind it: nothing to scale.
__device__ __forceinline__ float rescale(float s, float m, float to) {
    return m == to ? s : s * exp2f((m - to) * kLog2e);
}

__device__ __forceinline__ RowStats merge(RowStats a, RowStats b) {
    const float m = fmaxf(a.m, b.m);
    return {m, rescale(a.s, a.m, m) + rescale(b.s, b.m, m), a.sx + b.sx, a.xt + b.xt};
}

// kVec more elements into the statistics: one rescale a vector, one exponential and two adds an element.
template <int kVec>
__device__ __forceinline__ RowStats add_elements(RowStats a, const float (&v)[kVec]) {
    float m = a.m, sx = a.sx;
#pragma unroll
    for (int i = 0; i < kVec; ++i) m = fmaxf(m, v[i]);
    float s = rescale(a.s, a.m, m);
    const float base = m == -INFINITY ? 0.0f : m;  // all −inf so far: exp(−inf − 0) = 0, not exp(NaN)
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
        s += exp2f((v[i] - base) * kLog2e);
        sx += v[i];
    }
    return {m, s, sx, a.xt};
}

// As add_elements, for elements of which those at index >= valid are past the row's end (no part of
// any statistic): the tails of vectorized rows.
template <int kVec>
__device__ __forceinline__ RowStats add_elements_masked(RowStats a, float (&v)[kVec], int valid) {
    float sxv = 0.0f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
        if (i < valid) sxv += v[i];
        else v[i] = -INFINITY;
    }
    float m = a.m;
#pragma unroll
    for (int i = 0; i < kVec; ++i) m = fmaxf(m, v[i]);
    float s = rescale(a.s, a.m, m);
    const float base = m == -INFINITY ? 0.0f : m;
#pragma unroll
    for (int i = 0; i < kVec; ++i) s += exp2f((v[i] - base) * kLog2e);
    return {m, s, a.sx + sxv, a.xt};
}

__device__ __forceinline__ RowStats shfl_stats(RowStats v, int offset) {
    return {__shfl_xor_sync(0xffffffffu, v.m, offset), __shfl_xor_sync(0xffffffffu, v.s, offset),
            __shfl_xor_sync(0xffffffffu, v.sx, offset), __shfl_xor_sync(0xffffffffu, v.xt, offset)};
}

__device__ __forceinline__ RowStats warp_merge(RowStats v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v = merge(v, shfl_stats(v, offset));
    return v;  // every lane holds the same statistics (merge is symmetric bit for bit)
}

// The row's target: its class, whether the row is ignored, whether the class is outside [0, V).
struct Target {
    int t;         // the class, valid only when ok
    bool ignored;  // t == ignore_index: loss 0, gradient 0
    bool ok;       // 0 <= t < V and not ignored: x[r, t] is read
};

__device__ __forceinline__ Target read_target(const CrossEntropyParams& p, int64_t row) {
    const int64_t t = p.targets[row];
    if (t == p.ignore_index) return {0, true, false};
    if (t < 0 || t >= p.cols) return {0, false, false};
    return {(int)t, false, true};
}

// The target's logit, as the row's thread 0 contributes it (every other thread: 0).
template <typename T>
__device__ __forceinline__ float target_logit(const T* x, Target tg, bool first_thread) {
    return first_thread && tg.ok ? to_float(x[tg.t]) : 0.0f;
}

// loss and lse of a row from its merged statistics, written by one thread.
__device__ __forceinline__ void write_loss(const CrossEntropyParams& p, int64_t row, RowStats st, Target tg) {
    const float log_s = logf(st.s);
    const float lse = st.m + log_s;
    float loss;
    if (tg.ignored) loss = 0.0f;
    else if (!tg.ok) loss = NAN;
    else {
        const float eps = p.label_smoothing;
        loss = log_s + (1.0f - eps) * (st.m - st.xt);
        if (eps != 0.0f) loss += eps * (st.m - st.sx / (float)p.cols);
    }
    p.loss[row] = loss;
    if (p.lse) p.lse[row] = lse;
}

// The gradient of a row, element by element: dl(x, c) = g · (exp(x − m) / s − on · [c = t] − uni).
struct GradRow {
    float m, inv, g, on, uni;
    int t;      // −1: no element is the target (ignored or out-of-range rows)
    bool zero;  // an ignored row: exactly 0

    __device__ __forceinline__ float operator()(float x, int c) const {
        if (zero) return 0.0f;
        const float prob = exp2f((x - m) * kLog2e) * inv;
        return g * (prob - (c == t ? on : 0.0f) - uni);
    }
};

__device__ __forceinline__ GradRow grad_row(const CrossEntropyParams& p, int64_t row, RowStats st, Target tg) {
    GradRow gr;
    gr.m = st.m;
    gr.inv = 1.0f / st.s;
    const float eps = p.label_smoothing;
    gr.on = 1.0f - eps;
    gr.uni = eps / (float)p.cols;
    gr.t = tg.ok ? tg.t : -1;
    gr.zero = tg.ignored;
    const float g = p.dloss ? p.dloss[row * p.dloss_stride] : 1.0f;
    gr.g = tg.ok ? p.grad_scale * g : NAN;  // out of range: the row's gradient is NaN, as its loss
    return gr;
}

// The vector of T at column c of a row of `cols` elements: 16 bytes at once where the whole vector is
// inside the row, element by element at the row's end, zeros past it (the held stages' loads).
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
// for the gradient, instead of keeping the unpacked fp32 values (twice the registers) across the merge.
__device__ __forceinline__ void keep_packed(uint4& v) {
    asm volatile("" : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w));
}

// A held vector (columns c … c + kV − 1 of a row of `cols`) into the statistics.
template <typename T>
__device__ __forceinline__ RowStats add_held(RowStats st, const uint4& raw, int c, int cols) {
    constexpr int kV = kVec16<T>;
    float f[kV];
    unpack<T>(raw, f);
    if (c + kV <= cols) return add_elements<kV>(st, f);
    return add_elements_masked<kV>(st, f, cols - c);
}

// The gradient of a held vector, packed for its store.
template <typename T>
__device__ __forceinline__ uint4 grad_held(const GradRow& grad, const uint4& raw, int c) {
    constexpr int kV = kVec16<T>;
    float f[kV];
    unpack<T>(raw, f);
#pragma unroll
    for (int i = 0; i < kV; ++i) f[i] = grad(f[i], c + i);
    return pack<T>(f);
}
