// Backward stage 02 — dQ added four floats at a time.
//
// Stage 01 spends about two fifths of its time adding dQ into the fp32 accumulator: 64 scalar
// red.global.add.f32 per thread per query block, 8 192 per CTA, each its own request to L2. Here a
// thread first trades half of its dQ fragment with its neighbour in the quad (one shuffle per
// n8 tile), so that each holds four consecutive floats of one row, and adds them with one
// red.global.add.v4.f32: a quarter of the requests for the same bytes.
#include <cuda_bf16.h>

#include "../../attention/common/ldmatrix.cuh"
#include "../../attention/common/mma_sm80.cuh"
#include "../common/abi_backward.h"

constexpr int HEAD_DIM = 128;
constexpr int BLOCK_M = 64;  // query rows per step of the main kernel (and per CTA of the dQ kernel)
constexpr int BLOCK_N = 64;  // keys per CTA of the main kernel (and per step of the dQ kernel)
constexpr int NUM_THREADS = 128;
constexpr int WARPS = NUM_THREADS / 32;
constexpr int ROWS_PER_WARP = 16;  // each warp: 16 query rows of S, or 16 keys of dK and dV
static_assert(BLOCK_M == WARPS * ROWS_PER_WARP && BLOCK_N == WARPS * ROWS_PER_WARP, "one m16 tile per warp");

// Rows of the shared tiles are padded by 16 bytes: consecutive rows then start 4 banks apart, so
// the 8 row addresses of an ldmatrix hit 32 different banks (plain and transposed alike).
constexpr int PAD = 8;
constexpr int LD_D = HEAD_DIM + PAD;   // stride of a [rows][HEAD_DIM] tile
constexpr int LD_N = BLOCK_N + PAD;    // stride of a [BLOCK_M][BLOCK_N] tile (P, dS)
constexpr int TILE_D_BYTES = 64 * LD_D * 2;
constexpr int TILE_S_BYTES = BLOCK_M * LD_N * 2;
// K, V, Q, dO, then P and dS.
constexpr int SMEM_BYTES = 4 * TILE_D_BYTES + 2 * TILE_S_BYTES;

constexpr int D_STEPS = HEAD_DIM / 16;  // k-steps over the head dim (S = Q Kᵀ, dP = dO Vᵀ)
constexpr int N_TILES = BLOCK_N / 8;    // n8 tiles of a 16 x BLOCK_N row block of S
constexpr int D_TILES = HEAD_DIM / 8;   // n8 tiles of a 16 x HEAD_DIM accumulator
constexpr int PRE_ROWS = NUM_THREADS / 16;  // preprocess: 16 threads per row, 8 elements each
constexpr float LOG2E = 1.4426950408889634f;

using bf16 = __nv_bfloat16;

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 pair = __float22bfloat162_rn(make_float2(lo, hi));
    return *reinterpret_cast<uint32_t*>(&pair);
}

// 2^x on the special-function unit (MUFU.EX2); flushes denormal results to zero.
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ int padded_rows(int len) { return (len + BLOCK_M - 1) / BLOCK_M * BLOCK_M; }

// --- 1. preprocess --------------------------------------------------------------------------------

