// Cross-entropy, stage 06: stage 05's lean rows, on a persistent grid that loads its next rows while
// it merges and stores the current one.
//
//   loss[r] = log s + (1 − ε)(m − x[r, t]) + ε (m − Σ x / V),  m = max_c x,  s = Σ_c exp(x − m)
//   dlogits[r, c] = g · (exp(x − m) / s − (1 − ε)[c = t] − ε / V)           (when dlogits is given)
//
// Stage 05 issues about 14.5 instructions an element fused and 7.5 forward, well under what an SM
// issues at the copy's rate, and still loses 4.7–67 µs a launch beyond the copy, about the same in
// every direction: a CTA there loads its row, waits the DRAM latency, reduces, merges (shared memory,
// the cluster) and stores, then exits, and from its last load to its exit it has no byte in flight.
// The CTAs of a wave (a cluster's the more, its barrier aligns them) are in that phase together, so
// the memory pipe idles once a wave: 7.8 waves at 4k to 15.5 at 256k. Here the grid is persistent —
// as many CTAs (clusters) as the SMs hold at once, each walking rows (row groups) a grid apart — and
// each thread keeps its next two rows in flight in shared memory:
//
//   1. before its first row, a thread issues cp.async for its vectors of its first two rows into two
//      shared-memory slots of its own (16 bytes a copy, zero-filled past the row's end; the thread
//      writes and reads only its own slots, so no barrier guards them: cp.async.wait_group makes its
//      own copies visible to it);
//   2. a row: wait for the older group, read the slot into registers (−inf past the row's end), take
//      the statistics as stage 05 does (one max, one ex2.approx an element), then issue the row two
//      ahead into the slot just emptied — after the statistics, which consumed every value read from
//      it — and merge, write the loss and store the gradient (stage 05's r · (r · a) + b) while two
//      rows' loads are in flight;
//   3. the merge's shared records are double-buffered by the row's parity (the next row's writes
//      cannot reach a record a slower thread or CTA still reads: they come after the barrier that
//      follows its reads); the targets and dloss of the next row are loaded a row ahead.
//
// The latency and the merge are then paid once a launch, not once a wave. The configurations (stage
// 05's table), the ABI and the fallback to stage 02's kernels (rows past 256k bf16 / 128k fp32, rows
// not aligned to 16 bytes) are stage 05's; the grid is min(row groups, CTAs resident), from the
// occupancy calculator once a device and instance.
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
constexpr int kStages = 2;            // rows a thread has in flight in shared memory, beside the one in registers

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

// ---- The copies into shared memory: cp.async, 16 bytes, L2 only (.cg), the bytes past src_bytes zeroed.

__device__ __forceinline__ void cp_async_16(uint4* smem, const void* gmem, int src_bytes) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Every group of this thread but the newest `kPending` complete, their bytes visible to this thread.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// threadIdx.x as the compiler cannot know it: re-read at every row, so that the columns, addresses and
// byte counts of a thread's vectors (the same at every row) are recomputed there, a few integer
// instructions a vector, instead of hoisted out of the row loop into registers that held the row
// twice over (122–181 registers and spills without it).
__device__ __forceinline__ int opaque_tid() {
    int v;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(v));
    return v;
}

// A vector of −inf (no part of the max or of s).
template <typename T>
__device__ __forceinline__ uint4 minus_inf_vector() {
    const uint32_t w = std::is_same_v<T, float> ? 0xff800000u : std::is_same_v<T, __half> ? 0xfc00fc00u : 0xff80ff80u;
    return make_uint4(w, w, w, w);
}

// The row's last vector, `valid` (1 … kV − 1) elements of it inside the row: −inf in the others (the
// copy zero-filled them).
template <typename T>
__device__ __forceinline__ uint4 mask_past_end(const uint4& raw, int valid) {
    constexpr int kV = kVec16<T>;
    T t[kV];
    memcpy(t, &raw, 16);
#pragma unroll
    for (int i = 0; i < kV; ++i)
        if (i >= valid) t[i] = from_float<T>(-INFINITY);
    uint4 out;
    memcpy(&out, t, 16);
    return out;
}

