// Stage 06 — softmax arithmetic.
//
// With the loads off the critical path, the softmax between the two GEMMs is what the tensor
// cores wait for. Three changes shrink it without changing the result beyond rounding:
// - exp2 instead of exp, with the scale and log2(e) folded into one constant, so each score costs
//   one FFMA and one MUFU.EX2 (expf costs a multiply, range reduction and the EX2);
// - the row sum is kept per thread and reduced across the quad once, after the loop, instead of
//   two shuffles per row per tile;
// - two floats become a bf16x2 register with one cvt.rn.bf16x2.f32 instead of two conversions
//   and a shift-and-or.
#include <cuda_bf16.h>

#include "/work/main/kernels/attention/common/abi.h"
#include "/work/main/kernels/attention/common/cp_async.cuh"
#include "/work/main/kernels/attention/common/ldmatrix.cuh"
#include "/work/main/kernels/attention/common/mma_sm80.cuh"

constexpr int HEAD_DIM = 128;
constexpr int BLOCK_M = 128;
constexpr int BLOCK_N = 64;  // key/value rows per iteration
constexpr int NUM_THREADS = 128;
constexpr int ROWS_PER_WARP = 32;
constexpr int M_TILES = 2;
constexpr int KV_STAGES = 2;  // K/V buffers: one being computed on, one being filled
constexpr int SMEM_BYTES = KV_STAGES * 2 * BLOCK_N * HEAD_DIM * 2;  // K and V tiles, bf16

constexpr int K_STEPS = HEAD_DIM / 16;  // k-steps of the QKᵀ product
constexpr int S_TILES = BLOCK_N / 8;    // n8 tiles of one S row block
constexpr int O_TILES = HEAD_DIM / 8;   // n8 tiles of one O row block
constexpr int PV_STEPS = BLOCK_N / 16;  // k-steps of the PV product

using bf16 = __nv_bfloat16;

__device__ __forceinline__ uint32_t load_u32(const bf16* ptr) {
    return *reinterpret_cast<const uint32_t*>(ptr);
}

// Where column `col` (a multiple of 8) of tile row `row` lives: its 16-byte chunk XOR (row % 8).
__device__ __forceinline__ int swizzle(int row, int col) {
    return (((col / 8) ^ (row % 8)) * 8) | (col % 8);
}

