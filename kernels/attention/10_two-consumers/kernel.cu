// Stage 10 — two consumer warpgroups.
//
// Stage 09 gave each CTA one warpgroup and 64 query rows, so every K/V tile that TMA brought into
// shared memory fed only 64 rows: each (batch, head) streamed all of its K and V from L2 once per
// 64 query rows, 32 KB of copies for every 64 x 64 block of scores. Here a CTA
// holds two warpgroups (256 threads) and 128 query rows, 64 per warpgroup. Both warpgroups wait on
// the same full mbarrier and read the same K/V buffer, each with its own descriptors into its own
// 64 rows of Q: one TMA of each K/V tile now feeds 128 rows, halving the L2 -> shared memory
// traffic per FLOP. Each warpgroup runs stage 09's loop unchanged (S = Q Kᵀ from shared memory,
// softmax on the accumulators, O += P V with P from registers); thread 0 still issues every TMA, and
// the barrier at the end of an iteration now waits for all 256 threads before a buffer is refilled.
// 96 KB of shared memory: two CTAs, four warpgroups, per SM.
#include <cuda_bf16.h>

#include "../common/abi.h"
#include "../common/ldmatrix.cuh"
#include "../common/mbarrier.cuh"
#include "../common/mma_sm80.cuh"  // quad_max, quad_sum: the accumulator rows are spread over quads as before
#include "../common/tma.cuh"
#include "../common/trace.cuh"
#include "../common/wgmma.cuh"
#include "../common/wgmma_rs.cuh"

constexpr int HEAD_DIM = 128;
constexpr int WG_ROWS = 64;  // query rows per warpgroup: the M of one wgmma
constexpr int CONSUMERS = 2;  // warpgroups per CTA, sharing every K/V tile
constexpr int BLOCK_M = CONSUMERS * WG_ROWS;  // query rows per CTA
constexpr int BLOCK_N = 64;  // key/value rows per iteration
constexpr int NUM_THREADS = CONSUMERS * 128;
constexpr int KV_STAGES = 2;  // K/V buffers: one being computed on, one being filled
constexpr int BOX_COLS = 64;  // a 128-byte swizzled box row holds 64 bf16: a tile is two boxes side by side
constexpr int Q_TILE_BYTES = BLOCK_M * HEAD_DIM * 2;
constexpr int KV_TILE_BYTES = BLOCK_N * HEAD_DIM * 2;
constexpr int NUM_BARRIERS = 1 + KV_STAGES;  // Q, then one "full" barrier per K/V buffer
constexpr int SMEM_BYTES = Q_TILE_BYTES + KV_STAGES * 2 * KV_TILE_BYTES + NUM_BARRIERS * 8;

constexpr int K_STEPS = HEAD_DIM / 16;  // k-steps of the QKᵀ product
constexpr int S_REGS = BLOCK_N / 2;     // fp32 accumulators per thread of S (64 x BLOCK_N per warpgroup)
constexpr int O_REGS = HEAD_DIM / 2;    // fp32 accumulators per thread of O (64 x 128)
constexpr int P_REGS = BLOCK_N / 4;     // bf16x2 registers per thread of P (64 x BLOCK_N): S's, halved
constexpr int PV_STEPS = BLOCK_N / 16;  // k-steps of the PV product, four of P's registers each
constexpr int SWIZZLE_ATOM = 1024;      // 8 rows x 128 bytes: the SBO of every descriptor
constexpr float RESCALE_THRESHOLD = 8.f;  // log2 of the growth tolerated before rescaling

using bf16 = __nv_bfloat16;

