// Stage 06 — softmax arithmetic.
//
// With the loads off the critical path, the softmax between the two GEMMs is what the tensor
// cores wait for. Four changes shrink it without changing the result beyond rounding:
// - exp2 instead of exp, with the scale and log2(e) folded into one constant, so each score costs
//   one FFMA and one MUFU.EX2 (expf costs a multiply, range reduction and the EX2);
// - the row sum is kept per thread and reduced across the quad once, after the loop, instead of
//   two shuffles per row per tile;
// - two floats become a bf16x2 register with one cvt.rn.bf16x2.f32 instead of two conversions
//   and a shift-and-or;
// - O and the row sums are rescaled only when a row maximum grows by more than 2^8, not on every
//   tile: after the first tiles the maximum rarely moves that much, and 128 FMULs per thread and
//   tile disappear.
#include <cuda_bf16.h>

#include "../common/abi.h"
#include "../common/cp_async.cuh"
#include "../common/ldmatrix.cuh"
#include "../common/mma_sm80.cuh"
#include "../common/trace.cuh"

constexpr int HEAD_DIM = 128;
constexpr int BLOCK_M = 128;  // query rows per CTA: one warp per 32 rows
constexpr int BLOCK_N = 64;  // key/value rows per iteration
constexpr int NUM_THREADS = 128;
constexpr int ROWS_PER_WARP = 32;
constexpr int M_TILES = ROWS_PER_WARP / 16;  // 16-row MMA tiles per warp
constexpr int KV_STAGES = 2;  // K/V buffers: one being computed on, one being filled
constexpr int SMEM_BYTES = (BLOCK_M + KV_STAGES * 2 * BLOCK_N) * HEAD_DIM * 2;  // Q, K and V tiles, bf16

constexpr int K_STEPS = HEAD_DIM / 16;  // k-steps of the QKᵀ product
constexpr int S_TILES = BLOCK_N / 8;    // n8 tiles of one S row block
constexpr int O_TILES = HEAD_DIM / 8;   // n8 tiles of one O row block
constexpr int PV_STEPS = BLOCK_N / 16;  // k-steps of the PV product
constexpr float RESCALE_THRESHOLD = 8.f;  // log2 of the growth tolerated before rescaling

using bf16 = __nv_bfloat16;

// Where column `col` (a multiple of 8) of tile row `row` lives: its 16-byte chunk XOR (row % 8).
__device__ __forceinline__ int swizzle(int row, int col) {
    return (((col / 8) ^ (row % 8)) * 8) | (col % 8);
}

// Start copying ROWS rows of Q, K or V into shared memory: each thread issues 16-byte cp.async
// copies, consecutive threads taking consecutive 16-byte pieces of a row (coalesced).
template <int ROWS>
__device__ __forceinline__ void load_tile(bf16 (*tile)[HEAD_DIM], const bf16* src, int64_t row_stride) {
    constexpr int CHUNKS_PER_ROW = HEAD_DIM / 8;
    #pragma unroll
    for (int i = threadIdx.x; i < ROWS * CHUNKS_PER_ROW; i += NUM_THREADS) {
        const int row = i / CHUNKS_PER_ROW, col = (i % CHUNKS_PER_ROW) * 8;
        cp_async_16(smem_addr(&tile[row][swizzle(row, col)]), src + row * row_stride + col);
    }
}

// Two floats rounded into one bf16x2 register (one cvt instruction); `lo` goes to the lower half.
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

