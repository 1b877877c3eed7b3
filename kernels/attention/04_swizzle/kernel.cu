// Stage 04 — swizzle.
//
// A tile row is 256 bytes, a multiple of the 128 bytes that the 32 shared-memory banks span, so
// the 8 rows that one ldmatrix matrix reads all start in the same bank: an 8-way bank conflict on
// every ldmatrix. Storing 16-byte chunk c of row r at chunk c ^ (r % 8) spreads any 8 consecutive
// rows over all 32 banks; writers and readers apply the same XOR, so the data is unchanged.
#include <cuda_bf16.h>

#include "../common/abi.h"
#include "../common/ldmatrix.cuh"
#include "../common/mma_sm80.cuh"
#include "../common/trace.cuh"

constexpr int HEAD_DIM = 128;
constexpr int BLOCK_M = 128;  // query rows per CTA: one warp per 32 rows
constexpr int BLOCK_N = 64;  // key/value rows per iteration
constexpr int NUM_THREADS = 128;
constexpr int ROWS_PER_WARP = 32;
constexpr int M_TILES = ROWS_PER_WARP / 16;  // 16-row MMA tiles per warp
constexpr int SMEM_BYTES = (BLOCK_M + 2 * BLOCK_N) * HEAD_DIM * 2;  // Q, K and V tiles, bf16

constexpr int K_STEPS = HEAD_DIM / 16;  // k-steps of the QKᵀ product
constexpr int S_TILES = BLOCK_N / 8;    // n8 tiles of one S row block
constexpr int O_TILES = HEAD_DIM / 8;   // n8 tiles of one O row block
constexpr int PV_STEPS = BLOCK_N / 16;  // k-steps of the PV product

using bf16 = __nv_bfloat16;

// Where column `col` (a multiple of 8) of tile row `row` lives: its 16-byte chunk XOR (row % 8).
__device__ __forceinline__ int swizzle(int row, int col) {
    return (((col / 8) ^ (row % 8)) * 8) | (col % 8);
}

// Copy ROWS rows of Q, K or V into shared memory: each thread moves 16 bytes at a time, and
// consecutive threads take consecutive 16-byte pieces of a row, so every warp load is coalesced.
template <int ROWS>
__device__ __forceinline__ void load_tile(bf16 (*tile)[HEAD_DIM], const bf16* src, int64_t row_stride) {
    constexpr int CHUNKS_PER_ROW = HEAD_DIM / 8;
    #pragma unroll
    for (int i = threadIdx.x; i < ROWS * CHUNKS_PER_ROW; i += NUM_THREADS) {
        const int row = i / CHUNKS_PER_ROW, col = (i % CHUNKS_PER_ROW) * 8;
        *reinterpret_cast<uint4*>(&tile[row][swizzle(row, col)]) = *reinterpret_cast<const uint4*>(src + row * row_stride + col);
    }
}

