// Stage 07 — TMA.
//
// Every tile load so far has cost each thread a stream of 16-byte cp.async instructions with their
// address arithmetic (16 per thread for each K/V tile pair, 16 more for Q), issued by the same
// threads that feed the tensor cores. Hopper's tensor memory accelerator (TMA) moves a whole box of
// a tensor with one instruction from one thread: the host describes Q, K and V once (a tensor map:
// base, sizes, strides, box shape, swizzle), and the copy engine generates the addresses, writes
// the tile into shared memory already swizzled, and counts the bytes against an mbarrier. The
// other threads wait on that barrier's phase instead of on their own copies plus a block barrier.
// The math is stage 06's, unchanged; only the ldmatrix addresses follow the TMA's 128-byte swizzle.
#include <cuda_bf16.h>

#include "../common/abi.h"
#include "../common/ldmatrix.cuh"
#include "../common/mbarrier.cuh"
#include "../common/mma_sm80.cuh"
#include "../common/tma.cuh"
#include "../common/trace.cuh"

constexpr int HEAD_DIM = 128;
constexpr int BLOCK_M = 128;  // query rows per CTA: one warp per 32 rows
constexpr int BLOCK_N = 64;  // key/value rows per iteration
constexpr int NUM_THREADS = 128;
constexpr int ROWS_PER_WARP = 32;
constexpr int M_TILES = ROWS_PER_WARP / 16;  // 16-row MMA tiles per warp
constexpr int KV_STAGES = 2;  // K/V buffers: one being computed on, one being filled
constexpr int BOX_COLS = 64;  // a 128-byte swizzled box row holds 64 bf16: a tile is two boxes side by side
constexpr int Q_TILE_BYTES = BLOCK_M * HEAD_DIM * 2;
constexpr int KV_TILE_BYTES = BLOCK_N * HEAD_DIM * 2;
constexpr int NUM_BARRIERS = 1 + KV_STAGES;  // Q, then one "full" barrier per K/V buffer
constexpr int SMEM_BYTES = Q_TILE_BYTES + KV_STAGES * 2 * KV_TILE_BYTES + NUM_BARRIERS * 8;  // tiles, mbarriers

constexpr int K_STEPS = HEAD_DIM / 16;  // k-steps of the QKᵀ product
constexpr int S_TILES = BLOCK_N / 8;    // n8 tiles of one S row block
constexpr int O_TILES = HEAD_DIM / 8;   // n8 tiles of one O row block
constexpr int PV_STEPS = BLOCK_N / 16;  // k-steps of the PV product
constexpr float RESCALE_THRESHOLD = 8.f;  // log2 of the growth tolerated before rescaling

using bf16 = __nv_bfloat16;

// Where element (row, col) of a tile of ROWS x 128 lives, as TMA writes it with the 128-byte
// swizzle: columns 0-63 form one box of ROWS x 128 bytes and columns 64-127 a second box after it;
// inside a box, 16-byte chunk c of row r sits at chunk c ^ (r % 8). (The hardware XORs address bits
// 4-6 with bits 7-9, which is this formula when every box starts at a multiple of 1024 bytes.)
template <int ROWS>
__device__ __forceinline__ int tma_swizzle(int row, int col) {
    return (col / BOX_COLS) * (ROWS * BOX_COLS) + row * BOX_COLS + ((((col % BOX_COLS) / 8) ^ (row % 8)) * 8) + col % 8;
}