// For every query row (padded to BLOCK_M): D = rowsum(dO ∘ O) (less dlse, when the caller's loss
// used the log-sum-exp) and lse · log2(e), with +inf for the
// padding rows and for rows that saw no key (lse = −inf), so that P = 2^(s − lse₂) is exactly 0
// there; and the row of the dQ accumulator zeroed.
__global__ void __launch_bounds__(NUM_THREADS) preprocess_kernel(const AttnBwdParams p) {
    const int row = blockIdx.x * PRE_ROWS + threadIdx.x / 16, part = threadIdx.x % 16;
    const int head = blockIdx.y, batch = blockIdx.z;
    const int rows = padded_rows(p.len_q);
    const int64_t bh = (int64_t)batch * p.heads + head;
    float dot = 0.f;
    if (row < p.len_q) {
        const bf16* o = static_cast<const bf16*>(p.o) + batch * p.o_stride[0] + head * p.o_stride[1] + row * p.o_stride[2];
        const bf16* d = static_cast<const bf16*>(p.dout) + batch * p.dout_stride[0] + head * p.dout_stride[1] +
                        row * p.dout_stride[2];
        const uint4 ov = *reinterpret_cast<const uint4*>(o + part * 8);
        const uint4 dv = *reinterpret_cast<const uint4*>(d + part * 8);
        const bf16* oe = reinterpret_cast<const bf16*>(&ov);
        const bf16* de = reinterpret_cast<const bf16*>(&dv);
        #pragma unroll
        for (int i = 0; i < 8; ++i) dot += __bfloat162float(oe[i]) * __bfloat162float(de[i]);
    }
    #pragma unroll
    for (int offset = 8; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    if (row >= rows) return;
    if (part == 0) {
        float lse2 = INFINITY;
        if (row < p.len_q) {
            const float lse = p.lse[bh * p.len_q + row];
            lse2 = lse == -INFINITY ? INFINITY : lse * LOG2E;
            if (p.dlse) dot -= p.dlse[bh * p.len_q + row];  // dS = P ∘ (dP − (D − dlse))
        }
        p.row_stats[bh * rows + row] = dot;
        p.row_stats[((int64_t)p.batch * p.heads + bh) * rows + row] = lse2;
    }
    if (p.dq_accum) {
        float4* acc = reinterpret_cast<float4*>(p.dq_accum + (bh * rows + row) * HEAD_DIM) + part * 2;
        acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
        acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

// --- shared helpers of the main and the dQ kernels ---------------------------------------------------

// Copies `count` rows (of 64) of a [rows][HEAD_DIM] global tile into a padded shared tile with
// 16-byte loads; rows past `count` are zero, so they add nothing to any product.
__device__ __forceinline__ void load_rows(bf16* tile, const bf16* src, int64_t row_stride, int count) {
    constexpr int CHUNKS = HEAD_DIM / 8;
    for (int i = threadIdx.x; i < 64 * CHUNKS; i += NUM_THREADS) {
        const int row = i / CHUNKS, col = (i % CHUNKS) * 8;
        uint4 value = make_uint4(0, 0, 0, 0);
        if (row < count) value = *reinterpret_cast<const uint4*>(src + row * row_stride + col);
        *reinterpret_cast<uint4*>(tile + row * LD_D + col) = value;
    }
}

// acc[N_TILES][4] += A Bᵀ for A = rows row0..row0+15 of a [..][HEAD_DIM] tile, B = the BLOCK_N rows
// of another: S = Q Kᵀ and dP = dO Vᵀ, both over the head dim.
__device__ __forceinline__ void gemm_rows_by_rows(float acc[N_TILES][4], const bf16* a_tile, int row0,
                                                  const bf16* b_tile, int lane) {
    const int r = lane % 8, i = lane / 8;
    #pragma unroll
    for (int kk = 0; kk < D_STEPS; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, smem_addr(a_tile + (row0 + r + (i % 2) * 8) * LD_D + kk * 16 + (i / 2) * 8));
        #pragma unroll
        for (int nt = 0; nt < N_TILES; nt += 2) {
            uint32_t b[4];
            ldmatrix_x4(b, smem_addr(b_tile + (nt * 8 + r + (i / 2) * 8) * LD_D + kk * 16 + (i % 2) * 8));
            mma_m16n8k16_bf16(acc[nt], a, b);
            mma_m16n8k16_bf16(acc[nt + 1], a, b + 2);
        }
    }
}

// acc[D_TILES][4] += A B, A (16 x 64) read from a [64][ld] shared tile — transposed (columns
// col0..col0+15 of it, as rows) when A_TRANS — and B the 64 x HEAD_DIM tile [64][LD_D] whose rows
// are the k index: dV += Pᵀ dO, dK += dSᵀ Q (A transposed), dQ += dS K (A as stored).
template <bool A_TRANS>
__device__ __forceinline__ void gemm_into_head_dim(float acc[D_TILES][4], const bf16* a_tile, int ld, int a0,
                                                   const bf16* b_tile, int lane) {
    const int r = lane % 8, i = lane / 8;
    #pragma unroll
    for (int kk = 0; kk < 64 / 16; ++kk) {
        uint32_t a[4];
        if (A_TRANS)  // A(row, k) = tile[k][a0 + row]: matrix i covers tile rows k + (i/2)*8, columns (i%2)*8
            ldmatrix_x4_trans(a, smem_addr(a_tile + (kk * 16 + r + (i / 2) * 8) * ld + a0 + (i % 2) * 8));
        else
            ldmatrix_x4(a, smem_addr(a_tile + (a0 + r + (i % 2) * 8) * ld + kk * 16 + (i / 2) * 8));
        #pragma unroll
        for (int dt = 0; dt < D_TILES; dt += 2) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, smem_addr(b_tile + (kk * 16 + r + (i % 2) * 8) * LD_D + dt * 8 + (i / 2) * 8));
            mma_m16n8k16_bf16(acc[dt], a, b);
            mma_m16n8k16_bf16(acc[dt + 1], a, b + 2);
        }
    }
}