// Two bf16 values in one register; the lower address goes to the lower half.
__device__ __forceinline__ uint32_t pack_bf16(bf16 lo, bf16 hi) {
    return static_cast<uint32_t>(__bfloat16_as_ushort(lo)) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16);
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

    // 64 KB: more than a static __shared__ array may hold.
    extern __shared__ __align__(128) unsigned char smem[];
    auto q_tile = reinterpret_cast<bf16 (*)[HEAD_DIM]>(smem);
    auto k_tile = q_tile + BLOCK_M;
    auto v_tile = k_tile + BLOCK_N;
    TRACE_BEGIN(load_q);
    load_tile<BLOCK_M>(q_tile, Q + blockIdx.x * BLOCK_M * p.q_stride[2], p.q_stride[2]);
    TRACE_END(load_q, 0, -1);

    // Per thread: 128 fp32 registers of O, 64 of S. Q fragments would need 64 more, so they are
    // reloaded for every k-step instead of being kept for the whole loop.
    float o_acc[M_TILES][O_TILES][4] = {};
    float row_max[M_TILES][2];  // rows group and group + 8 of each MMA tile
    float row_sum[M_TILES][2] = {};
    #pragma unroll
    for (int m = 0; m < M_TILES; ++m) row_max[m][0] = row_max[m][1] = -INFINITY;

    for (int kv0 = 0; kv0 < p.len_k; kv0 += BLOCK_N) {
        TRACE_BEGIN(wait_empty);
        __syncthreads();  // every warp is done with the previous tiles
        TRACE_END(wait_empty, 0, kv0 / BLOCK_N);
        TRACE_BEGIN(load_kv);
        load_tile<BLOCK_N>(k_tile, K + kv0 * p.k_stride[2], p.k_stride[2]);
        load_tile<BLOCK_N>(v_tile, V + kv0 * p.v_stride[2], p.v_stride[2]);
        TRACE_END(load_kv, 0, kv0 / BLOCK_N);
        TRACE_BEGIN(wait_kv);
        __syncthreads();  // the tiles (and, the first time, Q) are complete
        TRACE_END(wait_kv, 0, kv0 / BLOCK_N);

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
        TRACE_END(qk, 0, kv0 / BLOCK_N);

        // Online softmax: new running max, rescale what was accumulated, exponentiate.
        TRACE_BEGIN(softmax);
        #pragma unroll
        for (int m = 0; m < M_TILES; ++m)
        #pragma unroll
        for (int half = 0; half < 2; ++half) {
            float tile_max = -INFINITY;
            #pragma unroll
            for (int n = 0; n < S_TILES; ++n) {
                s[m][n][2 * half] *= p.scale;
                s[m][n][2 * half + 1] *= p.scale;
                tile_max = fmaxf(tile_max, fmaxf(s[m][n][2 * half], s[m][n][2 * half + 1]));
            }
            const float new_max = fmaxf(row_max[m][half], quad_max(tile_max));
            const float correction = expf(row_max[m][half] - new_max);
            row_max[m][half] = new_max;
            float tile_sum = 0.f;
            #pragma unroll
            for (int n = 0; n < S_TILES; ++n) {
                s[m][n][2 * half] = expf(s[m][n][2 * half] - new_max);
                s[m][n][2 * half + 1] = expf(s[m][n][2 * half + 1] - new_max);
                tile_sum += s[m][n][2 * half] + s[m][n][2 * half + 1];
            }
            row_sum[m][half] = row_sum[m][half] * correction + quad_sum(tile_sum);
            #pragma unroll
            for (int d = 0; d < O_TILES; ++d) {
                o_acc[m][d][2 * half] *= correction;
                o_acc[m][d][2 * half + 1] *= correction;
            }
        }
        TRACE_END(softmax, 0, kv0 / BLOCK_N);

        // O += P V. The S accumulators of n-tiles 2j and 2j+1 are exactly the A fragment of k-step j.
        TRACE_BEGIN(pv);
        #pragma unroll
        for (int j = 0; j < PV_STEPS; ++j) {
            uint32_t p_frag[M_TILES][4];
            #pragma unroll
            for (int m = 0; m < M_TILES; ++m) {
                p_frag[m][0] = pack_bf16(__float2bfloat16(s[m][2 * j][0]), __float2bfloat16(s[m][2 * j][1]));
                p_frag[m][1] = pack_bf16(__float2bfloat16(s[m][2 * j][2]), __float2bfloat16(s[m][2 * j][3]));
                p_frag[m][2] = pack_bf16(__float2bfloat16(s[m][2 * j + 1][0]), __float2bfloat16(s[m][2 * j + 1][1]));
                p_frag[m][3] = pack_bf16(__float2bfloat16(s[m][2 * j + 1][2]), __float2bfloat16(s[m][2 * j + 1][3]));
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
        TRACE_END(pv, 0, kv0 / BLOCK_N);
    }

    // Epilogue: divide by the row sums, convert to bf16, write two columns per store.
    TRACE_BEGIN(epilogue);
    #pragma unroll
    for (int m = 0; m < M_TILES; ++m) {
        const float inv_sum[2] = {1.f / row_sum[m][0], 1.f / row_sum[m][1]};
        #pragma unroll
        for (int d = 0; d < O_TILES; ++d) {
            #pragma unroll
            for (int half = 0; half < 2; ++half) {
                bf16* out = O + (q_row0 + m * 16 + group + 8 * half) * p.o_stride[2] + d * 8 + quad * 2;
                *reinterpret_cast<uint32_t*>(out) =
                    pack_bf16(__float2bfloat16(o_acc[m][d][2 * half] * inv_sum[half]),
                              __float2bfloat16(o_acc[m][d][2 * half + 1] * inv_sum[half]));
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
