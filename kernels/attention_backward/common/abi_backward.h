// The contract between every backward stage and the Python binding (kernels/hopattn/native.cpp).
//
// A backward stage is compiled into its own shared library, as a forward stage is, and exports:
//   hopattn_backward_launch  runs the backward pass on a stream, returns 0 or writes an error message;
//   hopattn_describe         what its main kernel needs (threads, shared memory, registers, tile).
// The forward's abi.h (KernelInfo, HOPATTN_CHECK, describe_kernel) is shared.
#pragma once

#include "../../attention/common/abi.h"

#define HOPATTN_BACKWARD_ABI_VERSION 1

// Gradients of O = softmax(scale · Q Kᵀ) V for the upstream gradient dO. Every tensor is bf16
// [batch, heads, rows, head_dim] (k, v, dk, dv with kv_heads heads) addressed through its
// (batch, head, row) strides in elements; the head_dim axis is contiguous.
struct AttnBwdParams {
    const void* q;
    const void* k;
    const void* v;
    const void* o;      // the forward's output
    const void* dout;   // the gradient of the loss with respect to o
    const float* lse;   // fp32 [batch, heads, len_q], contiguous: the forward's natural log-sum-exp
    const float* dlse;  // null, or fp32 [batch, heads, len_q], contiguous: the gradient with respect to lse
                        // (when the caller used it): it enters as dS = P ∘ (dP − D + dlse)
    void* dq;
    void* dk;
    void* dv;
    int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3], dout_stride[3];
    int64_t dq_stride[3], dk_stride[3], dv_stride[3];
    int batch, heads, kv_heads, len_q, len_k, head_dim;
    float scale;
    int causal;         // 0 or 1 (bottom-right aligned, as the forward)
    int deterministic;  // 1: no atomics; every gradient is summed in a fixed order
    int num_sms;
    // Workspace the caller allocates (sizes from each stage's hopattn_backward_workspace; see below):
    float* row_stats;   // [2, batch, heads, padded len_q]: D = rowsum(dO ∘ O), and lse in log2 units (+ 05's ints)
    float* dq_accum;    // [batch, heads, padded len_q, head_dim] fp32 (stages 01-04: the atomic path, may be
                        // null when deterministic; from stage 05 on needed in both modes)
};

// The workspace by stage (this header is shared by backward stages 01-06; the sizes are each stage's
// hopattn_backward_workspace, which the binding asks for before every launch):
//   - stages 01-04: row_stats is the two float arrays above; dq_accum is 0 floats (may be null) in the
//     deterministic mode, where a second pass sums dQ in key order without atomics.
//   - from stage 05 on: row_stats ends, after its two float arrays, with the deterministic mode's ints,
//     allocated in both modes: the turn counters, [batch, heads, padded len_q / 64, 2] (one per query
//     block and dQ half, one per consumer warpgroup), then the key-block tickets, [batch, kv_heads]. The
//     preprocess kernel writes both on every launch (each counter to the query block's last key block,
//     the tickets to 0), so the caller need not clear them; the counters count down (red.release.gpu.add
//     -1) and a CTA takes key block gridDim.x - 1 - ticket. dq_accum is needed in both modes (the launch
//     refuses a null one): the deterministic mode adds into it too, its query blocks' turns in order.