// This thread's kHeld vectors of a row (columns (first + k · kThreadsPerRow + t) · kV) into its slot
// of one stage (vector k at slot[k · kCtaThreads]: a warp's 16-byte copies side by side), as one
// group; a row that does not exist (live false) copies nothing and still commits its (empty) group,
// so that every thread counts the same groups.
template <typename T, int kThreadsPerRow, int kHeld, int kCtaThreads>
__device__ __forceinline__ void issue_row(uint4* slot, const T* x, int first, int t, int cols, bool live) {
    constexpr int kV = kVec16<T>;
    if (live) {
#pragma unroll
        for (int k = 0; k < kHeld; ++k) {
            const int c = (first + k * kThreadsPerRow + t) * kV;
            if (c >= cols) break;  // past the row's end: every later k is too
            cp_async_16(slot + k * kCtaThreads, x + c, (cols - c < kV ? cols - c : kV) * (int)sizeof(T));
        }
    }
    cp_async_commit();
}

// The slot back in registers: −inf past the row's end (and for a row that does not exist).
template <typename T, int kThreadsPerRow, int kHeld, int kCtaThreads>
__device__ __forceinline__ void read_row(uint4 (&held)[kHeld], const uint4* slot, int first, int t, int cols,
                                         bool live) {
    constexpr int kV = kVec16<T>;
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
        const int c = (first + k * kThreadsPerRow + t) * kV;
        if (!live || c >= cols) held[k] = minus_inf_vector<T>();
        else if (c + kV > cols) held[k] = mask_past_end<T>(slot[k * kCtaThreads], cols - c);
        else held[k] = slot[k * kCtaThreads];
    }
}

