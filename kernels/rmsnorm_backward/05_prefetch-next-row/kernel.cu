// RMSNorm backward, stage 05: the next row's x and dy copied into shared memory (cp.async) while this
// row is reduced.
//
//   x̂ = x · rstd[r],  g = weight · dy,  m[r] = rstd[r] · (Σ_c x · g + drstd[r]) / cols
//   dx[r, c] = rstd[r] · (g[r, c] − x̂[r, c] · m[r]),   dw[c] = Σ_r dy[r, c] · x̂[r, c]
//
// Stage 04's persistent CTAs take their rows one after the other: a row's loads are issued, the CTA
// waits for them, reduces the dot (a barrier, and a cluster barrier for long rows), writes dx — and
// only then issues the next row's loads. While a CTA reduces, nothing of its own is in flight; where
// an SM holds one CTA (rows of 16k columns and more, 1024 threads), HBM idles for the SM's share of
// every row's load latency and barriers. Here each thread copies its vectors of the next row, x and
// dy, into shared memory with cp.async (16 bytes each, zero-filled past the row's end) before it
// works on the current row; the copies land while the row is reduced and written. Two buffers
// alternate from row to row; a thread reads back only what it copied itself, so waiting for its own
// copies (cp.async.wait_group) is all the synchronisation the buffers need. The rest is stage 04's.
//
// Shorter rows keep stage 04's configurations, each with its two buffers (2 × 2 × 2 vectors × 16 bytes
// a thread: 128 KB for a CTA of 1024 threads, dynamic shared memory); rows past 256k bf16 (128k fp32)
// columns, rows not aligned to 16 bytes, and a GPU on which no cluster of the size fits, run stage
// 02's kernels.
#include "../common/abi_rmsnorm_backward.h"
#include "../common/cp_async.cuh"
#include "../../rmsnorm/common/elements.cuh"

#include <cooperative_groups.h>
#include <type_traits>

namespace cg = cooperative_groups;

// Stage 02's kernels: the path for rows this stage's kernel cannot hold or vectorize.
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


// This stage's kernel: the row in registers.
constexpr int kVectorsPerThread = 2;                // 16-byte vectors of x, and of dy, a thread holds
constexpr int kMaxThreadsPerRow = 1024;             // the most threads a row gets (one CTA)
constexpr int kMinCtaThreads = 256;                 // short rows are packed kMinCtaThreads / threads_per_row to a CTA
constexpr int kSmThreads = 1024;                    // threads an SM must hold (CTAs of at most 64 registers a thread)
constexpr int kMaxCluster = 16;                     // CTAs a row may span (past 8: a non-portable cluster size)

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

// An empty asm that says it changes v: the compiler must keep the packed registers and unpack them
// again where they are used next, instead of keeping the unpacked fp32 values (twice the registers)
// alive across the row's reduction.
__device__ __forceinline__ void keep_packed(uint4& v) {
    asm volatile("" : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w));
}

// The cluster barrier in two halves (barrier.cluster.arrive / wait): the arrive says this CTA has
// started (its shared memory may be written by its peers), the wait waits for every CTA's arrive.
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }

// kThreadsPerRow threads of each of kCluster CTAs hold a row, kHeld vectors of x and of dy each
// (vector k of thread t of the CTA of rank q: (q · kHeld + k) · kThreadsPerRow + t, so each of the
// kHeld loads of a warp is 512 contiguous bytes); kRows row slots per CTA when kCluster is 1. The grid
// is persistent: slot j of group b (a CTA, or a cluster) takes rows b · kRows + j, then
// groups · kRows further on, and so on; its threads keep their columns, and their sums of dy · x̂,
// from row to row.
template <typename T, int kThreadsPerRow, int kHeld, int kRows, int kCluster>
__global__ void __launch_bounds__(kThreadsPerRow * kRows, kSmThreads / (kThreadsPerRow * kRows))
    rmsnorm_bwd_rows(RmsNormBackwardParams p, float* partials) {
    static_assert(kCluster == 1 || kRows == 1, "a cluster shares one row");
    constexpr int kV = kVec16<T>;
    constexpr int kWarpsPerRow = kThreadsPerRow / 32;
    constexpr int kThreads = kThreadsPerRow * kRows;
    // [buffer][x, dy][k][thread]: a row's copies, each thread its own vectors (consecutive threads,
    // consecutive 16 bytes: no bank conflicts)
    extern __shared__ uint4 staged[];
    __shared__ float warp_sums[2][kRows][kWarpsPerRow];  // two: one row's are read while the next row's are written
    __shared__ float cta_sums[2][kCluster];              // [parity][q]: the dot of the cluster's CTA of rank q
    if constexpr (kCluster > 1) cluster_arrive_relaxed();
    const int t = threadIdx.x % kThreadsPerRow, slot = threadIdx.x / kThreadsPerRow;
    const int rank = kCluster > 1 ? (int)(blockIdx.x % kCluster) : 0;  // a cluster spans kCluster consecutive CTAs
    const int64_t group = blockIdx.x / kCluster, groups = gridDim.x / kCluster;
    const int first = rank * kHeld * kThreadsPerRow;  // the CTA's first vector of the row
    bool started = kCluster == 1;                     // whether every CTA of the cluster is known to have started
    const int cols = (int)p.cols;
    const T* weight = static_cast<const T*>(p.weight);

    uint4 w_held[kHeld];  // the weight of the thread's columns, for every row
#pragma unroll
    for (int k = 0; k < kHeld; ++k)
        w_held[k] = weight ? load_part<T, kV>(weight, (first + k * kThreadsPerRow + t) * kV, cols) : make_uint4(0, 0, 0, 0);
    float acc[kHeld][kV] = {};  // Σ dy · x̂ of the thread's columns over the slot's rows

    // This thread's vectors of x and dy of `row` into buffer `buf` (zeros past the row's end, and for a
    // row past the last: its copies read nothing), as one group of copies.
    auto copy_row = [&](int64_t row, int buf) {
        const bool live = row < p.rows;
        const T* x = static_cast<const T*>(p.x) + (live ? row : 0) * p.x_stride;
        const T* dy = static_cast<const T*>(p.dy) + (live ? row : 0) * p.dy_stride;
#pragma unroll
        for (int k = 0; k < kHeld; ++k) {
            const int c = (first + k * kThreadsPerRow + t) * kV;
            const int left = live ? (cols - c) * (int)sizeof(T) : 0;  // bytes of the row from column c on
            const int bytes = left < 0 ? 0 : (left > 16 ? 16 : left);
            const int at = bytes > 0 ? c : 0;  // a copy that reads nothing still names an address in the row
            cp_async_16_zfill(&staged[((buf * 2 + 0) * kHeld + k) * kThreads + threadIdx.x], x + at, bytes);
            cp_async_16_zfill(&staged[((buf * 2 + 1) * kHeld + k) * kThreads + threadIdx.x], dy + at, bytes);
        }
        cp_async_commit();
    };

    const int64_t step = groups * kRows;  // from a slot's row to its next
    int parity = 0;
    copy_row(group * kRows + slot, 0);
    for (int64_t base = group * kRows; base < p.rows; base += step) {
        const int64_t row = base + slot;
        const bool live = row < p.rows;  // a last round's slots past the end still reach the barrier
        copy_row(row + step, parity ^ 1);  // the next row's copies, in flight while this row is reduced
        const float rstd = live ? p.rstd[row] : 0.0f;
        const float drstd = live && p.drstd ? p.drstd[row] : 0.0f;
        cp_async_wait<1>();  // this row's copies (every group but the newest) have landed
        const uint4* x_held = &staged[(parity * 2 + 0) * kHeld * kThreads + threadIdx.x];   // [k · kThreads]
        const uint4* dy_held = &staged[(parity * 2 + 1) * kHeld * kThreads + threadIdx.x];

        float dot = 0.0f;
#pragma unroll
        for (int k = 0; k < kHeld; ++k) {
            float xv[kV], d[kV], w[kV];
            unpack<T>(x_held[k * kThreads], xv);
            unpack<T>(dy_held[k * kThreads], d);
            unpack<T>(w_held[k], w);
#pragma unroll
            for (int i = 0; i < kV; ++i) dot = fmaf(xv[i], weight ? d[i] * w[i] : d[i], dot);
        }
#pragma unroll
        for (int k = 0; k < kHeld; ++k) keep_packed(w_held[k]);
        // x and dy are read from shared memory again for dx (the barriers below already say so to the
        // compiler; a row of a warp has none): not kept in registers across the reduction.
        asm volatile("" ::: "memory");
        dot = warp_sum(dot);
        if constexpr (kWarpsPerRow > 1) {
            if (t % 32 == 0) warp_sums[parity][slot][t / 32] = dot;
            __syncthreads();
            dot = 0.0f;
#pragma unroll
            for (int w = 0; w < kWarpsPerRow; ++w) dot += warp_sums[parity][slot][w];  // the same order in every thread
        }
        if constexpr (kCluster > 1) {
            cg::cluster_group cluster = cg::this_cluster();
            if (!started) {
                cluster_wait();  // every CTA of the cluster has started
                started = true;
            }
            if (threadIdx.x < kCluster) *cluster.map_shared_rank(&cta_sums[parity][rank], (int)threadIdx.x) = dot;
            cluster.sync();  // release and acquire: the kCluster sums are in every CTA's cta_sums[parity]
            dot = 0.0f;
#pragma unroll
            for (int q = 0; q < kCluster; ++q) dot += cta_sums[parity][q];  // rank order, in every CTA
        }
        parity ^= 1;
        if (live) {
            const float m = rstd * (dot + drstd) / (float)cols;
            T* dx = static_cast<T*>(p.dx) + row * p.dx_stride;
#pragma unroll
            for (int k = 0; k < kHeld; ++k) {
                const int c = (first + k * kThreadsPerRow + t) * kV;
                if (c >= cols) break;  // vectors past the row's end: those of every later k are too
                float xv[kV], d[kV], w[kV], out[kV];
                unpack<T>(x_held[k * kThreads], xv);
                unpack<T>(dy_held[k * kThreads], d);
                unpack<T>(w_held[k], w);
#pragma unroll
                for (int i = 0; i < kV; ++i) {
                    const float xhat = xv[i] * rstd;
                    acc[k][i] = fmaf(d[i], xhat, acc[k][i]);
                    out[i] = rstd * fmaf(-xhat, m, weight ? d[i] * w[i] : d[i]);
                }
                store_part<T, kV>(dx, c, cols, out);
            }
        }
    }
    cp_async_wait<0>();  // the copies for a row past the last (they read nothing) land before the CTA exits
    if constexpr (kCluster > 1) {
        if (!started) cluster_wait();  // a cluster that took no row still pairs its arrive
    }
    if (p.dw) {  // every slot writes its partial row (its CTA's slice, in a cluster), zeros if it took no row
        float* partial = partials + (group * kRows + slot) * p.cols;
#pragma unroll
        for (int k = 0; k < kHeld; ++k) {
            const int c = (first + k * kThreadsPerRow + t) * kV;
#pragma unroll
            for (int i = 0; i < kV; ++i)
                if (c + i < cols) partial[c + i] = acc[k][i];
        }
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

template <typename T, typename C>
constexpr auto rows_kernel = rmsnorm_bwd_rows<T, C::kThreadsPerRow, C::kHeld, C::kRows, C::kCluster>;

// The two buffers of a CTA's copies: x and dy, kHeld vectors of each, a thread.
template <typename C>
constexpr int staged_bytes = 2 * 2 * C::kHeld * C::kThreadsPerRow * C::kRows * (int)sizeof(uint4);

// A launch of the kernel in clusters of C::kCluster consecutive CTAs.
template <typename T, typename C>
cudaLaunchConfig_t cluster_config(int64_t ctas, cudaStream_t stream, cudaLaunchAttribute* attribute) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3((unsigned)ctas);
    config.blockDim = dim3(C::kThreadsPerRow);
    config.dynamicSmemBytes = staged_bytes<C>;
    config.stream = stream;
    attribute->id = cudaLaunchAttributeClusterDimension;
    attribute->val.clusterDim.x = C::kCluster;
    attribute->val.clusterDim.y = 1;
    attribute->val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    return config;
}

// The persistent grid: as many CTAs (or clusters) as fit on the GPU at once, never more than the rows
// need; 0 when no cluster of C::kCluster CTAs fits (stage 02's kernels run instead).
template <typename T, typename C>
int persistent_ctas(const RmsNormBackwardParams& p, int64_t* ctas, char* err, int errlen) {
    RMS_CHECK(cudaFuncSetAttribute(rows_kernel<T, C>, cudaFuncAttributeMaxDynamicSharedMemorySize, staged_bytes<C>),
              err, errlen);
    if constexpr (C::kCluster > 1) {
        if constexpr (C::kCluster > 8)
            RMS_CHECK(cudaFuncSetAttribute(rows_kernel<T, C>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1), err,
                      errlen);
        cudaLaunchAttribute attribute[1];
        const cudaLaunchConfig_t launch = cluster_config<T, C>(C::kCluster, nullptr, attribute);
        int clusters = 0;
        RMS_CHECK(cudaOccupancyMaxActiveClusters(&clusters, rows_kernel<T, C>, &launch), err, errlen);
        *ctas = (p.rows < clusters ? p.rows : clusters) * C::kCluster;
        return 0;
    }
    int per_sm = 0;
    RMS_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rows_kernel<T, C>, C::kThreadsPerRow * C::kRows,
                                                            staged_bytes<C>),
              err, errlen);
    const int64_t fit = (int64_t)(per_sm > 0 ? per_sm : 1) * (p.num_sms > 0 ? p.num_sms : 1);
    const int64_t need = (p.rows + C::kRows - 1) / C::kRows;
    *ctas = need < fit ? need : fit;
    return 0;
}

