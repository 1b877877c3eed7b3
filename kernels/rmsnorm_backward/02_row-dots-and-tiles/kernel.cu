// RMSNorm backward, stage 02: the row dots, then tiles of rows × columns, then the partials' sum.
//
//   x̂ = x · rstd[r],  g = weight · dy,  m[r] = rstd[r] · (Σ_c x · g + drstd[r]) / cols
//   dx[r, c] = rstd[r] · (g[r, c] − x̂[r, c] · m[r]),   dw[c] = Σ_r dy[r, c] · x̂[r, c]
//
// Stage 01's threads each walk a whole row or a whole column, one element at a time: nothing is
// coalesced, and dw has only `cols` threads. Here the work is cut along both axes, so that every
// access is a 16-byte vector of consecutive columns and every SM has work:
//
//   1. rmsnorm_bwd_row_dots: a warp per row (up to kWarpMaxCols columns) or a CTA of kDotCtaThreads per
//      longer row, 16-byte loads, reduces Σ x · g (shuffles, then shared memory) and writes the row's
//      coefficient m[r] to the workspace (the forward's stage 03, with a dot for the sum of squares).
//   2. rmsnorm_bwd_tiles: the rows are cut into row tiles and the columns into blocks of kTileThreads
//      vectors; a CTA takes one tile × block, each thread one column vector, and walks the tile's rows
//      (kRowsInFlight rows of loads in flight): dx from m[r], and its columns' Σ dy · x̂ over the
//      tile's rows in fp32, written as one partial row of dw per row tile.
//   3. rmsnorm_bwd_dw_sum: dw[c] = the sum of the tiles' partials of column c, in a fixed order (each
//      of kSumGroups warps sums every kSumGroups-th partial row, then one warp adds the groups in
//      order): the same bits on every run, whatever the timing. No atomics anywhere.
//
// x and dy are read twice (1 and 2), the second time from HBM: the first pass ends long before.
// Rows not aligned to 16 bytes run the same kernels one element per access.
#include "../common/abi_rmsnorm_backward.h"
#include "../../rmsnorm/common/elements.cuh"

#include <type_traits>

constexpr int kDotThreads = 256;                    // threads per CTA of the warp-per-row dot kernel
constexpr int kDotRowsPerCta = kDotThreads / 32;    // a row per warp
constexpr int kWarpMaxCols = 1024;                  // longer rows get a CTA each for their dot
constexpr int kDotCtaThreads = 512;                 // threads per CTA of the CTA-per-row dot kernel
constexpr int kUnroll = 4;                          // vectors a thread has in flight per dot loop step
constexpr int kTileThreads = 256;                   // threads per CTA of the tile kernel: a column vector each
constexpr int kRowsInFlight = 2;                    // rows of a tile whose loads a thread issues together
constexpr int kCtasPerSm = 4;                       // the tile grid aims at a wave of this many CTAs per SM
constexpr int kSumThreads = 256;                    // threads per CTA of the partial-sum kernel
constexpr int kSumGroups = kSumThreads / 32;        // warps that share a column's partial rows

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;  // every lane holds the same total: the butterfly adds in the same order everywhere
}

// kVec consecutive elements of T as one load returns them: a 16-byte vector (kVec = kVec16<T>) kept
// packed in four registers until used, or one element (kVec = 1, rows not aligned to 16 bytes).
template <typename T, int kVec>
using Raw = std::conditional_t<kVec == 1, T, uint4>;

// The kVec elements of a row of `cols` from column c: one access when they are all in the row,
// element by element at the row's end, zeros past it.
template <typename T, int kVec>
__device__ __forceinline__ Raw<T, kVec> load_part(const T* row, int64_t c, int64_t cols) {
    if constexpr (kVec == 1) {
        return c < cols ? row[c] : T(0.0f);
    } else {
        if (c + kVec <= cols) return *reinterpret_cast<const uint4*>(row + c);
        T t[kVec];
#pragma unroll
        for (int i = 0; i < kVec; ++i) t[i] = c + i < cols ? row[c + i] : T(0.0f);
        uint4 raw;
        memcpy(&raw, t, 16);
        return raw;
    }
}

template <typename T, int kVec>
__device__ __forceinline__ void to_floats(const Raw<T, kVec>& raw, float (&f)[kVec]) {
    if constexpr (kVec == 1) f[0] = to_float(raw);
    else unpack<T>(raw, f);
}