// ---- The held vectors (stage 05's): unpacked with bit operations, maxed packed.

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
// A CTA (a cluster) walks row groups — kRows consecutive rows, one in a cluster — a grid apart:
// group g, g + G, g + 2G, … with G the CTAs (clusters) of the grid.
template <typename T, int kThreadsPerRow, int kHeld, int kRows, int kCluster>
__global__ void __launch_bounds__(kThreadsPerRow * kRows) cross_entropy_persistent_rows(CrossEntropyParams p) {
    static_assert(kCluster == 1 || kRows == 1, "a cluster shares one row");
    static_assert(kStages == 2, "the slots alternate by the row's parity");
    constexpr int kV = kVec16<T>;
    constexpr int kWarpsPerRow = kThreadsPerRow / 32;
    constexpr int kCtaThreads = kThreadsPerRow * kRows;
    constexpr int kSlot = kHeld * kCtaThreads;              // uint4 of one stage
    __shared__ RowStats warp_vals[2][kRows][kWarpsPerRow];  // by the row's parity
    __shared__ RowStats cta_vals[2][kCluster];              // [parity][q]: the statistics of the CTA of rank q
    extern __shared__ uint4 ring[];                         // [kStages][kHeld][kCtaThreads]: the rows in flight
    if constexpr (kCluster > 1) cluster_arrive_relaxed();
    const int r = threadIdx.x / kThreadsPerRow;  // the CTA's row (0 in a cluster)
    const int rank = kCluster > 1 ? (int)(blockIdx.x % kCluster) : 0;  // a cluster: kCluster consecutive CTAs
    const int apart = (int)gridDim.x / kCluster;                    // G (int: rows < 2^27, the ABI's check)
    const int groups = (int)((p.rows + kRows - 1) / kRows);
    const int first = rank * kHeld * kThreadsPerRow;  // the CTA's first vector of the row
    const int cols = (int)p.cols;
    const int rows = (int)p.rows;
    auto row_of = [&](int g) { return g * kRows + r; };
    auto live = [&](int g) { return g < groups && row_of(g) < rows; };
    auto logits = [&](int g) {  // the row's logits (row 0's for one that does not exist: never read)
        return static_cast<const T*>(p.logits) + (int64_t)(live(g) ? row_of(g) : 0) * p.logits_stride;
    };

    // 1. The first kStages rows in flight, then the first row's target and dloss.
    int g = (int)blockIdx.x / kCluster;
#pragma unroll
    for (int s = 0; s < kStages; ++s)  // this thread's vector 0 of stage s: ring[s · kSlot + threadIdx.x]
        issue_row<T, kThreadsPerRow, kHeld, kCtaThreads>(ring + s * kSlot + threadIdx.x, logits(g + s * apart), first,
                                                         (int)threadIdx.x % kThreadsPerRow, cols, live(g + s * apart));
    int tcol = live(g) ? target_column(read_target(p, row_of(g))) : kIgnored;  // one register across the merge
    float g_in = live(g) && p.dloss ? p.dloss[(int64_t)row_of(g) * p.dloss_stride] : 1.0f;
    if constexpr (kCluster > 1) cluster_wait();  // every CTA of the cluster has started

    for (int parity = 0; g < groups; g += apart, parity ^= 1) {
        const int tid = opaque_tid();  // threadIdx.x, recomputed from here on (opaque_tid says why)
        const int t = tid % kThreadsPerRow;
        const int row = row_of(g);
        const bool here = row < rows;  // the last group's extra rows still reach the barriers
        // The next row's target and dloss, a row ahead: its statistics do not wait for them.
        const bool next = live(g + apart);
        const int tcol_next = next ? target_column(read_target(p, row_of(g + apart))) : kIgnored;
        const float g_next = next && p.dloss ? p.dloss[(int64_t)row_of(g + apart) * p.dloss_stride] : 1.0f;

        // 2. This row from its slot (the older group landed; the newer, the next row, may still fly).
        uint4* const slot = ring + parity * kSlot + tid;  // this thread's vector 0 of the row's stage
        cp_async_wait<kStages - 1>();
        uint4 held[kHeld];
        read_row<T, kThreadsPerRow, kHeld, kCtaThreads>(held, slot, first, t, cols, here);
        RowStats st = held_stats<T, kHeld, kThreadsPerRow>(held, first, t, cols, tcol);
        if (p.label_smoothing != 0.0f) st.sx = held_plain_sum<T, kHeld, kThreadsPerRow>(held, first, t, cols);
#pragma unroll
        for (int k = 0; k < kHeld; ++k) keep_packed(held[k]);

        // 3. The merge (stage 05's), its records by the row's parity; the row kStages ahead is issued into
        // the slot just read once a barrier has performed this thread's reads of it (the CTA's, or the
        // warp's where a warp holds the row), so that no copy can overwrite a value before it is read.
        st = warp_merge(st);
        if constexpr (kWarpsPerRow > 1) {
            if (t % 32 == 0) warp_vals[parity][r][t / 32] = st;
            __syncthreads();
        } else {
            __syncwarp();
        }
        issue_row<T, kThreadsPerRow, kHeld, kCtaThreads>(slot, logits(g + kStages * apart), first, t, cols,
                                                         live(g + kStages * apart));
        if constexpr (kWarpsPerRow > 1) {
            st = warp_vals[parity][r][0];
#pragma unroll
            for (int w = 1; w < kWarpsPerRow; ++w) st = merge(st, warp_vals[parity][r][w]);  // the same order everywhere
        }
        if constexpr (kCluster > 1) {
            cg::cluster_group cluster = cg::this_cluster();
            if (threadIdx.x < kCluster) *cluster.map_shared_rank(&cta_vals[parity][rank], (int)threadIdx.x) = st;
            cluster.sync();  // release and acquire: all kCluster records are in every CTA's cta_vals[parity]
            st = cta_vals[parity][0];
#pragma unroll
            for (int q = 1; q < kCluster; ++q) st = merge(st, cta_vals[parity][q]);  // rank order, in every CTA
        }

        // 4. The loss, and the gradient from the registers (stage 05's), while two rows are in flight.
        if (here) {
            const Target tg = target_of(tcol);
            if (rank == 0 && t == 0) write_loss(p, row, st, tg);
            if (p.dlogits) {
                T* dl = static_cast<T*>(p.dlogits) + (int64_t)row * p.dlogits_stride;
                if (tg.ignored) {  // loss 0, gradient exactly 0, whatever the logits hold
#pragma unroll
                    for (int k = 0; k < kHeld; ++k) {
                        const int c = (first + k * kThreadsPerRow + t) * kV;
                        if (c >= cols) break;
                        store_part<T>(dl, c, cols, make_uint4(0, 0, 0, 0));
                    }
                } else {
                    const LeanGrad gr = lean_grad(p, g_in, st, tg);
#pragma unroll
                    for (int k = 0; k < kHeld; ++k) {
                        const int c = (first + k * kThreadsPerRow + t) * kV;
                        if (c >= cols) break;
                        store_part<T>(dl, c, cols, grad_vector<T>(gr, held[k], c));
                    }
                }
            }
        }
        tcol = tcol_next;
        g_in = g_next;
    }
}