// P and dS of one warp's 16 query rows against BLOCK_N keys, from S and dP in registers, masked
// (keys past len_k; causal: keys past the row's diagonal). Returns them in s (P) and dp (dS).
__device__ __forceinline__ void softmax_gradient(float s[N_TILES][4], float dp[N_TILES][4], const float lse2[2],
                                                 const float dsum[2], float scale_log2, int q_row, int key0,
                                                 int len_k, int causal_limit_offset, bool causal, int lane) {
    const int group = lane / 4, quad = lane % 4;
    #pragma unroll
    for (int nt = 0; nt < N_TILES; ++nt) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int half = e / 2;
            const int row = q_row + group + half * 8, key = key0 + nt * 8 + 2 * quad + e % 2;
            const bool visible = key < len_k && (!causal || key <= row + causal_limit_offset);
            const float prob = visible ? exp2_approx(fmaf(s[nt][e], scale_log2, -lse2[half])) : 0.f;
            s[nt][e] = prob;
            dp[nt][e] = prob * (dp[nt][e] - dsum[half]);
        }
    }
}

// Stores a warp's 16 x BLOCK_N fragment as bf16 into rows row0.. of a [BLOCK_M][LD_N] tile.
__device__ __forceinline__ void store_fragment(bf16* tile, int row0, const float x[N_TILES][4], int lane) {
    const int group = lane / 4, quad = lane % 4;
    #pragma unroll
    for (int nt = 0; nt < N_TILES; ++nt) {
        *reinterpret_cast<uint32_t*>(tile + (row0 + group) * LD_N + nt * 8 + 2 * quad) = pack_bf16x2(x[nt][0], x[nt][1]);
        *reinterpret_cast<uint32_t*>(tile + (row0 + group + 8) * LD_N + nt * 8 + 2 * quad) =
            pack_bf16x2(x[nt][2], x[nt][3]);
    }
}

// Writes a warp's 16 x HEAD_DIM fp32 accumulator, times `factor`, as bf16 rows row0.. of a global
// tensor (rows at or past `count` are not written).
__device__ __forceinline__ void store_rows(bf16* dst, int64_t row_stride, int row0, int count,
                                           const float acc[D_TILES][4], float factor, int lane) {
    const int group = lane / 4, quad = lane % 4;
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = row0 + group + half * 8;
        if (row >= count) continue;
        #pragma unroll
        for (int dt = 0; dt < D_TILES; ++dt)
            *reinterpret_cast<uint32_t*>(dst + row * row_stride + dt * 8 + 2 * quad) =
                pack_bf16x2(acc[dt][2 * half] * factor, acc[dt][2 * half + 1] * factor);
    }
}