template <typename T>
int workspace_typed(const RmsNormBackwardParams& p, int64_t* bytes, char* err, int errlen) {
    const bool aligned = rows_aligned<T>(p);
    return with_config<T>(p.cols, [&](auto config) -> int {
        using C = decltype(config);
        if constexpr (std::is_same_v<C, std::nullptr_t>) {
            *bytes = workspace_bytes(p, aligned ? kVec16<T> : 1);
        } else if (!aligned) {
            *bytes = workspace_bytes(p, 1);
        } else {
            int64_t ctas = 0;
            if (persistent_ctas<T, C>(p, &ctas, err, errlen)) return 1;
            if (ctas == 0) *bytes = workspace_bytes(p, kVec16<T>);
            else *bytes = p.dw ? ctas / C::kCluster * C::kRows * p.cols * 4 : 0;  // a partial row of dw per row slot
        }
        return 0;
    });
}

template <typename T>
int launch_typed(const RmsNormBackwardParams& p, cudaStream_t stream, char* err, int errlen) {
    const bool aligned = rows_aligned<T>(p);
    return with_config<T>(p.cols, [&](auto config) -> int {
        using C = decltype(config);
        if constexpr (std::is_same_v<C, std::nullptr_t>) {
            return aligned ? launch_vec<T, kVec16<T>>(p, stream, err, errlen) : launch_vec<T, 1>(p, stream, err, errlen);
        } else {
            if (!aligned) return launch_vec<T, 1>(p, stream, err, errlen);
            int64_t ctas = 0;
            if (persistent_ctas<T, C>(p, &ctas, err, errlen)) return 1;
            if (ctas == 0) return launch_vec<T, kVec16<T>>(p, stream, err, errlen);
            const int64_t partial_rows = ctas / C::kCluster * C::kRows;
            if (p.dw && p.workspace_bytes < partial_rows * p.cols * 4) {
                snprintf(err, errlen, "the workspace holds %lld bytes, the launch needs %lld",
                         (long long)p.workspace_bytes, (long long)(partial_rows * p.cols * 4));
                return 1;
            }
            float* partials = static_cast<float*>(p.workspace);
            if constexpr (C::kCluster > 1) {
                cudaLaunchAttribute attribute[1];
                const cudaLaunchConfig_t launch = cluster_config<T, C>(ctas, stream, attribute);
                RMS_CHECK(cudaLaunchKernelEx(&launch, rows_kernel<T, C>, p, partials), err, errlen);
            } else {
                rows_kernel<T, C><<<(unsigned)ctas, C::kThreadsPerRow * C::kRows, staged_bytes<C>, stream>>>(p, partials);
            }
            RMS_CHECK(cudaGetLastError(), err, errlen);
            if (p.dw) {
                rmsnorm_bwd_dw_sum<T><<<(unsigned)((p.cols + 31) / 32), kSumThreads, 0, stream>>>(
                    partials, partial_rows, p.cols, static_cast<T*>(p.dw));
                RMS_CHECK(cudaGetLastError(), err, errlen);
            }
            return 0;
        }
    });
}