template <typename T, int kVec>
__device__ __forceinline__ void store_part(T* row, int64_t c, int64_t cols, const float (&f)[kVec]) {
    if (c + kVec <= cols) {
        store_floats<T, kVec>(row + c, f);
        return;
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i)
        if (c + i < cols) row[c + i] = from_float<T>(f[i]);
}

// 1. m[r] = rstd · (Σ x · g + drstd) / cols for each row: kThreadsPerRow threads a row (32: a warp,
// several rows a CTA; kDotCtaThreads: a CTA).
template <typename T, int kVec, int kThreadsPerRow>
__global__ void __launch_bounds__(kThreadsPerRow == 32 ? kDotThreads : kThreadsPerRow)
    rmsnorm_bwd_row_dots(RmsNormBackwardParams p, float* coef) {
    constexpr int kRows = kThreadsPerRow == 32 ? kDotRowsPerCta : 1;
    constexpr int kWarps = kThreadsPerRow / 32;
    __shared__ float warp_sums[kWarps];
    const int t = threadIdx.x % kThreadsPerRow;
    const int64_t row = (int64_t)blockIdx.x * kRows + threadIdx.x / kThreadsPerRow;
    if (row >= p.rows) return;  // only in the warp-per-row kernel (a CTA's row always exists): no barrier there
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    const T* dy = static_cast<const T*>(p.dy) + row * p.dy_stride;
    const T* weight = static_cast<const T*>(p.weight);
    const int cols = (int)p.cols;
    const int body = cols / kVec * kVec;  // the vector part; the tail element by element

    float dot = 0.0f;
#pragma unroll kUnroll
    for (int c = t * kVec; c < body; c += kThreadsPerRow * kVec) {
        float xv[kVec], g[kVec], w[kVec];
        load_floats<T, kVec>(x + c, xv);
        load_floats<T, kVec>(dy + c, g);
        if (weight) load_floats<T, kVec>(weight + c, w);
#pragma unroll
        for (int i = 0; i < kVec; ++i) dot = fmaf(xv[i], weight ? g[i] * w[i] : g[i], dot);
    }
    for (int c = body + t; c < cols; c += kThreadsPerRow) {
        const float g = weight ? to_float(dy[c]) * to_float(weight[c]) : to_float(dy[c]);
        dot = fmaf(to_float(x[c]), g, dot);
    }
    dot = warp_sum(dot);
    if constexpr (kWarps > 1) {
        if (t % 32 == 0) warp_sums[t / 32] = dot;
        __syncthreads();
        dot = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) dot += warp_sums[w];  // the same order in every thread
    }
    if (t == 0) coef[row] = p.rstd[row] * (dot + (p.drstd ? p.drstd[row] : 0.0f)) / (float)cols;
}

// 2. A tile of rows [blockIdx.y · rows_per_tile, ...) × the column vectors of block blockIdx.x: dx, and
// the tile's partial row of dw.
template <typename T, int kVec>
__global__ void __launch_bounds__(kTileThreads)
    rmsnorm_bwd_tiles(RmsNormBackwardParams p, const float* coef, float* partials, int64_t rows_per_tile) {
    const int64_t c = ((int64_t)blockIdx.x * kTileThreads + threadIdx.x) * kVec;  // columns c ... c + kVec - 1
    if (c >= p.cols) return;
    const int64_t first = (int64_t)blockIdx.y * rows_per_tile;
    const int64_t end = first + rows_per_tile < p.rows ? first + rows_per_tile : p.rows;
    const T* weight = static_cast<const T*>(p.weight);
    float w[kVec] = {};
    if (weight) to_floats<T, kVec>(load_part<T, kVec>(weight, c, p.cols), w);

    float acc[kVec] = {};  // Σ dy · x̂ over the tile's rows, this thread's columns
    for (int64_t r = first; r < end; r += kRowsInFlight) {
        Raw<T, kVec> xr[kRowsInFlight], dr[kRowsInFlight];
        float rstds[kRowsInFlight], ms[kRowsInFlight];
#pragma unroll
        for (int j = 0; j < kRowsInFlight; ++j) {  // every load of the kRowsInFlight rows before the first use
            if (r + j < end) {
                xr[j] = load_part<T, kVec>(static_cast<const T*>(p.x) + (r + j) * p.x_stride, c, p.cols);
                dr[j] = load_part<T, kVec>(static_cast<const T*>(p.dy) + (r + j) * p.dy_stride, c, p.cols);
                rstds[j] = p.rstd[r + j];
                ms[j] = coef[r + j];
            }
        }
#pragma unroll
        for (int j = 0; j < kRowsInFlight; ++j) {
            if (r + j >= end) break;
            const float rstd = rstds[j], m = ms[j];
            float xv[kVec], d[kVec], out[kVec];
            to_floats<T, kVec>(xr[j], xv);
            to_floats<T, kVec>(dr[j], d);
#pragma unroll
            for (int i = 0; i < kVec; ++i) {
                const float xhat = xv[i] * rstd;
                acc[i] = fmaf(d[i], xhat, acc[i]);
                out[i] = rstd * fmaf(-xhat, m, weight ? d[i] * w[i] : d[i]);
            }
            store_part<T, kVec>(static_cast<T*>(p.dx) + (r + j) * p.dx_stride, c, p.cols, out);
        }
    }
    if (p.dw) {
        float* partial = partials + (int64_t)blockIdx.y * p.cols;
#pragma unroll
        for (int i = 0; i < kVec; ++i)
            if (c + i < p.cols) partial[c + i] = acc[i];
    }
}