// accumulator[16 rows][HEAD_DIM] += a warp's dQ fragment, with one 16-byte reduction per n8 tile and
// thread. In the fragment, the quad's threads q and q ^ 1 hold columns 2q..2q+1 of rows `group` and
// `group + 8`; trading one pair, the even thread gets four consecutive columns of row group, the odd
// one four of row group + 8.
__device__ __forceinline__ void red_add_v4(float* addr, float a, float b, float c, float d) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(addr), "f"(a), "f"(b), "f"(c), "f"(d)
                 : "memory");
}

__device__ __forceinline__ void add_dq(float* acc, const float dq[D_TILES][4], int lane) {
    const int group = lane / 4, quad = lane % 4;
    const bool even = quad % 2 == 0;
    const int row = even ? group : group + 8, col = 2 * (quad & ~1);
    #pragma unroll
    for (int dt = 0; dt < D_TILES; ++dt) {
        // The even thread gives its row-(group + 8) pair, the odd one its row-group pair.
        const float give0 = even ? dq[dt][2] : dq[dt][0], give1 = even ? dq[dt][3] : dq[dt][1];
        const float got0 = __shfl_xor_sync(0xffffffffu, give0, 1), got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
        float* dst = acc + row * HEAD_DIM + dt * 8 + col;
        if (even)
            red_add_v4(dst, dq[dt][0], dq[dt][1], got0, got1);
        else
            red_add_v4(dst, got0, got1, dq[dt][2], dq[dt][3]);
    }
}

// The query rows of the CTA's keys: causal keys key0.. are seen from query key0 − (len_k − len_q) on.
__device__ __forceinline__ int first_query_block(int key0, int len_q, int len_k, bool causal) {
    if (!causal) return 0;
    const int first = key0 - (len_k - len_q);
    return first <= 0 ? 0 : first / BLOCK_M;
}

// --- 2. the main kernel: dK and dV of a key block, and dQ through atomics --------------------------------

