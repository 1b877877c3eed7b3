// The contract between every cross-entropy stage (kernels/cross_entropy/NN_slug/kernel.cu; drafted in
// research/cross_entropy/NN_slug/) and its Python binding (cross_entropy_native.cpp beside this file).
// The element types, the error macro, the export attribute and the kernel-info record are the RMSNorm
// lineage's (kernels/rmsnorm/common/abi_rmsnorm.h): Part II's rowwise lineages share them.
//
// A stage exports hopattn_cross_entropy_launch and hopattn_cross_entropy_describe; each returns 0, or
// 1 with a message in err.
//
// Per row r of logits x (V = cols classes), with t = targets[r], ε = label_smoothing, all in fp32:
//
//   m[r]    = max_c x[r, c]
//   s[r]    = Σ_c exp(x[r, c] − m[r])
//   lse[r]  = m[r] + log s[r]                                   (written for every row, ignored ones too)
//   loss[r] = (1 − ε) · (lse[r] − x[r, t]) + ε · (lse[r] − Σ_c x[r, c] / V)
//           = log s[r] + (1 − ε) · (m[r] − x[r, t]) + ε · (m[r] − Σ_c x[r, c] / V)   (the form computed)
//   with ε = 0 the last term is left out (not multiplied by 0: a row holding −inf would make it NaN).
//
//   dlogits[r, c] = g[r] · (exp(x[r, c] − m[r]) / s[r] − (1 − ε) · [c = t] − ε / V),
//   g[r] = grad_scale · (dloss ? dloss[r · dloss_stride] : 1), rounded once to the logits' dtype.
//
// Rows with t = ignore_index: loss 0 and dlogits 0 exactly (written, not multiplied by g), lse as any
// row's. torch.nn.functional.cross_entropy(reduction="none", ignore_index, label_smoothing) per row.
// A target outside [0, V) that is not ignore_index: loss NaN and every dlogits of the row NaN (the
// kernel never reads x[r, t] then); the host cannot see targets without a synchronisation, so this is
// the kernel's answer, loud in the loss. A row of −inf only: lse −inf, loss NaN, dlogits NaN (as torch).
//
// The gradient: dlogits null — the forward alone, each element read once (stage 02 on), written never.
// dlogits given — the fused forward that also writes the gradient (QuACK's return_dx, Liger's forward):
// the backward of a mean or sum is then a scale of dlogits by the incoming scalar (nothing when it is
// 1), and of reduction="none" a scale by the incoming row gradient. With dloss given (fp32, one value
// per row, dloss_stride 1, or one for every row, dloss_stride 0) the same launch is the backward
// itself: dlogits = dloss[r] · ∂loss[r]/∂x[r, :], recomputing m and s from x (loss and lse still
// written). dlogits may be logits itself (in place: the same pointer and stride): every stage reads
// all it needs of an element, and of x[r, t], before any thread writes the row.
#pragma once

#if __has_include("../../rmsnorm/common/abi_rmsnorm.h")
#include "../../rmsnorm/common/abi_rmsnorm.h"  // kernels/cross_entropy/common: the landed place
#else
#include "../../../kernels/rmsnorm/common/abi_rmsnorm.h"  // research/cross_entropy/common: the draft's
#endif

#define HOPATTN_CROSS_ENTROPY_ABI_VERSION 1

// The most classes a row may have: every column index a kernel forms, a loop's next step included
// (at most 2^15 past the row's end), stays below 2^31 (int32 arithmetic within a row; rows are
// addressed in int64, row · stride).
#define HOPATTN_CROSS_ENTROPY_MAX_COLS (2147483647LL - 1048576LL + 1LL)

struct CrossEntropyParams {
    const void* logits;      // [rows, cols], row r at logits + r · logits_stride (elements)
    const int64_t* targets;  // [rows], contiguous
    float* loss;             // [rows], contiguous, fp32
    float* lse;              // null, or [rows], contiguous, fp32
    void* dlogits;           // null (no gradient), or [rows, cols] of the logits' dtype, row r at + r · dlogits_stride
    const float* dloss;      // null (g = grad_scale), or fp32, row r's at dloss[r · dloss_stride]
    int64_t rows;            // >= 0
    int64_t cols;            // >= 1 (V, the classes), <= HOPATTN_CROSS_ENTROPY_MAX_COLS
    int64_t logits_stride;   // >= cols
    int64_t dlogits_stride;  // >= cols when dlogits is given
    int64_t dloss_stride;    // 0 or 1
    int64_t ignore_index;
    float label_smoothing;   // ε in [0, 1]
    float grad_scale;        // finite
    int dtype;               // RmsDtype: logits and dlogits
    int num_sms;
};

inline int cross_entropy_check_params(const CrossEntropyParams* p, char* err, int errlen) {
    const char* why = nullptr;
    if (p->dtype < RMS_BF16 || p->dtype > RMS_FP32) why = "dtype must be RMS_BF16, RMS_FP16 or RMS_FP32";
    else if (p->rows < 0 || p->cols < 1) why = "rows must be >= 0 and cols >= 1";
    else if (p->cols > HOPATTN_CROSS_ENTROPY_MAX_COLS) why = "cols must be at most 2^31 - 2^20";
    else if (p->rows > INT32_MAX / 16) why = "rows must be below 2^27 (a grid of CTAs, clusters of up to 16)";
    else if (p->logits_stride < p->cols) why = "logits_stride must be >= cols";
    else if (p->dlogits && p->dlogits_stride < p->cols) why = "dlogits_stride must be >= cols";
    else if (p->dlogits && p->dlogits == p->logits && p->dlogits_stride != p->logits_stride)
        why = "dlogits in place of logits must have logits_stride";
    else if (p->dloss_stride != 0 && p->dloss_stride != 1) why = "dloss_stride must be 0 or 1";
    else if (!(p->label_smoothing >= 0.0f && p->label_smoothing <= 1.0f)) why = "label_smoothing must be in [0, 1]";
    else if (!(p->grad_scale - p->grad_scale == 0.0f)) why = "grad_scale must be finite";
    else if (p->rows > 0 && (!p->logits || !p->targets || !p->loss)) why = "logits, targets and loss must be given";
    if (why) {
        snprintf(err, errlen, "%s", why);
        return 1;
    }
    return 0;
}

// Fills the attributes of RmsKernelInfo (the rowwise lineages' record) from the compiled kernel, with
// this ABI's version.
template <typename Kernel>
inline int cross_entropy_describe_kernel(Kernel kernel, RmsKernelInfo* info, char* err, int errlen) {
    if (rms_describe_kernel(kernel, info, err, errlen)) return 1;
    info->abi_version = HOPATTN_CROSS_ENTROPY_ABI_VERSION;
    return 0;
}