template <typename T>
int describe_typed(const RmsNormBackwardParams& p, RmsBackwardInfo* info, char* err, int errlen) {
    const bool aligned = rows_aligned<T>(p);
    return with_config<T>(p.cols, [&](auto config) -> int {
        using C = decltype(config);
        if constexpr (std::is_same_v<C, std::nullptr_t>) {
            return describe_vec_typed<T>(p, info, aligned ? kVec16<T> : 1, err, errlen);
        } else {
            if (!aligned) return describe_vec_typed<T>(p, info, 1, err, errlen);
            int64_t ctas = 0;
            if (persistent_ctas<T, C>(p, &ctas, err, errlen)) return 1;
            if (ctas == 0) return describe_vec_typed<T>(p, info, kVec16<T>, err, errlen);
            snprintf(info->variant, sizeof(info->variant),
                     "row in registers<%s, %d threads/row, %d vectors, cluster %d>, persistent, next row prefetched",
                     kDtypeName<T>,
                     C::kThreadsPerRow, C::kHeld, C::kCluster);
            info->threads = C::kThreadsPerRow * C::kRows;
            info->rows_per_cta = C::kRows;
            info->threads_per_row = C::kThreadsPerRow;
            info->cluster = C::kCluster;
            info->vector_bytes = 16;
            info->elements_per_thread = C::kHeld * kVec16<T>;
            info->ctas = ctas;
            info->partial_rows = p.dw ? ctas / C::kCluster * C::kRows : 0;
            info->reads = 1;
            info->dynamic_smem = staged_bytes<C>;
            if (rms_backward_describe_kernel(rows_kernel<T, C>, info, err, errlen)) return 1;
            info->sum_registers = info->sum_local_bytes = 0;
            return p.dw ? rms_backward_describe_sum(rmsnorm_bwd_dw_sum<T>, info, err, errlen) : 0;
        }
    });
}

}  // namespace

HOPATTN_EXPORT int hopattn_rmsnorm_backward_workspace(const RmsNormBackwardParams* p, int64_t* bytes, char* err,
                                                      int errlen) {
    if (rms_backward_check_params(p, err, errlen)) return 1;
    return rms_dispatch(p->dtype, [&](auto t) { return workspace_typed<decltype(t)>(*p, bytes, err, errlen); });
}

HOPATTN_EXPORT int hopattn_rmsnorm_backward_launch(const RmsNormBackwardParams* p, cudaStream_t stream, char* err,
                                                   int errlen) {
    if (rms_backward_check_params(p, err, errlen)) return 1;
    if (p->rows == 0) return rms_backward_no_rows(p, stream, err, errlen);
    return rms_dispatch(p->dtype, [&](auto t) { return launch_typed<decltype(t)>(*p, stream, err, errlen); });
}

HOPATTN_EXPORT int hopattn_rmsnorm_backward_describe(const RmsNormBackwardParams* p, RmsBackwardInfo* info, char* err,
                                                     int errlen) {
    if (rms_backward_check_params(p, err, errlen)) return 1;
    return rms_dispatch(p->dtype, [&](auto t) { return describe_typed<decltype(t)>(*p, info, err, errlen); });
}