__global__ void __launch_bounds__(NUM_THREADS) dkdv_kernel(const AttnBwdParams p) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = lane / 4, quad = lane % 4;
    const int key0 = blockIdx.x * BLOCK_N, kv_head = blockIdx.y, batch = blockIdx.z;
    const int keys = min(BLOCK_N, p.len_k - key0);
    const int rows = padded_rows(p.len_q);
    const int group_size = p.heads / p.kv_heads;
    const float scale_log2 = p.scale * LOG2E;
    const int offset = p.len_k - p.len_q;  // causal: query i sees keys j <= i + offset
    const bool causal = p.causal != 0;

    extern __shared__ __align__(128) unsigned char smem[];
    bf16* k_tile = reinterpret_cast<bf16*>(smem);
    bf16* v_tile = k_tile + 64 * LD_D;
    bf16* q_tile = v_tile + 64 * LD_D;
    bf16* do_tile = q_tile + 64 * LD_D;
    bf16* p_tile = do_tile + 64 * LD_D;
    bf16* ds_tile = p_tile + BLOCK_M * LD_N;

    const bf16* K = static_cast<const bf16*>(p.k) + batch * p.k_stride[0] + kv_head * p.k_stride[1] + key0 * p.k_stride[2];
    const bf16* V = static_cast<const bf16*>(p.v) + batch * p.v_stride[0] + kv_head * p.v_stride[1] + key0 * p.v_stride[2];
    load_rows(k_tile, K, p.k_stride[2], keys);
    load_rows(v_tile, V, p.v_stride[2], keys);

    float dk[D_TILES][4] = {}, dv[D_TILES][4] = {};
    const int first_block = first_query_block(key0, p.len_q, p.len_k, causal);
    const int query_blocks = rows / BLOCK_M;
    for (int head = kv_head * group_size; head < (kv_head + 1) * group_size; ++head) {
        const int64_t bh = (int64_t)batch * p.heads + head;
        const bf16* Q = static_cast<const bf16*>(p.q) + batch * p.q_stride[0] + head * p.q_stride[1];
        const bf16* dO = static_cast<const bf16*>(p.dout) + batch * p.dout_stride[0] + head * p.dout_stride[1];
        const float* dsum_row = p.row_stats + bh * rows;
        const float* lse2_row = p.row_stats + ((int64_t)p.batch * p.heads + bh) * rows;
        for (int block = first_block; block < query_blocks; ++block) {
            const int q0 = block * BLOCK_M;
            __syncthreads();  // the previous step's readers of the Q, dO, P and dS tiles are done
            load_rows(q_tile, Q + q0 * p.q_stride[2], p.q_stride[2], min(BLOCK_M, p.len_q - q0));
            load_rows(do_tile, dO + q0 * p.dout_stride[2], p.dout_stride[2], min(BLOCK_M, p.len_q - q0));
            __syncthreads();

            // S and dP for this warp's 16 query rows, then P and dS in place.
            const int q_row = q0 + warp * ROWS_PER_WARP;
            float s[N_TILES][4] = {}, dp[N_TILES][4] = {};
            gemm_rows_by_rows(s, q_tile, warp * ROWS_PER_WARP, k_tile, lane);
            gemm_rows_by_rows(dp, do_tile, warp * ROWS_PER_WARP, v_tile, lane);
            const float lse2[2] = {lse2_row[q_row + group], lse2_row[q_row + group + 8]};
            const float dsum[2] = {dsum_row[q_row + group], dsum_row[q_row + group + 8]};
            softmax_gradient(s, dp, lse2, dsum, scale_log2, q_row, key0, p.len_k, offset, causal, lane);
            store_fragment(p_tile, warp * ROWS_PER_WARP, s, lane);
            store_fragment(ds_tile, warp * ROWS_PER_WARP, dp, lane);
            __syncthreads();

            // This warp's 16 keys: dV += Pᵀ dO, dK += dSᵀ Q.
            gemm_into_head_dim<true>(dv, p_tile, LD_N, warp * ROWS_PER_WARP, do_tile, lane);
            gemm_into_head_dim<true>(dk, ds_tile, LD_N, warp * ROWS_PER_WARP, q_tile, lane);

            // This warp's 16 query rows: dQ += dS K, added into the fp32 accumulator.
            if (p.dq_accum && !p.deterministic) {
                float dq[D_TILES][4] = {};
                gemm_into_head_dim<false>(dq, ds_tile, LD_N, warp * ROWS_PER_WARP, k_tile, lane);
                add_dq(p.dq_accum + (bh * rows + q_row) * HEAD_DIM, dq, lane);
            }
        }
    }

    bf16* dK = static_cast<bf16*>(p.dk) + batch * p.dk_stride[0] + kv_head * p.dk_stride[1] + key0 * p.dk_stride[2];
    bf16* dV = static_cast<bf16*>(p.dv) + batch * p.dv_stride[0] + kv_head * p.dv_stride[1] + key0 * p.dv_stride[2];
    store_rows(dK, p.dk_stride[2], warp * ROWS_PER_WARP, keys, dk, p.scale, lane);
    store_rows(dV, p.dv_stride[2], warp * ROWS_PER_WARP, keys, dv, 1.f, lane);
}

// --- 3. postprocess: dQ = scale · accumulator --------------------------------------------------------