__global__ void __launch_bounds__(NUM_THREADS) attention_kernel(const AttnParams p) {
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int group = lane / 4;  // fragment row within the 8-row half
    const int quad = lane % 4;   // fragment column pair
    const int batch = blockIdx.z, head = blockIdx.y;
    const int q_row0 = blockIdx.x * BLOCK_M + warp * ROWS_PER_WARP;
    const int lm_row = lane % 8, lm_matrix = lane / 8;  // the row address this lane gives ldmatrix
    TRACE_INIT();

    const bf16* Q = static_cast<const bf16*>(p.q) + batch * p.q_stride[0] + head * p.q_stride[1];
    const bf16* K = static_cast<const bf16*>(p.k) + batch * p.k_stride[0] + head * p.k_stride[1];
    const bf16* V = static_cast<const bf16*>(p.v) + batch * p.v_stride[0] + head * p.v_stride[1];
    bf16* O = static_cast<bf16*>(p.o) + batch * p.o_stride[0] + head * p.o_stride[1];

    // 96 KB: more than a static __shared__ array may hold.
    extern __shared__ __align__(128) unsigned char smem[];
    auto q_tile = reinterpret_cast<bf16 (*)[HEAD_DIM]>(smem);
    auto k_tiles = reinterpret_cast<bf16 (*)[BLOCK_N][HEAD_DIM]>(q_tile + BLOCK_M);
    auto v_tiles = k_tiles + KV_STAGES;
    load_tile<BLOCK_M>(q_tile, Q + blockIdx.x * BLOCK_M * p.q_stride[2], p.q_stride[2]);
    TRACE_MARK(load_q, 0, -1);

    // Per thread: 128 fp32 registers of O, 64 of S. Q fragments would need 64 more, so they are
    // reloaded for every k-step instead of being kept for the whole loop.
    float o_acc[M_TILES][O_TILES][4] = {};
    float row_max[M_TILES][2];       // rows group and group + 8 of each MMA tile, unscaled scores
    float row_sum[M_TILES][2] = {};  // this thread's share; the quad is summed after the loop
    #pragma unroll
    for (int m = 0; m < M_TILES; ++m) row_max[m][0] = row_max[m][1] = -INFINITY;
    // exp(scale * (s - m)) = 2^(s * scale_log2 - m * scale_log2): one FFMA feeds each EX2.
    const float scale_log2 = p.scale * 1.4426950408889634f;

    const int num_tiles = p.len_k / BLOCK_N;
    load_tile<BLOCK_N>(k_tiles[0], K, p.k_stride[2]);
    load_tile<BLOCK_N>(v_tiles[0], V, p.v_stride[2]);
    TRACE_MARK(load_kv, 0, 0);
    cp_async_commit();  // Q and the first K/V tiles form the first group

    for (int tile = 0; tile < num_tiles; ++tile) {
        // Prefetch tile + 1 into the other buffer; the barrier at the end of the previous
        // iteration guarantees that no warp still reads it.
        if (tile + 1 < num_tiles) {
            const int next = (tile + 1) % KV_STAGES;
            load_tile<BLOCK_N>(k_tiles[next], K + (tile + 1) * BLOCK_N * p.k_stride[2], p.k_stride[2]);
            load_tile<BLOCK_N>(v_tiles[next], V + (tile + 1) * BLOCK_N * p.v_stride[2], p.v_stride[2]);
            TRACE_MARK(load_kv, 0, tile + 1);
        }
        cp_async_commit();   // possibly empty, so that "all but the newest group" is always tile
        TRACE_BEGIN(wait_kv);
        cp_async_wait<1>();  // this thread's copies of tile have landed...
        __syncthreads();     // ...and so have everyone else's
        TRACE_END(wait_kv, 0, tile);
        bf16 (*k_tile)[HEAD_DIM] = k_tiles[tile % KV_STAGES];
        bf16 (*v_tile)[HEAD_DIM] = v_tiles[tile % KV_STAGES];

        // S = Q Kᵀ for 32 x BLOCK_N. A fragments are Q rows; B[k][n] = K[n][k], so a K row holds
        // a B fragment's column.
        TRACE_BEGIN(qk);
        float s[M_TILES][S_TILES][4] = {};
        #pragma unroll 1  // unrolling would let the compiler hoist too many loads: registers run out
        for (int kk = 0; kk < K_STEPS; ++kk) {
            // A fragment = the four 8x8 quarters of a 16x16 block of Q: rows +0/+8, columns +0/+8.
            uint32_t q_frag[M_TILES][4];
            #pragma unroll
            for (int m = 0; m < M_TILES; ++m) {
                const int row = warp * ROWS_PER_WARP + m * 16 + (lm_matrix % 2) * 8 + lm_row;
                ldmatrix_x4(q_frag[m], smem_addr(&q_tile[row][swizzle(row, kk * 16 + (lm_matrix / 2) * 8)]));
            }
            // K rows are ldmatrix rows; one x4 brings the B fragments of two n8 tiles.
            #pragma unroll
            for (int n = 0; n < S_TILES; n += 2) {
                uint32_t b[4];
                const int row = (n + lm_matrix / 2) * 8 + lm_row;
                ldmatrix_x4(b, smem_addr(&k_tile[row][swizzle(row, kk * 16 + (lm_matrix % 2) * 8)]));
                #pragma unroll
                for (int m = 0; m < M_TILES; ++m) {
                    mma_m16n8k16_bf16(s[m][n], q_frag[m], &b[0]);
                    mma_m16n8k16_bf16(s[m][n + 1], q_frag[m], &b[2]);
                }
            }
        }
        TRACE_END(qk, 0, tile);

        // Online softmax. The running max only moves (and O and the sums are only rescaled) when
        // some row's max grew by more than 2^8 in exp2 units; otherwise P is computed against the
        // stale max, stays below 2^8 and the final division cancels the difference exactly.
        TRACE_BEGIN(softmax);
        float tile_max[M_TILES][2];
        bool grew = false;
        #pragma unroll
        for (int m = 0; m < M_TILES; ++m)
        #pragma unroll
        for (int half = 0; half < 2; ++half) {
            float x = -INFINITY;
            #pragma unroll
            for (int n = 0; n < S_TILES; ++n) x = fmaxf(x, fmaxf(s[m][n][2 * half], s[m][n][2 * half + 1]));
            tile_max[m][half] = quad_max(x);
            grew |= (tile_max[m][half] - row_max[m][half]) * scale_log2 > RESCALE_THRESHOLD;
        }
        if (__any_sync(0xffffffffu, grew)) {  // warp-uniform: every lane takes the same path
            TRACE_BEGIN(rescale);
            #pragma unroll
            for (int m = 0; m < M_TILES; ++m)
            #pragma unroll
            for (int half = 0; half < 2; ++half) {
                const float new_max = fmaxf(row_max[m][half], tile_max[m][half]);
                const float correction = exp2_approx((row_max[m][half] - new_max) * scale_log2);
                row_max[m][half] = new_max;
                row_sum[m][half] *= correction;
                #pragma unroll
                for (int d = 0; d < O_TILES; ++d) {
                    o_acc[m][d][2 * half] *= correction;
                    o_acc[m][d][2 * half + 1] *= correction;
                }
            }
            TRACE_END(rescale, 0, tile);
        }
        #pragma unroll
        for (int m = 0; m < M_TILES; ++m)
        #pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float max_scaled = row_max[m][half] * scale_log2;
            #pragma unroll
            for (int n = 0; n < S_TILES; ++n) {
                s[m][n][2 * half] = exp2_approx(fmaf(s[m][n][2 * half], scale_log2, -max_scaled));
                s[m][n][2 * half + 1] = exp2_approx(fmaf(s[m][n][2 * half + 1], scale_log2, -max_scaled));
                row_sum[m][half] += s[m][n][2 * half] + s[m][n][2 * half + 1];
            }
        }
        TRACE_END(softmax, 0, tile);

        // O += P V. The S accumulators of n-tiles 2j and 2j+1 are exactly the A fragment of k-step j.
        TRACE_BEGIN(pv);
        #pragma unroll
        for (int j = 0; j < PV_STEPS; ++j) {
            uint32_t p_frag[M_TILES][4];
            #pragma unroll
            for (int m = 0; m < M_TILES; ++m) {
                p_frag[m][0] = pack_bf16x2(s[m][2 * j][0], s[m][2 * j][1]);
                p_frag[m][1] = pack_bf16x2(s[m][2 * j][2], s[m][2 * j][3]);
                p_frag[m][2] = pack_bf16x2(s[m][2 * j + 1][0], s[m][2 * j + 1][1]);
                p_frag[m][3] = pack_bf16x2(s[m][2 * j + 1][2], s[m][2 * j + 1][3]);
            }
            // B[k][n] = V[k][n]: a fragment holds a column of V, so ldmatrix.trans transposes 8x8
            // blocks of V rows on the way; one x4 brings the B fragments of two n8 tiles.
            #pragma unroll
            for (int d = 0; d < O_TILES; d += 2) {
                uint32_t b[4];
                const int row = j * 16 + (lm_matrix % 2) * 8 + lm_row;
                ldmatrix_x4_trans(b, smem_addr(&v_tile[row][swizzle(row, (d + lm_matrix / 2) * 8)]));
                #pragma unroll
                for (int m = 0; m < M_TILES; ++m) {
                    mma_m16n8k16_bf16(o_acc[m][d], p_frag[m], &b[0]);
                    mma_m16n8k16_bf16(o_acc[m][d + 1], p_frag[m], &b[2]);
                }
            }
        }
        TRACE_END(pv, 0, tile);
        TRACE_BEGIN(wait_empty);
        __syncthreads();  // every warp is done with this buffer before it is refilled
        TRACE_END(wait_empty, 0, tile);
    }

    // Epilogue: finish the row sums across the quad, divide, convert, write two columns per store.
    TRACE_BEGIN(epilogue);
    #pragma unroll
    for (int m = 0; m < M_TILES; ++m) {
        const float inv_sum[2] = {1.f / quad_sum(row_sum[m][0]), 1.f / quad_sum(row_sum[m][1])};
        #pragma unroll
        for (int d = 0; d < O_TILES; ++d) {
            #pragma unroll
            for (int half = 0; half < 2; ++half) {
                bf16* out = O + (q_row0 + m * 16 + group + 8 * half) * p.o_stride[2] + d * 8 + quad * 2;
                *reinterpret_cast<uint32_t*>(out) =
                    pack_bf16x2(o_acc[m][d][2 * half] * inv_sum[half], o_acc[m][d][2 * half + 1] * inv_sum[half]);
            }
        }
    }
    TRACE_END(epilogue, 0, -1);
}

HOPATTN_EXPORT int hopattn_launch(const AttnParams* p, cudaStream_t stream, char* err, int errlen) {
    if (p->head_dim != HEAD_DIM || p->len_q % BLOCK_M || p->len_k % BLOCK_N || p->causal) {
        snprintf(err, errlen, "stage needs head_dim %d, len_q %% %d == 0, len_k %% %d == 0, non-causal",
                 HEAD_DIM, BLOCK_M, BLOCK_N);
        return 1;
    }
    HOPATTN_CHECK(cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES),
                  err, errlen);
    const dim3 grid(p->len_q / BLOCK_M, p->heads, p->batch);
    attention_kernel<<<grid, NUM_THREADS, SMEM_BYTES, stream>>>(*p);
    HOPATTN_CHECK(cudaGetLastError(), err, errlen);
    return 0;
}

HOPATTN_EXPORT int hopattn_describe(KernelInfo* info, char* err, int errlen) {
    return describe_kernel(attention_kernel, NUM_THREADS, SMEM_BYTES, BLOCK_M, BLOCK_N, info, err, errlen);
}