// One thread starts the copy of ROWS x 128 tile rows (global row `row0` on): one TMA per 64-column
// box, both completing on `bar`, which the caller has told to expect the tile's bytes.
template <int ROWS>
__device__ __forceinline__ void load_tile(uint32_t tile, const CUtensorMap* map, int row0, uint32_t bar) {
    #pragma unroll
    for (int box = 0; box < HEAD_DIM / BOX_COLS; ++box)
        tma_load_2d(tile + box * ROWS * BOX_COLS * 2, map, box * BOX_COLS, row0, bar);
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

// At most 128 registers per thread, so that two CTAs (512 threads) fit in an SM's 64 K registers.
__global__ void __launch_bounds__(NUM_THREADS, 2) attention_kernel(const __grid_constant__ CUtensorMap q_map,
                                                                 const __grid_constant__ CUtensorMap k_map,
                                                                 const __grid_constant__ CUtensorMap v_map,
                                                                 const AttnParams p) {
    const int warp = threadIdx.x / 32;  // 0..7: warps 0-3 are warpgroup 0, warps 4-7 warpgroup 1
    const int lane = threadIdx.x % 32;
    const int wg = threadIdx.x / 128;   // this warpgroup owns CTA rows 64 wg .. 64 wg + 63
    const int group = lane / 4;  // accumulator row within the warp's 8-row half
    const int quad = lane % 4;   // accumulator column pair
    const int batch = blockIdx.z, head = blockIdx.y;
    const int q_row0 = blockIdx.x * BLOCK_M + warp * 16;  // warp w owns rows 16w..16w+15 (= 64 wg + 16 (w % 4))
    TRACE_INIT();

    // Q, K and V are viewed as 2-D [batch * heads * len, 128] tensors: this (batch, head)'s rows.
    const int q_row = (batch * p.heads + head) * p.len_q + blockIdx.x * BLOCK_M;
    const int kv_row = (batch * p.heads + head) * p.len_k;
    bf16* O = static_cast<bf16*>(p.o) + batch * p.o_stride[0] + head * p.o_stride[1];

    // 96 KB of tiles and the mbarriers after them. The 128-byte swizzle needs every box (and every
    // wgmma swizzle atom) to start at a multiple of 1024 bytes; all tile sizes are multiples of 1024.
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t q_tile = smem_addr(smem);  // 128 rows, as two 128 x 64 boxes
    const uint32_t k_tiles = q_tile + Q_TILE_BYTES;                   // + stage * KV_TILE_BYTES
    const uint32_t v_tiles = k_tiles + KV_STAGES * KV_TILE_BYTES;     // + stage * KV_TILE_BYTES
    const uint32_t q_full = v_tiles + KV_STAGES * KV_TILE_BYTES;
    const uint32_t kv_full = q_full + 8;  // kv_full + 8 * stage: K and V of that buffer have landed

    if (threadIdx.x == 0) {
        if (q_tile % 1024) __trap();  // the swizzle and the descriptors below would not hold
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

    // Per thread: 64 fp32 registers of O and 32 of S (its warpgroup's 64 x 128 and 64 x 64 tiles
    // spread over 128 threads), then 16 bf16x2 registers of P; Q, K and V never pass through registers.
    float o_acc[O_REGS] = {};
    float row_max[2] = {-INFINITY, -INFINITY};  // rows group and group + 8, unscaled scores
    float row_sum[2] = {};  // this thread's share; the quad is summed after the loop
    // exp(scale * (s - m)) = 2^(s * scale_log2 - m * scale_log2): one FFMA feeds each EX2.
    const float scale_log2 = p.scale * 1.4426950408889634f;

    const int num_tiles = p.len_k / BLOCK_N;
    TRACE_BEGIN(wait_q);
    mbarrier_wait(q_full, 0);  // Q's barrier completes once: phase 0
    TRACE_END(wait_q, 0, -1);

    for (int tile = 0; tile < num_tiles; ++tile) {
        // Prefetch tile + 1 into the other buffer; the barrier at the end of the previous
        // iteration guarantees that no wgmma of either warpgroup still reads it.
        if (threadIdx.x == 0 && tile + 1 < num_tiles) {
            const int next = (tile + 1) % KV_STAGES;
            mbarrier_arrive_expect_tx(kv_full + 8 * next, 2 * KV_TILE_BYTES);
            load_tile<BLOCK_N>(k_tiles + next * KV_TILE_BYTES, &k_map, kv_row + (tile + 1) * BLOCK_N, kv_full + 8 * next);
            load_tile<BLOCK_N>(v_tiles + next * KV_TILE_BYTES, &v_map, kv_row + (tile + 1) * BLOCK_N, kv_full + 8 * next);
            TRACE_MARK(load_kv, 0, tile + 1);
        }
        // Buffer tile % 2 completes its phases on tiles b, b + 2, b + 4, ...: the (tile / 2)-th time.
        TRACE_BEGIN(wait_kv);
        mbarrier_wait(kv_full + 8 * (tile % KV_STAGES), (tile / KV_STAGES) % 2);
        TRACE_END(wait_kv, 0, tile);
        const uint32_t k_tile = k_tiles + (tile % KV_STAGES) * KV_TILE_BYTES;
        const uint32_t v_tile = v_tiles + (tile % KV_STAGES) * KV_TILE_BYTES;

        // S = Q Kᵀ (64 x 64 per warpgroup): eight k-steps of 16 head-dim columns. Q (A) and K (B = Kᵀ)
        // are both K-major: a 16-column step is 32 bytes into each 128-byte swizzled row, in box kk / 4.
        // Both warpgroups read the same K; warpgroup wg's 64 rows of Q start 64 rows (8 swizzle atoms,
        // 8 KB) into each 128-row box of Q.
        float s[S_REGS];
        TRACE_BEGIN(qk);
        wgmma_fence();  // S and O were last written by ordinary instructions
        #pragma unroll
        for (int kk = 0; kk < K_STEPS; ++kk) {
            const uint32_t offset = (kk * 16 / BOX_COLS) * (BLOCK_N * BOX_COLS * 2) + (kk * 16 % BOX_COLS) * 2;
            const uint64_t desc_q = make_smem_desc_sw128(q_tile + (kk * 16 / BOX_COLS) * (BLOCK_M * BOX_COLS * 2) +
                                                         wg * (WG_ROWS * BOX_COLS * 2) + (kk * 16 % BOX_COLS) * 2,
                                                         16, SWIZZLE_ATOM);
            const uint64_t desc_k = make_smem_desc_sw128(k_tile + offset, 16, SWIZZLE_ATOM);
            wgmma_m64n64k16_bf16_ss<0>(s, desc_q, desc_k, kk > 0);  // the first step overwrites S
        }
        wgmma_commit();
        TRACE_END(qk, 0, tile);
        TRACE_BEGIN(wait_qk);
        wgmma_wait<0>();
        wgmma_fence_operands(s);
        TRACE_END(wait_qk, 0, tile);

        // Online softmax on the accumulator layout: s[4j + 2 half + c] is row group + 8 half,
        // column 8j + 2 quad + c. The running max only moves (and O and the sums are only rescaled)
        // when some row's max grew by more than 2^8 in exp2 units; otherwise P is computed against
        // the stale max, stays below 2^8 and the final division cancels the difference exactly.
        TRACE_BEGIN(softmax);
        float tile_max[2];
        bool grew = false;
        #pragma unroll
        for (int half = 0; half < 2; ++half) {
            float x = -INFINITY;
            #pragma unroll
            for (int j = 0; j < BLOCK_N / 8; ++j) x = fmaxf(x, fmaxf(s[4 * j + 2 * half], s[4 * j + 2 * half + 1]));
            tile_max[half] = quad_max(x);
            grew |= (tile_max[half] - row_max[half]) * scale_log2 > RESCALE_THRESHOLD;
        }
        if (__any_sync(0xffffffffu, grew)) {  // warp-uniform: every lane takes the same path
            TRACE_BEGIN(rescale);
            #pragma unroll
            for (int half = 0; half < 2; ++half) {
                const float new_max = fmaxf(row_max[half], tile_max[half]);
                const float correction = exp2_approx((row_max[half] - new_max) * scale_log2);
                row_max[half] = new_max;
                row_sum[half] *= correction;
                #pragma unroll
                for (int j = 0; j < HEAD_DIM / 8; ++j) {
                    o_acc[4 * j + 2 * half] *= correction;
                    o_acc[4 * j + 2 * half + 1] *= correction;
                }
            }
            TRACE_END(rescale, 0, tile);
        }
        // P = 2^(s·scale_log2 - max) in bf16, kept in registers as the A operand of the PV product:
        // p_frag[2j + half] = the pair s[4j + 2 half], s[4j + 2 half + 1] (row group + 8 half, columns
        // 8j + 2 quad, +1), so k-step k of PV (keys 16k..16k+15) reads p_frag[4k..4k+3] =
        // {row group, row group + 8} x {columns 2 quad, 8 + 2 quad}: wgmma's A fragment layout.
        uint32_t p_frag[P_REGS];
        #pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float max_scaled = row_max[half] * scale_log2;
            #pragma unroll
            for (int j = 0; j < BLOCK_N / 8; ++j) {
                const float p0 = exp2_approx(fmaf(s[4 * j + 2 * half], scale_log2, -max_scaled));
                const float p1 = exp2_approx(fmaf(s[4 * j + 2 * half + 1], scale_log2, -max_scaled));
                row_sum[half] += p0 + p1;
                p_frag[2 * j + half] = pack_bf16x2(p0, p1);
            }
        }
        wgmma_fence_operands(p_frag);  // P is computed before the fence below, not sunk past it
        TRACE_END(softmax, 0, tile);

        // O += P V (64 x 128 per warpgroup, both reading the same V): four k-steps of 16 keys. P (A)
        // comes from registers, four per thread and step. V (B) is MN-major — row k of B is row k of
        // V, head-dim contiguous — so the transpose bit is set; a step is 16 V rows = two 1024-byte
        // atoms apart by SBO, and the two 64-column boxes of V are LBO = one box apart.
        TRACE_BEGIN(pv);
        wgmma_fence();  // O was rescaled and P written by ordinary instructions
        #pragma unroll
        for (int j = 0; j < PV_STEPS; ++j) {
            const uint64_t desc_v = make_smem_desc_sw128(v_tile + j * 16 * 128, BLOCK_N * BOX_COLS * 2, SWIZZLE_ATOM);
            wgmma_m64n128k16_bf16_rs<1>(o_acc, p_frag[4 * j], p_frag[4 * j + 1], p_frag[4 * j + 2], p_frag[4 * j + 3],
                                        desc_v, 1);
        }
        wgmma_commit();
        TRACE_END(pv, 0, tile);
        TRACE_BEGIN(wait_pv);
        wgmma_wait<0>();  // also the end of the reads of P's registers
        wgmma_fence_operands(o_acc);
        TRACE_END(wait_pv, 0, tile);
        TRACE_BEGIN(wait_empty);
        __syncthreads();  // every warp of both warpgroups is done with this K/V buffer before it is refilled
        TRACE_END(wait_empty, 0, tile);
    }

    // Epilogue: finish the row sums across the quad, divide, convert, write two columns per store.
    TRACE_BEGIN(epilogue);
    const float inv_sum[2] = {1.f / quad_sum(row_sum[0]), 1.f / quad_sum(row_sum[1])};
    #pragma unroll
    for (int j = 0; j < HEAD_DIM / 8; ++j) {
        #pragma unroll
        for (int half = 0; half < 2; ++half) {
            bf16* out = O + (q_row0 + group + 8 * half) * p.o_stride[2] + j * 8 + quad * 2;
            *reinterpret_cast<uint32_t*>(out) =
                pack_bf16x2(o_acc[4 * j + 2 * half] * inv_sum[half], o_acc[4 * j + 2 * half + 1] * inv_sum[half]);
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