// One thread starts the copy of ROWS x 128 tile rows (global row `row0` on): one TMA per 64-column
// box, both completing on `bar`, which the caller has told to expect the tile's bytes.
template <int ROWS>
__device__ __forceinline__ void load_tile(bf16* tile, const CUtensorMap* map, int row0, uint32_t bar) {
    #pragma unroll
    for (int box = 0; box < HEAD_DIM / BOX_COLS; ++box)
        tma_load_2d(smem_addr(tile + box * ROWS * BOX_COLS), map, box * BOX_COLS, row0, bar);
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

__global__ void __launch_bounds__(NUM_THREADS) attention_kernel(const __grid_constant__ CUtensorMap q_map,
                                                                 const __grid_constant__ CUtensorMap k_map,
                                                                 const __grid_constant__ CUtensorMap v_map,
                                                                 const AttnParams p) {
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int group = lane / 4;  // fragment row within the 8-row half
    const int quad = lane % 4;   // fragment column pair
    const int batch = blockIdx.z, head = blockIdx.y;
    const int q_row0 = blockIdx.x * BLOCK_M + warp * ROWS_PER_WARP;
    const int lm_row = lane % 8, lm_matrix = lane / 8;  // the row address this lane gives ldmatrix
    TRACE_INIT();

    // Q, K and V are viewed as 2-D [batch * heads * len, 128] tensors: this (batch, head)'s rows.
    const int q_row = (batch * p.heads + head) * p.len_q + blockIdx.x * BLOCK_M;
    const int kv_row = (batch * p.heads + head) * p.len_k;
    bf16* O = static_cast<bf16*>(p.o) + batch * p.o_stride[0] + head * p.o_stride[1];

    // 96 KB of tiles and the mbarriers after them. The 128-byte swizzle needs every box to start
    // at a multiple of 1024 bytes; all tile sizes are multiples of 1024, so the base must be too.
    extern __shared__ __align__(1024) unsigned char smem[];
    bf16* q_tile = reinterpret_cast<bf16*>(smem);
    bf16* k_tiles = reinterpret_cast<bf16*>(smem + Q_TILE_BYTES);                             // [KV_STAGES]
    bf16* v_tiles = reinterpret_cast<bf16*>(smem + Q_TILE_BYTES + KV_STAGES * KV_TILE_BYTES);  // [KV_STAGES]
    const uint32_t q_full = smem_addr(smem + Q_TILE_BYTES + 2 * KV_STAGES * KV_TILE_BYTES);
    const uint32_t kv_full = q_full + 8;  // kv_full + 8 * stage: K and V of that buffer have landed

    if (threadIdx.x == 0) {
        if (smem_addr(smem) % 1024) __trap();  // the swizzle formula above would not hold
        #pragma unroll
        for (int b = 0; b < NUM_BARRIERS; ++b) mbarrier_init(q_full + 8 * b, 1);
        fence_proxy_async_shared();  // the copy engine must see the initialised barriers
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbarrier_arrive_expect_tx(q_full, Q_TILE_BYTES);
        load_tile<BLOCK_M>(q_tile, &q_map, q_row, q_full);
        TRACE_MARK(load_q, 0, -1);
        mbarrier_arrive_expect_tx(kv_full, 2 * KV_TILE_BYTES);
        load_tile<BLOCK_N>(k_tiles, &k_map, kv_row, kv_full);
        load_tile<BLOCK_N>(v_tiles, &v_map, kv_row, kv_full);
        TRACE_MARK(load_kv, 0, 0);
    }

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
    TRACE_BEGIN(wait_q);
    mbarrier_wait(q_full, 0);  // Q's barrier completes once: phase 0
    TRACE_END(wait_q, 0, -1);

    for (int tile = 0; tile < num_tiles; ++tile) {
        // Prefetch tile + 1 into the other buffer; the barrier at the end of the previous
        // iteration guarantees that no warp still reads it.
        if (threadIdx.x == 0 && tile + 1 < num_tiles) {
            const int next = (tile + 1) % KV_STAGES;
            mbarrier_arrive_expect_tx(kv_full + 8 * next, 2 * KV_TILE_BYTES);
            load_tile<BLOCK_N>(k_tiles + next * BLOCK_N * HEAD_DIM, &k_map, kv_row + (tile + 1) * BLOCK_N, kv_full + 8 * next);
            load_tile<BLOCK_N>(v_tiles + next * BLOCK_N * HEAD_DIM, &v_map, kv_row + (tile + 1) * BLOCK_N, kv_full + 8 * next);
            TRACE_MARK(load_kv, 0, tile + 1);
        }
        // Buffer tile % 2 completes its phases on tiles b, b + 2, b + 4, ...: the (tile / 2)-th time.
        TRACE_BEGIN(wait_kv);
        mbarrier_wait(kv_full + 8 * (tile % KV_STAGES), (tile / KV_STAGES) % 2);
        TRACE_END(wait_kv, 0, tile);
        const bf16* k_tile = k_tiles + (tile % KV_STAGES) * BLOCK_N * HEAD_DIM;
        const bf16* v_tile = v_tiles + (tile % KV_STAGES) * BLOCK_N * HEAD_DIM;

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
                ldmatrix_x4(q_frag[m], smem_addr(q_tile + tma_swizzle<BLOCK_M>(row, kk * 16 + (lm_matrix / 2) * 8)));
            }
            // K rows are ldmatrix rows; one x4 brings the B fragments of two n8 tiles.
            #pragma unroll
            for (int n = 0; n < S_TILES; n += 2) {
                uint32_t b[4];
                const int row = (n + lm_matrix / 2) * 8 + lm_row;
                ldmatrix_x4(b, smem_addr(k_tile + tma_swizzle<BLOCK_N>(row, kk * 16 + (lm_matrix % 2) * 8)));
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
                ldmatrix_x4_trans(b, smem_addr(v_tile + tma_swizzle<BLOCK_N>(row, (d + lm_matrix / 2) * 8)));
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
    // The tensor maps view Q, K and V as [batch * heads * len, 128]: they must be contiguous BHSD
    // (the stride of a dimension of size 1 does not matter), and a box of rows never crosses into
    // the next (batch, head) because len is a multiple of it.
    const auto bhsd = [&](const int64_t* s, int len) {
        return s[2] == HEAD_DIM && (p->heads == 1 || s[1] == int64_t(len) * HEAD_DIM) &&
               (p->batch == 1 || s[0] == int64_t(p->heads) * len * HEAD_DIM);
    };
    const int64_t q_rows = int64_t(p->batch) * p->heads * p->len_q, kv_rows = int64_t(p->batch) * p->heads * p->len_k;
    if (!bhsd(p->q_stride, p->len_q) || !bhsd(p->k_stride, p->len_k) || !bhsd(p->v_stride, p->len_k) ||
        q_rows >= (int64_t(1) << 31) || kv_rows >= (int64_t(1) << 31)) {
        snprintf(err, errlen, "stage needs contiguous BHSD q, k, v with batch * heads * len < 2^31");
        return 1;
    }
    CUtensorMap q_map, k_map, v_map;
    if (make_tma_2d_bf16(&q_map, p->q, q_rows, HEAD_DIM, HEAD_DIM * 2, BLOCK_M, BOX_COLS, err, errlen) ||
        make_tma_2d_bf16(&k_map, p->k, kv_rows, HEAD_DIM, HEAD_DIM * 2, BLOCK_N, BOX_COLS, err, errlen) ||
        make_tma_2d_bf16(&v_map, p->v, kv_rows, HEAD_DIM, HEAD_DIM * 2, BLOCK_N, BOX_COLS, err, errlen))
        return 1;
    HOPATTN_CHECK(cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES),
                  err, errlen);
    const dim3 grid(p->len_q / BLOCK_M, p->heads, p->batch);
    attention_kernel<<<grid, NUM_THREADS, SMEM_BYTES, stream>>>(q_map, k_map, v_map, *p);
    HOPATTN_CHECK(cudaGetLastError(), err, errlen);
    return 0;
}

HOPATTN_EXPORT int hopattn_describe(KernelInfo* info, char* err, int errlen) {
    return describe_kernel(attention_kernel, NUM_THREADS, SMEM_BYTES, BLOCK_M, BLOCK_N, info, err, errlen);
}