// Start copying BLOCK_N rows of K or V into shared memory: each thread issues 16-byte cp.async
// copies, consecutive threads taking consecutive 16-byte pieces of a row (coalesced).
__device__ __forceinline__ void load_tile(bf16 (*tile)[HEAD_DIM], const bf16* src, int64_t row_stride) {
    constexpr int CHUNKS_PER_ROW = HEAD_DIM / 8;
    #pragma unroll
    for (int i = threadIdx.x; i < BLOCK_N * CHUNKS_PER_ROW; i += NUM_THREADS) {
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

    const bf16* Q = static_cast<const bf16*>(p.q) + batch * p.q_stride[0] + head * p.q_stride[1];
    const bf16* K = static_cast<const bf16*>(p.k) + batch * p.k_stride[0] + head * p.k_stride[1];
    const bf16* V = static_cast<const bf16*>(p.v) + batch * p.v_stride[0] + head * p.v_stride[1];
    bf16* O = static_cast<bf16*>(p.o) + batch * p.o_stride[0] + head * p.o_stride[1];

    // Q fragments (A operand of QKᵀ) stay in registers for the whole KV loop.
    uint32_t q_frag[M_TILES][K_STEPS][4];
    #pragma unroll
    for (int m = 0; m < M_TILES; ++m)
    #pragma unroll
    for (int kk = 0; kk < K_STEPS; ++kk) {
        const bf16* top = Q + (q_row0 + m * 16 + group) * p.q_stride[2] + kk * 16 + quad * 2;
        const bf16* bottom = top + 8 * p.q_stride[2];
        q_frag[m][kk][0] = load_u32(top);
        q_frag[m][kk][1] = load_u32(bottom);
        q_frag[m][kk][2] = load_u32(top + 8);
        q_frag[m][kk][3] = load_u32(bottom + 8);
    }

    extern __shared__ __align__(128) unsigned char smem[];  // 64 KB: more than a static array may hold
    auto k_tiles = reinterpret_cast<bf16 (*)[BLOCK_N][HEAD_DIM]>(smem);
    auto v_tiles = k_tiles + KV_STAGES;

    float o_acc[M_TILES][O_TILES][4] = {};
    float row_max[M_TILES][2];
    float row_sum[M_TILES][2] = {};
    #pragma unroll
    for (int m = 0; m < M_TILES; ++m) row_max[m][0] = row_max[m][1] = -INFINITY;
    // exp(scale * (s - m)) = 2^(s * scale_log2 - m * scale_log2): one FFMA feeds each EX2.
    const float scale_log2 = p.scale * 1.4426950408889634f;

    const int num_tiles = p.len_k / BLOCK_N;
    load_tile(k_tiles[0], K, p.k_stride[2]);
    load_tile(v_tiles[0], V, p.v_stride[2]);
    cp_async_commit();

    for (int tile = 0; tile < num_tiles; ++tile) {
        // Prefetch tile + 1 into the other buffer; the barrier at the end of the previous
        // iteration guarantees that no warp still reads it.
        if (tile + 1 < num_tiles) {
            const int next = (tile + 1) % KV_STAGES;
            load_tile(k_tiles[next], K + (tile + 1) * BLOCK_N * p.k_stride[2], p.k_stride[2]);
            load_tile(v_tiles[next], V + (tile + 1) * BLOCK_N * p.v_stride[2], p.v_stride[2]);
        }
        cp_async_commit();  // possibly empty, so that "all but the newest group" is always tile
        cp_async_wait<1>();  // this thread's copies of tile have landed...
        __syncthreads();     // ...and so have everyone else's
        bf16 (*k_tile)[HEAD_DIM] = k_tiles[tile % KV_STAGES];
        bf16 (*v_tile)[HEAD_DIM] = v_tiles[tile % KV_STAGES];

        // S = Q Kᵀ for 16 x BLOCK_N. B[k][n] = K[n][k]: a K row holds a fragment's column, so
        // K rows are ldmatrix rows; one x4 brings the B fragments of two n8 tiles for one k-step.
        float s[M_TILES][S_TILES][4] = {};
        #pragma unroll
        for (int n = 0; n < S_TILES; n += 2) {
            #pragma unroll
            for (int kk = 0; kk < K_STEPS; ++kk) {
                uint32_t b[4];
                const int row = (n + lm_matrix / 2) * 8 + lm_row;
                ldmatrix_x4(b, smem_addr(&k_tile[row][swizzle(row, kk * 16 + (lm_matrix % 2) * 8)]));
                #pragma unroll
                for (int m = 0; m < M_TILES; ++m) {
                    mma_m16n8k16_bf16(s[m][n], q_frag[m][kk], &b[0]);
                    mma_m16n8k16_bf16(s[m][n + 1], q_frag[m][kk], &b[2]);
                }
            }
        }

        // Online softmax: new running max, rescale what was accumulated, exponentiate.
        #pragma unroll
        for (int m = 0; m < M_TILES; ++m)
        #pragma unroll
        for (int half = 0; half < 2; ++half) {
            float tile_max = -INFINITY;
            #pragma unroll
            for (int n = 0; n < S_TILES; ++n) {
                tile_max = fmaxf(tile_max, fmaxf(s[m][n][2 * half], s[m][n][2 * half + 1]));
            }
            const float new_max = fmaxf(row_max[m][half], quad_max(tile_max));
            const float correction = exp2_approx((row_max[m][half] - new_max) * scale_log2);
            row_max[m][half] = new_max;
            const float max_scaled = new_max * scale_log2;
            float tile_sum = 0.f;
            #pragma unroll
            for (int n = 0; n < S_TILES; ++n) {
                s[m][n][2 * half] = exp2_approx(fmaf(s[m][n][2 * half], scale_log2, -max_scaled));
                s[m][n][2 * half + 1] = exp2_approx(fmaf(s[m][n][2 * half + 1], scale_log2, -max_scaled));
                tile_sum += s[m][n][2 * half] + s[m][n][2 * half + 1];
            }
            row_sum[m][half] = row_sum[m][half] * correction + tile_sum;
            #pragma unroll
            for (int d = 0; d < O_TILES; ++d) {
                o_acc[m][d][2 * half] *= correction;
                o_acc[m][d][2 * half + 1] *= correction;
            }
        }

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
        __syncthreads();  // every warp is done with this buffer before it is refilled
    }

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