// 3. dw[c] = Σ_q partials[q, c], q in a fixed order: warp k sums rows k, k + kSumGroups, ...; then
// warp 0 adds the kSumGroups sums in order.
template <typename T>
__global__ void __launch_bounds__(kSumThreads)
    rmsnorm_bwd_dw_sum(const float* partials, int64_t partial_rows, int64_t cols, T* dw) {
    __shared__ float group_sums[kSumGroups][32];
    const int lane = threadIdx.x % 32, group = threadIdx.x / 32;
    const int64_t c = (int64_t)blockIdx.x * 32 + lane;
    float sum = 0.0f;
    if (c < cols) {
#pragma unroll 4
        for (int64_t q = group; q < partial_rows; q += kSumGroups) sum += partials[q * cols + c];
    }
    group_sums[group][lane] = sum;
    __syncthreads();
    if (group == 0 && c < cols) {
        float total = 0.0f;
#pragma unroll
        for (int k = 0; k < kSumGroups; ++k) total += group_sums[k][lane];
        dw[c] = from_float<T>(total);
    }
}

namespace {

// Whether every row of x, dy and dx (and weight) starts on a 16-byte boundary.
template <typename T>
bool rows_aligned(const RmsNormBackwardParams& p) {
    auto ok = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
    return ok(p.x) && ok(p.dy) && ok(p.dx) && ok(p.weight) && (p.x_stride * sizeof(T)) % 16 == 0 &&
           (p.dy_stride * sizeof(T)) % 16 == 0 && (p.dx_stride * sizeof(T)) % 16 == 0;
}

// How the tile kernel cuts the work: column blocks of kTileThreads vectors, row tiles so that the grid
// is about kCtasPerSm CTAs per SM (every tile with at least one row).
struct Tiling {
    int64_t col_blocks, row_tiles, rows_per_tile;
};

Tiling tiling(const RmsNormBackwardParams& p, int vec) {
    Tiling t;
    t.col_blocks = ((p.cols + vec - 1) / vec + kTileThreads - 1) / kTileThreads;
    const int64_t sms = p.num_sms > 0 ? p.num_sms : 1;
    int64_t want = (kCtasPerSm * sms + t.col_blocks - 1) / t.col_blocks;
    want = want < 1 ? 1 : (want > p.rows ? p.rows : want);
    t.rows_per_tile = want > 0 ? (p.rows + want - 1) / want : 1;
    t.row_tiles = p.rows > 0 ? (p.rows + t.rows_per_tile - 1) / t.rows_per_tile : 0;
    return t;
}

constexpr int64_t align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

// The workspace: the rows' coefficients m, then (with dw) one fp32 partial row per row tile.
int64_t workspace_bytes(const RmsNormBackwardParams& p, int vec) {
    const Tiling t = tiling(p, vec);
    return align16(p.rows * 4) + (p.dw ? t.row_tiles * p.cols * 4 : 0);
}

template <typename T, int kVec>
int launch_vec(const RmsNormBackwardParams& p, cudaStream_t stream, char* err, int errlen) {
    const Tiling t = tiling(p, kVec);
    if (t.row_tiles > 65535 || t.col_blocks > INT32_MAX || p.rows > INT32_MAX) {
        snprintf(err, errlen, "rows must be below 2^31 (the dot kernels' grids)");
        return 1;
    }
    if (p.workspace_bytes < workspace_bytes(p, kVec)) {
        snprintf(err, errlen, "the workspace holds %lld bytes, the launch needs %lld",
                 (long long)p.workspace_bytes, (long long)workspace_bytes(p, kVec));
        return 1;
    }
    float* coef = static_cast<float*>(p.workspace);
    float* partials = coef + align16(p.rows * 4) / 4;
    if (p.cols <= kWarpMaxCols)
        rmsnorm_bwd_row_dots<T, kVec, 32>
            <<<(unsigned)((p.rows + kDotRowsPerCta - 1) / kDotRowsPerCta), kDotThreads, 0, stream>>>(p, coef);
    else
        rmsnorm_bwd_row_dots<T, kVec, kDotCtaThreads><<<(unsigned)p.rows, kDotCtaThreads, 0, stream>>>(p, coef);
    RMS_CHECK(cudaGetLastError(), err, errlen);
    rmsnorm_bwd_tiles<T, kVec><<<dim3((unsigned)t.col_blocks, (unsigned)t.row_tiles), kTileThreads, 0, stream>>>(
        p, coef, partials, t.rows_per_tile);
    RMS_CHECK(cudaGetLastError(), err, errlen);
    if (p.dw) {
        rmsnorm_bwd_dw_sum<T><<<(unsigned)((p.cols + 31) / 32), kSumThreads, 0, stream>>>(
            partials, t.row_tiles, p.cols, static_cast<T*>(p.dw));
        RMS_CHECK(cudaGetLastError(), err, errlen);
    }
    return 0;
}

template <typename T>
int describe_vec_typed(const RmsNormBackwardParams& p, RmsBackwardInfo* info, int vec, char* err, int errlen) {
    const Tiling t = tiling(p, vec);
    snprintf(info->variant, sizeof(info->variant), "row dots (%s per row), %d-row tiles<%s, %d-byte accesses>",
             p.cols <= kWarpMaxCols ? "warp" : "CTA", (int)t.rows_per_tile, kDtypeName<T>, vec * (int)sizeof(T));
    info->threads = kTileThreads;
    info->rows_per_cta = (int)t.rows_per_tile;
    info->threads_per_row = (int)(t.col_blocks * kTileThreads);
    info->cluster = 1;
    info->vector_bytes = vec * (int)sizeof(T);
    info->elements_per_thread = 0;
    info->ctas = t.col_blocks * t.row_tiles;
    info->partial_rows = p.dw ? t.row_tiles : 0;
    info->reads = 2;
    info->dynamic_smem = 0;
    int status = vec == 1 ? rms_backward_describe_kernel(rmsnorm_bwd_tiles<T, 1>, info, err, errlen)
                          : rms_backward_describe_kernel(rmsnorm_bwd_tiles<T, kVec16<T>>, info, err, errlen);
    if (status) return status;
    info->sum_registers = info->sum_local_bytes = 0;
    return p.dw ? rms_backward_describe_sum(rmsnorm_bwd_dw_sum<T>, info, err, errlen) : 0;
}

}  // namespace