namespace {

template <int kThreadsPerRow_, int kHeld_, int kCluster_ = 1>
struct Config {
    static constexpr int kThreadsPerRow = kThreadsPerRow_, kHeld = kHeld_, kCluster = kCluster_;
    static constexpr int kRows = kThreadsPerRow_ >= kMinCtaThreads ? 1 : kMinCtaThreads / kThreadsPerRow_;
    static constexpr int kSmem = kStages * kHeld_ * kThreadsPerRow_ * kRows * 16;  // dynamic shared memory
};

// f(Config<...>{}) for the smallest configuration that holds a row of `cols` elements of T;
// f(nullptr) when none does (stage 05's table).
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
constexpr auto kPersistentKernel = cross_entropy_persistent_rows<T, C::kThreadsPerRow, C::kHeld, C::kRows, C::kCluster>;

template <typename C>
cudaLaunchConfig_t launch_config(unsigned ctas, cudaStream_t stream, cudaLaunchAttribute* attribute) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(ctas);
    config.blockDim = dim3(C::kThreadsPerRow * C::kRows);
    config.dynamicSmemBytes = C::kSmem;
    config.stream = stream;
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = C::kCluster;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    return config;
}

// The CTAs of the instance the current device holds at once (a multiple of kCluster: whole clusters),
// from the occupancy calculator; once a device (the dynamic shared memory allowed first, past 48 KB).
template <typename T, typename C>
cudaError_t resident_ctas(const CrossEntropyParams& p, int* ctas) {
    constexpr int kDevices = 64;
    static int known[kDevices] = {};  // 0: not asked yet (a race only asks twice)
    int device = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e != cudaSuccess) return e;
    if (device < kDevices && known[device]) {
        *ctas = known[device];
        return cudaSuccess;
    }
    e = cudaFuncSetAttribute(kPersistentKernel<T, C>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem);
    if (e != cudaSuccess) return e;
    int n = 0;
    if constexpr (C::kCluster > 1) {
        cudaLaunchAttribute attribute[1];
        const cudaLaunchConfig_t config = launch_config<C>(C::kCluster, nullptr, attribute);
        e = cudaOccupancyMaxActiveClusters(&n, kPersistentKernel<T, C>, &config);
        n *= C::kCluster;
    } else {
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kPersistentKernel<T, C>, C::kThreadsPerRow * C::kRows,
                                                          C::kSmem);
        n *= p.num_sms > 0 ? p.num_sms : 1;
    }
    if (e != cudaSuccess) return e;
    if (n < C::kCluster) return cudaErrorInvalidConfiguration;  // not even one CTA (cluster) fits
    if (device < kDevices) known[device] = n;
    *ctas = n;
    return cudaSuccess;
}

// The persistent grid: min(row groups, CTAs resident), whole clusters.
template <typename T, typename C>
cudaError_t launch_persistent(const CrossEntropyParams& p, cudaStream_t stream) {
    int resident = 0;
    const cudaError_t e = resident_ctas<T, C>(p, &resident);
    if (e != cudaSuccess) return e;
    const int64_t groups = (p.rows + C::kRows - 1) / C::kRows;
    const int64_t units = resident / C::kCluster;  // CTAs, or clusters
    const unsigned ctas = (unsigned)((groups < units ? groups : units) * C::kCluster);
    if constexpr (C::kCluster > 1) {
        cudaLaunchAttribute attribute[1];
        const cudaLaunchConfig_t config = launch_config<C>(ctas, stream, attribute);
        return cudaLaunchKernelEx(&config, kPersistentKernel<T, C>, p);
    } else {
        kPersistentKernel<T, C><<<ctas, C::kThreadsPerRow * C::kRows, C::kSmem, stream>>>(p);
        return cudaSuccess;
    }
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
        } else {
            launched = launch_persistent<T, C>(p, stream);
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
                // shorter than the ABI's 64 bytes, the cluster's number included (stage 05's was cut)
                snprintf(info->variant, sizeof(info->variant), "persistent<%s, %d threads/row, %d vectors, cluster %d>",
                         kDtypeName<T>, C::kThreadsPerRow, C::kHeld, C::kCluster);
                info->threads = C::kThreadsPerRow * C::kRows;
                info->rows_per_cta = C::kRows;
                info->threads_per_row = C::kThreadsPerRow;
                info->cluster = C::kCluster;
                info->vector_bytes = 16;
                info->elements_per_thread = C::kHeld * kVec16<T>;
                info->dynamic_smem = C::kSmem;
                return cross_entropy_describe_kernel(kPersistentKernel<T, C>, info, err, errlen);
            }
        });
    });
}