__global__ void __launch_bounds__(NUM_THREADS) dq_convert_kernel(const AttnBwdParams p) {
    const int row = blockIdx.x * PRE_ROWS + threadIdx.x / 16, part = threadIdx.x % 16;
    const int head = blockIdx.y, batch = blockIdx.z;
    if (row >= p.len_q) return;
    const int64_t bh = (int64_t)batch * p.heads + head;
    const float4* acc = reinterpret_cast<const float4*>(p.dq_accum + (bh * padded_rows(p.len_q) + row) * HEAD_DIM) + part * 2;
    const float4 a = acc[0], b = acc[1];
    const uint4 out = make_uint4(pack_bf16x2(a.x * p.scale, a.y * p.scale), pack_bf16x2(a.z * p.scale, a.w * p.scale),
                                 pack_bf16x2(b.x * p.scale, b.y * p.scale), pack_bf16x2(b.z * p.scale, b.w * p.scale));
    bf16* dq = static_cast<bf16*>(p.dq) + batch * p.dq_stride[0] + head * p.dq_stride[1] + row * p.dq_stride[2];
    *reinterpret_cast<uint4*>(dq + part * 8) = out;
}

// --- 4. deterministic mode: dQ of a query block, the key blocks summed in order -------------------------

__global__ void __launch_bounds__(NUM_THREADS) dq_kernel(const AttnBwdParams p) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = lane / 4;
    const int q0 = blockIdx.x * BLOCK_M, head = blockIdx.y, batch = blockIdx.z;
    const int kv_head = head / (p.heads / p.kv_heads);
    const int rows = padded_rows(p.len_q);
    const int64_t bh = (int64_t)batch * p.heads + head;
    const float scale_log2 = p.scale * LOG2E;
    const int offset = p.len_k - p.len_q;
    const bool causal = p.causal != 0;

    extern __shared__ __align__(128) unsigned char smem[];
    bf16* k_tile = reinterpret_cast<bf16*>(smem);
    bf16* v_tile = k_tile + 64 * LD_D;
    bf16* q_tile = v_tile + 64 * LD_D;
    bf16* do_tile = q_tile + 64 * LD_D;
    bf16* ds_tile = do_tile + 64 * LD_D + BLOCK_M * LD_N;  // where the main kernel keeps dS

    const bf16* Q = static_cast<const bf16*>(p.q) + batch * p.q_stride[0] + head * p.q_stride[1] + q0 * p.q_stride[2];
    const bf16* dO = static_cast<const bf16*>(p.dout) + batch * p.dout_stride[0] + head * p.dout_stride[1] +
                     q0 * p.dout_stride[2];
    load_rows(q_tile, Q, p.q_stride[2], min(BLOCK_M, p.len_q - q0));
    load_rows(do_tile, dO, p.dout_stride[2], min(BLOCK_M, p.len_q - q0));
    const int q_row = q0 + warp * ROWS_PER_WARP;
    const float* lse2_row = p.row_stats + ((int64_t)p.batch * p.heads + bh) * rows;
    const float lse2[2] = {lse2_row[q_row + group], lse2_row[q_row + group + 8]};
    const float dsum[2] = {p.row_stats[bh * rows + q_row + group], p.row_stats[bh * rows + q_row + group + 8]};

    // Causal: the last key any row of this block sees is q0 + BLOCK_M − 1 + offset.
    const int key_end = causal ? min(p.len_k, max(0, q0 + BLOCK_M + offset)) : p.len_k;
    const bf16* K = static_cast<const bf16*>(p.k) + batch * p.k_stride[0] + kv_head * p.k_stride[1];
    const bf16* V = static_cast<const bf16*>(p.v) + batch * p.v_stride[0] + kv_head * p.v_stride[1];
    float dq[D_TILES][4] = {};
    for (int key0 = 0; key0 < key_end; key0 += BLOCK_N) {
        __syncthreads();  // the previous step's readers of K, V and dS are done
        load_rows(k_tile, K + key0 * p.k_stride[2], p.k_stride[2], min(BLOCK_N, p.len_k - key0));
        load_rows(v_tile, V + key0 * p.v_stride[2], p.v_stride[2], min(BLOCK_N, p.len_k - key0));
        __syncthreads();
        float s[N_TILES][4] = {}, dp[N_TILES][4] = {};
        gemm_rows_by_rows(s, q_tile, warp * ROWS_PER_WARP, k_tile, lane);
        gemm_rows_by_rows(dp, do_tile, warp * ROWS_PER_WARP, v_tile, lane);
        softmax_gradient(s, dp, lse2, dsum, scale_log2, q_row, key0, p.len_k, offset, causal, lane);
        store_fragment(ds_tile, warp * ROWS_PER_WARP, dp, lane);
        __syncwarp();  // each warp reads back only its own 16 rows of dS
        gemm_into_head_dim<false>(dq, ds_tile, LD_N, warp * ROWS_PER_WARP, k_tile, lane);
    }
    bf16* dQ = static_cast<bf16*>(p.dq) + batch * p.dq_stride[0] + head * p.dq_stride[1] + q0 * p.dq_stride[2];
    store_rows(dQ, p.dq_stride[2], warp * ROWS_PER_WARP, p.len_q - q0, dq, p.scale, lane);
}