HOPATTN_EXPORT int hopattn_rmsnorm_backward_workspace(const RmsNormBackwardParams* p, int64_t* bytes, char* err,
                                                      int errlen) {
    if (rms_backward_check_params(p, err, errlen)) return 1;
    return rms_dispatch(p->dtype, [&](auto t) {
        using T = decltype(t);
        *bytes = workspace_bytes(*p, rows_aligned<T>(*p) ? kVec16<T> : 1);
        return 0;
    });
}

HOPATTN_EXPORT int hopattn_rmsnorm_backward_launch(const RmsNormBackwardParams* p, cudaStream_t stream, char* err,
                                                   int errlen) {
    if (rms_backward_check_params(p, err, errlen)) return 1;
    if (p->rows == 0) return rms_backward_no_rows(p, stream, err, errlen);
    return rms_dispatch(p->dtype, [&](auto t) {
        using T = decltype(t);
        return rows_aligned<T>(*p) ? launch_vec<T, kVec16<T>>(*p, stream, err, errlen)
                                   : launch_vec<T, 1>(*p, stream, err, errlen);
    });
}

HOPATTN_EXPORT int hopattn_rmsnorm_backward_describe(const RmsNormBackwardParams* p, RmsBackwardInfo* info, char* err,
                                                     int errlen) {
    if (rms_backward_check_params(p, err, errlen)) return 1;
    return rms_dispatch(p->dtype, [&](auto t) {
        using T = decltype(t);
        return describe_vec_typed<T>(*p, info, rows_aligned<T>(*p) ? kVec16<T> : 1, err, errlen);
    });
}