// --- the host side ---------------------------------------------------------------------------------

HOPATTN_EXPORT int hopattn_backward_workspace(const AttnBwdParams* p, int64_t* row_stats_floats,
                                              int64_t* dq_accum_floats) {
    const int64_t rows = (int64_t)(p->len_q + BLOCK_M - 1) / BLOCK_M * BLOCK_M;
    *row_stats_floats = 2 * (int64_t)p->batch * p->heads * rows;
    *dq_accum_floats = p->deterministic ? 0 : (int64_t)p->batch * p->heads * rows * HEAD_DIM;
    return 0;
}

HOPATTN_EXPORT int hopattn_backward_launch(const AttnBwdParams* p, cudaStream_t stream, char* err, int errlen) {
    if (p->head_dim != HEAD_DIM || p->len_q <= 0 || p->len_k <= 0 || p->kv_heads <= 0 || p->heads % p->kv_heads ||
        !p->row_stats || (!p->deterministic && !p->dq_accum)) {
        snprintf(err, errlen, "backward stage needs head_dim %d, len_q and len_k > 0, heads a multiple of kv_heads, "
                 "and its workspace", HEAD_DIM);
        return 1;
    }
    HOPATTN_CHECK(cudaFuncSetAttribute(dkdv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES), err,
                  errlen);
    const int rows = (p->len_q + BLOCK_M - 1) / BLOCK_M * BLOCK_M;
    preprocess_kernel<<<dim3(rows / PRE_ROWS, p->heads, p->batch), NUM_THREADS, 0, stream>>>(*p);
    HOPATTN_CHECK(cudaGetLastError(), err, errlen);
    dkdv_kernel<<<dim3((p->len_k + BLOCK_N - 1) / BLOCK_N, p->kv_heads, p->batch), NUM_THREADS, SMEM_BYTES, stream>>>(*p);
    HOPATTN_CHECK(cudaGetLastError(), err, errlen);
    if (p->deterministic) {
        HOPATTN_CHECK(cudaFuncSetAttribute(dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES), err,
                      errlen);
        dq_kernel<<<dim3(rows / BLOCK_M, p->heads, p->batch), NUM_THREADS, SMEM_BYTES, stream>>>(*p);
    } else {
        dq_convert_kernel<<<dim3((p->len_q + PRE_ROWS - 1) / PRE_ROWS, p->heads, p->batch), NUM_THREADS, 0, stream>>>(*p);
    }
    HOPATTN_CHECK(cudaGetLastError(), err, errlen);
    return 0;
}

HOPATTN_EXPORT int hopattn_describe(KernelInfo* info, char* err, int errlen) {
    return describe_kernel(dkdv_kernel, NUM_THREADS, SMEM_BYTES, BLOCK_M, BLOCK_N, info, err, errlen);
}
