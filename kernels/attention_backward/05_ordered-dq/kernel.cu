// Backward stage 05 — the deterministic mode as a wait: dQ's reduce-adds in a fixed key-block order.
//
// Through stage 04 the deterministic mode runs a second kernel (stage 02's, on mma.sync) that
// recomputes S, P, dP and dS for every query block to sum dQ over the key blocks in order: 0.55x the
// default's speed at stage 03. Stage 04's bulk reduce-adds make the order cheap to impose instead:
// a counter per (query block, warpgroup half of dQ's columns), set by the preprocess to the last key
// block that sees the query block, says whose turn it is. Key block n's issuing thread waits until it
// reads n (ld.acquire), issues its reduce-add, waits for it to complete, counts down (red.release). Every
// float of the accumulator then receives its key blocks' shares in the same order on every run,
// from the same zero: the same bits. The default mode issues and moves on, as in stage 04; the
// second kernel and its 200 lines are gone.
//
// Stages 03-04's: a CTA of two consumer warpgroups holds 128 keys (64 each); one thread
// brings Q and dO in with the TMA a step ahead, into the 128-byte swizzled layout wgmma reads;
//   Sᵀ  = K Qᵀ   and  dPᵀ = V dOᵀ   (M = the warpgroup's 64 keys, N = 64 queries; A, B from shared)
//   dV += Pᵀ dO  and  dK += dSᵀ Q   (Pᵀ and dSᵀ are the accumulators above, rounded: A from registers)
//   dQ  = dS K                      (dSᵀ written to shared memory as held, read back as an MN-major A;
//                                    each warpgroup 64 of the 128 head-dim columns, over all 128 keys)
// and each warpgroup's dQ share added from shared memory by one bulk reduce-add per step.
#include <cuda_bf16.h>

#include "../../attention/common/ldmatrix.cuh"
#include "../../attention/common/mbarrier.cuh"
#include "../../attention/common/tma_4d.cuh"
#include "../../attention/common/tma_store.cuh"  // bulk_commit_group, bulk_wait_group_read
#include "../../attention/common/named_barrier.cuh"
#include "../../attention/common/wgmma.cuh"
#include "../../attention/common/wgmma_rs.cuh"
#include "../common/abi_backward.h"
#include "../common/trace_backward.cuh"
#include "../common/bulk_reduce.cuh"
#include "../common/wgmma_transposed_a.cuh"

constexpr int HEAD_DIM = 128;
constexpr int BLOCK_M = 64;    // query rows per step of the main kernel (and per CTA of the dQ pass)
constexpr int BLOCK_N = 128;   // keys per CTA of the main kernel
constexpr int CONSUMERS = 2;   // warpgroups per CTA, 64 keys each
constexpr int WG_KEYS = BLOCK_N / CONSUMERS;
constexpr int NUM_THREADS = CONSUMERS * 128;
constexpr int Q_STAGES = 2;    // Q and dO of step i + 1 land while step i computes
constexpr int BOX_COLS = 64;   // a 128-byte swizzled box row holds 64 bf16: a 128-wide tile is two boxes
constexpr int SWIZZLE_ATOM = 1024;  // 8 rows x 128 bytes: the SBO of every descriptor
constexpr int KV_TILE_BYTES = BLOCK_N * HEAD_DIM * 2;
constexpr int Q_TILE_BYTES = BLOCK_M * HEAD_DIM * 2;
constexpr int DS_TILE_BYTES = BLOCK_N * BLOCK_M * 2;  // dSᵀ: [128 keys][64 queries], one box wide
constexpr int DQ_TILE_BYTES = BLOCK_M * BOX_COLS * 4;  // a warpgroup's dQ share, fp32: 16 KB
constexpr int NUM_BARRIERS = 1 + Q_STAGES;            // K and V; each stage's Q and dO
constexpr int SMEM_BYTES = 2 * KV_TILE_BYTES + Q_STAGES * 2 * Q_TILE_BYTES + DS_TILE_BYTES +
                           CONSUMERS * DQ_TILE_BYTES + NUM_BARRIERS * 8 + 4;  // + the CTA's key block
constexpr int DQ_BAR = 1;  // named barrier DQ_BAR + wg: warpgroup wg's 128 threads around its dQ tile (0 is __syncthreads)
static_assert(SMEM_BYTES <= 227 * 1024, "more shared memory than one block may have on sm_90");

constexpr int K_STEPS = HEAD_DIM / 16;   // k-steps of Sᵀ and dPᵀ (over the head dim)
constexpr int M_STEPS = BLOCK_M / 16;    // k-steps of dV and dK (over the step's queries)
constexpr int N_STEPS = BLOCK_N / 16;    // k-steps of dQ (over the CTA's keys)
constexpr int ST_REGS = BLOCK_M / 2;     // fp32 accumulators per thread of Sᵀ (64 keys x 64 queries)
constexpr int KV_REGS = HEAD_DIM / 2;    // fp32 accumulators per thread of dK, of dV (64 keys x 128)
constexpr int DQ_REGS = BOX_COLS / 2;    // fp32 accumulators per thread of dQ (64 queries x 64 columns)

constexpr int PRE_ROWS = 128 / 16;  // preprocess and conversion: 16 threads per row, 8 elements each
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

// The deterministic mode's counters: per (batch, head, query block), one per warpgroup half of dQ's
// columns, after the two row-stat arrays in the row_stats workspace.
__device__ __forceinline__ int* dq_turns(const AttnBwdParams& p) {
    return reinterpret_cast<int*>(p.row_stats + 2 * (int64_t)p.batch * p.heads * padded_rows(p.len_q));
}
// And after them one ticket per (batch, K/V head): in the deterministic mode a CTA takes its key
// block from it, the last key block first, so that key block n is only ever given to a CTA that
// started after the one with key block n + 1 — the turns cannot wait on a CTA that has not started,
// whatever order the hardware starts them in (blockIdx order is usual, not promised).
__device__ __forceinline__ int* key_block_tickets(const AttnBwdParams& p) {
    return dq_turns(p) + (int64_t)p.batch * p.heads * (padded_rows(p.len_q) / BLOCK_M) * CONSUMERS;
}

// The last key block that sees query block q0 / BLOCK_M (−1: none): a causal key block j sees the
// query rows from j · BLOCK_N − (len_k − len_q) on (first_query_block), so the key blocks that see a
// query block are 0 up to this one. The deterministic mode adds their shares from this one down.
__device__ __forceinline__ int last_key_block(int q0, int len_q, int len_k, bool causal) {
    const int key_blocks = (len_k + BLOCK_N - 1) / BLOCK_N;
    if (!causal) return key_blocks - 1;
    const int last_key = q0 + BLOCK_M - 1 + (len_k - len_q);  // the last key the block's last row sees
    return last_key < 0 ? -1 : min(key_blocks - 1, last_key / BLOCK_N);
}

// --- 1. preprocess --------------------------------------------------------------------------------

// For every query row (padded to BLOCK_M): D = rowsum(dO ∘ O) (less dlse, when the caller's loss
// used the log-sum-exp) and lse · log2(e), with +inf for the
// padding rows and for rows that saw no key (lse = −inf), so that P = 2^(s − lse₂) is exactly 0
// there; and the row of the dQ accumulator zeroed.
__global__ void __launch_bounds__(128) preprocess_kernel(const AttnBwdParams p) {
    const int row = blockIdx.x * PRE_ROWS + threadIdx.x / 16, part = threadIdx.x % 16;
    const int head = blockIdx.y, batch = blockIdx.z;
    const int rows = padded_rows(p.len_q);
    const int64_t bh = (int64_t)batch * p.heads + head;
    if (blockIdx.x == 0 && threadIdx.x == 0 && head < p.kv_heads) key_block_tickets(p)[batch * p.kv_heads + head] = 0;
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
        if (row % BLOCK_M == 0) {  // the query block's two turn counters: whose turn is first
            const int first_turn = last_key_block(row, p.len_q, p.len_k, p.causal != 0);
            dq_turns(p)[(bh * (rows / BLOCK_M) + row / BLOCK_M) * CONSUMERS] = first_turn;
            dq_turns(p)[(bh * (rows / BLOCK_M) + row / BLOCK_M) * CONSUMERS + 1] = first_turn;
        }
    }
    {
        float4* acc = reinterpret_cast<float4*>(p.dq_accum + (bh * rows + row) * HEAD_DIM) + part * 2;
        acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
        acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

// --- 2. the main kernel: dK and dV of 128 keys, and dQ through atomics ----------------------------------

// One thread starts the copy of ROWS x 128 tile rows (row `row0` on of head `head` of batch `batch`):
// one TMA per 64-column box, both completing on `bar` (rows past the head's length come as zeros).
template <int ROWS>
__device__ __forceinline__ void load_tile(uint32_t tile, const CUtensorMap* map, int row0, int head, int batch,
                                          uint32_t bar) {
    #pragma unroll
    for (int box = 0; box < HEAD_DIM / BOX_COLS; ++box)
        tma_load_4d(tile + box * ROWS * BOX_COLS * 2, map, box * BOX_COLS, row0, head, batch, bar);
}

// The descriptor of an operand at `byte_offset` from the start of its tile, given the low word of
// the tile's own descriptor (start address, leading byte offset): a compile-time offset is one add.
__device__ __forceinline__ uint32_t desc_lo(uint32_t smem_addr, uint32_t lbo_bytes) {
    return uint32_t(make_smem_desc_sw128(smem_addr, lbo_bytes, SWIZZLE_ATOM));
}
__device__ __forceinline__ uint64_t desc_at(uint32_t tile_desc_lo, uint32_t byte_offset) {
    constexpr uint64_t high = make_smem_desc_sw128(0, 0, SWIZZLE_ATOM) & 0xffffffff00000000ull;
    return high | (tile_desc_lo + (byte_offset >> 4));
}

// The query rows of the CTA's keys: causal keys key0.. are seen from query key0 − (len_k − len_q) on.
__device__ __forceinline__ int first_query_block(int key0, int len_q, int len_k, bool causal) {
    if (!causal) return 0;
    const int first = key0 - (len_k - len_q);
    return first <= 0 ? 0 : first / BLOCK_M;
}

// Sᵀ = K Qᵀ or dPᵀ = V dOᵀ, one commit group: A = the warpgroup's 64 rows of K or V, B = the Q or dO
// tile (both K-major: a row is one key's or query's head dim), over the head dim's two boxes.
__device__ __forceinline__ void gemm_over_head_dim(float (&acc)[ST_REGS], uint32_t a_rows, uint32_t b_rows) {
    wgmma_m64n64k16_bf16_ss_first<0, 0>(acc, desc_at(a_rows, 0), desc_at(b_rows, 0));
    #pragma unroll
    for (int kk = 1; kk < K_STEPS; ++kk) {
        const uint32_t in_row = (kk % 4) * 32, box = kk / 4;
        wgmma_m64n64k16_bf16_ss<0>(acc, desc_at(a_rows, box * KV_TILE_BYTES / 2 + in_row),
                                   desc_at(b_rows, box * Q_TILE_BYTES / 2 + in_row), 1);
    }
    wgmma_commit();
}

// Where float i of thread t (of a warpgroup's 128) of the dQ share lies in its 16 KB block, in
// floats: the accumulator's 32 registers as 8 float4, float4 j of all 128 threads side by side (a
// warp's 16-byte stores of one j fill 512 contiguous bytes: four wavefronts, no conflicts).
__host__ __device__ constexpr int dq_block_index(int t, int i) { return (i / 4 * 128 + t) * 4 + i % 4; }

__device__ __forceinline__ int ld_shared_s32(uint32_t addr) {
    int value;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(value) : "r"(addr) : "memory");
    return value;
}

// The turn counters: read with acquire (what the previous key block's thread released is visible
// after it), added to with release (this thread's completed reduce-add is visible before the count).
__device__ __forceinline__ int ld_acquire_gpu(const int* addr) {
    int value;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(value) : "l"(addr) : "memory");
    return value;
}
__device__ __forceinline__ void red_release_gpu_add(int* addr, int value) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(addr), "r"(value) : "memory");
}
// Orders the copy engine's global accesses with this thread's ordinary ones (both directions).
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// Key block `turn` waits until the counter reads its number: the key blocks after it have added their
// shares of this query block's dQ half, each counting one down. The order runs from the last key
// block that sees the query block down to key block 0: a causal key block's first query blocks are
// then ones where it goes first, and each later one waits only for the key block after it, a step
// ahead. (In key order, key block n would wait for key block 0 to reach its diagonal: an idle wait
// growing with n, half a causal CTA's life on average.)
__device__ __forceinline__ void wait_for_turn(const int* counter, int turn) {
    while (ld_acquire_gpu(counter) != turn) __nanosleep(64);
    fence_proxy_async_global();  // the reduce-add issued next is ordered after what the count made visible
}

__global__ void __launch_bounds__(NUM_THREADS, 1) dkdv_kernel(const __grid_constant__ AttnBwdParams p,
                                                              const __grid_constant__ CUtensorMap q_map,
                                                              const __grid_constant__ CUtensorMap k_map,
                                                              const __grid_constant__ CUtensorMap v_map,
                                                              const __grid_constant__ CUtensorMap do_map) {
    const int wg = threadIdx.x / 128;  // this warpgroup's keys: wg * 64 .. of the CTA's 128
    const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
    const int group = lane / 4, quad = lane % 4;
    const int kv_head = blockIdx.y, batch = blockIdx.z;
    const int rows = padded_rows(p.len_q);
    const int group_size = p.heads / p.kv_heads;
    const float scale_log2 = p.scale * LOG2E;
    const int offset = p.len_k - p.len_q;  // causal: query i sees keys j <= i + offset
    const bool causal = p.causal != 0;
    const bool deterministic = p.deterministic != 0;
    TRACE_INIT();

    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t k_tile = smem_addr(smem);  // [128 keys][128] as two [128][64] boxes, swizzled
    const uint32_t v_tile = k_tile + KV_TILE_BYTES;
    const uint32_t q_tiles = v_tile + KV_TILE_BYTES;  // Q_STAGES x [64 queries][128], two boxes each
    const uint32_t do_tiles = q_tiles + Q_STAGES * Q_TILE_BYTES;
    const uint32_t ds_tile = do_tiles + Q_STAGES * Q_TILE_BYTES;  // dSᵀ [128 keys][64 queries], swizzled
    const uint32_t dq_tiles = ds_tile + DS_TILE_BYTES;  // per warpgroup, its dQ share (dq_block_index order)
    const uint32_t kv_full = dq_tiles + CONSUMERS * DQ_TILE_BYTES;
    const uint32_t q_full = kv_full + 8;  // + 8 * stage
    const uint32_t key_block_slot = q_full + 8 * Q_STAGES;

    // The CTA's key block: its blockIdx, or in the deterministic mode its K/V head's next ticket, counted
    // from the last key block down.
    if (threadIdx.x == 0)
        st_shared_b32(key_block_slot, deterministic ? int(gridDim.x) - 1 - atomicAdd(key_block_tickets(p) + batch * p.kv_heads + kv_head, 1)
                                                    : int(blockIdx.x));
    __syncthreads();
    const int key_block = ld_shared_s32(key_block_slot), key0 = key_block * BLOCK_N;

    // The steps: every query block that sees these keys, of every query head of the group.
    const int first_block = first_query_block(key0, p.len_q, p.len_k, causal);
    const int blocks = rows / BLOCK_M - first_block;
    const int steps = group_size * blocks;
    const auto issue_step = [&](int step) {  // thread 0: Q and dO of `step` into its stage
        const int head = kv_head * group_size + step / blocks, q0 = (first_block + step % blocks) * BLOCK_M;
        const int stage = step % Q_STAGES;
        mbarrier_arrive_expect_tx(q_full + 8 * stage, 2 * Q_TILE_BYTES);
        load_tile<BLOCK_M>(q_tiles + stage * Q_TILE_BYTES, &q_map, q0, head, batch, q_full + 8 * stage);
        TRACE_MARK(load_q, 0, step);
        load_tile<BLOCK_M>(do_tiles + stage * Q_TILE_BYTES, &do_map, q0, head, batch, q_full + 8 * stage);
        TRACE_MARK(load_do, 0, step);
    };
    if (threadIdx.x == 0) {
        mbarrier_init(kv_full, 1);
        for (int s = 0; s < Q_STAGES; ++s) mbarrier_init(q_full + 8 * s, 1);
        fence_proxy_async_shared();  // the copy engine must see the initialised barriers
        mbarrier_arrive_expect_tx(kv_full, 2 * KV_TILE_BYTES);
        load_tile<BLOCK_N>(k_tile, &k_map, key0, kv_head, batch, kv_full);
        load_tile<BLOCK_N>(v_tile, &v_map, key0, kv_head, batch, kv_full);
        TRACE_MARK(load_kv, 0, -1);
        if (steps > 0) issue_step(0);
    }
    __syncthreads();

    // Descriptors: this warpgroup's 64 rows of K and V as the A of Sᵀ and dPᵀ (K-major), K's box
    // `wg` as the B of dQ (MN-major: rows are keys), dSᵀ as the MN-major A of dQ.
    const uint32_t k_rows = desc_lo(k_tile + wg * WG_KEYS * 128, 16);
    const uint32_t v_rows = desc_lo(v_tile + wg * WG_KEYS * 128, 16);
    const uint32_t k_box = desc_lo(k_tile + wg * BLOCK_N * 128, 16);
    const uint32_t ds_a = desc_lo(ds_tile, 16);
    float dk[KV_REGS] = {}, dv[KV_REGS] = {};
    // Declared once: the GEMMs of every step write the same registers (no copies into place, which
    // would make ptxas wait for the wgmmas in flight).
    float st[ST_REGS], dpt[ST_REGS], dq[DQ_REGS];
    TRACE_BEGIN(wait_kv);
    mbarrier_wait(kv_full, 0);
    TRACE_END(wait_kv, 0, -1);

    for (int step = 0; step < steps; ++step) {
        const int head = kv_head * group_size + step / blocks, q0 = (first_block + step % blocks) * BLOCK_M;
        const int stage = step % Q_STAGES;
        // The other stage was last read in step − 1, which every thread has finished.
        if (threadIdx.x == 0 && step + 1 < steps) issue_step(step + 1);
        const int64_t bh = (int64_t)batch * p.heads + head;
        const float* dsum_row = p.row_stats + bh * rows + q0;
        const float* lse2_row = p.row_stats + ((int64_t)p.batch * p.heads + bh) * rows + q0;
        const uint32_t q_tile = q_tiles + stage * Q_TILE_BYTES, do_tile = do_tiles + stage * Q_TILE_BYTES;
        TRACE_BEGIN(wait_qdo);
        mbarrier_wait(q_full + 8 * stage, (step / Q_STAGES) & 1);
        TRACE_END(wait_qdo, 0, step);

        // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ: Q and dO are K-major B operands (a row is a query's head dim).
        const uint32_t q_k = desc_lo(q_tile, 16), do_k = desc_lo(do_tile, 16);
        TRACE_BEGIN(qk);
        wgmma_fence();
        gemm_over_head_dim(st, k_rows, q_k);
        gemm_over_head_dim(dpt, v_rows, do_k);
        TRACE_END(qk, 0, step);

        // The thread's 16 query columns: 8j + 2·quad and + 1, j = 0..7 (loaded while the GEMMs run).
        float2 lse2[ST_REGS / 4], dsum[ST_REGS / 4];
        #pragma unroll
        for (int j = 0; j < ST_REGS / 4; ++j) {
            lse2[j] = *reinterpret_cast<const float2*>(lse2_row + 8 * j + 2 * quad);
            dsum[j] = *reinterpret_cast<const float2*>(dsum_row + 8 * j + 2 * quad);
        }
        // Masks: keys past len_k, and (causal) keys past a query's diagonal; only blocks that have either.
        const int key_row = key0 + wg * WG_KEYS + warp * 16 + group;  // and key_row + 8
        const bool masked = key0 + BLOCK_N > p.len_k || (causal && key0 + BLOCK_N - 1 > q0 + offset);

        TRACE_BEGIN(wait_qk);
        wgmma_wait<1>();
        wgmma_fence_operands(st);
        TRACE_END(wait_qk, 0, step);
        TRACE_BEGIN(softmax);
        #pragma unroll
        for (int i = 0; i < ST_REGS; ++i) {
            const int j = i / 4, key = key_row + (i % 4 / 2) * 8, query = q0 + 8 * j + 2 * quad + i % 2;
            const float l = i % 2 ? lse2[j].y : lse2[j].x;
            const bool visible = !masked || (key < p.len_k && (!causal || key <= query + offset));
            st[i] = visible ? exp2_approx(fmaf(st[i], scale_log2, -l)) : 0.f;  // Pᵀ
        }
        TRACE_END(softmax, 0, step);
        TRACE_BEGIN(wait_dp);
        wgmma_wait<0>();
        wgmma_fence_operands(dpt);
        TRACE_END(wait_dp, 0, step);
        TRACE_BEGIN(ds);
        uint32_t p_frag[ST_REGS / 2], ds_frag[ST_REGS / 2];
        #pragma unroll
        for (int i = 0; i < ST_REGS; i += 2) {
            const float2 d = dsum[i / 4];
            const float ds0 = st[i] * (dpt[i] - d.x), ds1 = st[i + 1] * (dpt[i + 1] - d.y);  // dSᵀ
            p_frag[i / 2] = pack_bf16x2(st[i], st[i + 1]);
            ds_frag[i / 2] = pack_bf16x2(ds0, ds1);
        }

        // dV += Pᵀ dO and dK += dSᵀ Q: dO and Q are MN-major B operands (rows are queries), two boxes wide.
        wgmma_fence_operands(p_frag);
        wgmma_fence_operands(ds_frag);
        TRACE_END(ds, 0, step);
        TRACE_BEGIN(dvdk);
        wgmma_fence();
        const uint32_t do_mn = desc_lo(do_tile, Q_TILE_BYTES / 2), q_mn = desc_lo(q_tile, Q_TILE_BYTES / 2);
        #pragma unroll
        for (int t = 0; t < M_STEPS; ++t)
            wgmma_m64n128k16_bf16_rs<1>(dv, p_frag[4 * t], p_frag[4 * t + 1], p_frag[4 * t + 2], p_frag[4 * t + 3],
                                        desc_at(do_mn, t * 16 * 128), 1);
        #pragma unroll
        for (int t = 0; t < M_STEPS; ++t)
            wgmma_m64n128k16_bf16_rs<1>(dk, ds_frag[4 * t], ds_frag[4 * t + 1], ds_frag[4 * t + 2], ds_frag[4 * t + 3],
                                        desc_at(q_mn, t * 16 * 128), 1);
        wgmma_commit();
        TRACE_END(dvdk, 0, step);

        {
            // dSᵀ to shared memory as held: row = key, the 16-byte chunk j of a row holds queries
            // 8j..8j+7, at chunk j ^ (row % 8) (the 128-byte swizzle). A warp's 32 stores of a j hit
            // 32 different banks.
            TRACE_BEGIN(store_ds);
            #pragma unroll
            for (int j = 0; j < ST_REGS / 4; ++j) {
                const int row = wg * WG_KEYS + warp * 16 + group;
                const uint32_t at = ds_tile + row * 128 + ((j ^ group) * 16) + quad * 4;
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(ds_frag[2 * j]) : "memory");
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at + 8 * 128), "r"(ds_frag[2 * j + 1]) : "memory");
            }
            fence_proxy_async_shared();  // the stores, made by ordinary instructions, before wgmma reads them
            TRACE_END(store_ds, 0, step);
            TRACE_BEGIN(wait_ds);
            __syncthreads();             // both warpgroups' halves of dSᵀ are in
            TRACE_END(wait_ds, 0, step);

            // dQ (the step's 64 queries x this warpgroup's 64 head-dim columns) = dS K, over all 128 keys.
            TRACE_BEGIN(dq);
            wgmma_fence();
            wgmma_m64n64k16_bf16_ss_first<1, 1>(dq, desc_at(ds_a, 0), desc_at(k_box, 0));
            #pragma unroll
            for (int kk = 1; kk < N_STEPS; ++kk)
                wgmma_m64n64k16_bf16_ss_mn_a<1>(dq, desc_at(ds_a, kk * 16 * 128), desc_at(k_box, kk * 16 * 128), 1);
            wgmma_commit();
            TRACE_END(dq, 0, step);
            TRACE_BEGIN(wait_dq);
            wgmma_wait<0>();
            wgmma_fence_operands(dq);
            TRACE_END(wait_dq, 0, step);
            // The share into this warpgroup's tile, once the previous step's reduce-add has read it
            // (a step ago: the wait is for form's sake), then to the TMA unit, added in one operation.
            const bool issuer = threadIdx.x % 128 == 0;
            const uint32_t dq_tile = dq_tiles + wg * DQ_TILE_BYTES;
            TRACE_BEGIN(wait_dq_read);
            if (issuer) bulk_wait_group_read<0>();
            named_barrier_sync<128>(DQ_BAR + wg);
            TRACE_END(wait_dq_read, 0, step);
            TRACE_BEGIN(store_dq);
            #pragma unroll
            for (int j = 0; j < DQ_REGS / 4; ++j)
                asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(dq_tile + 4 * dq_block_index(threadIdx.x % 128, 4 * j)),
                             "f"(dq[4 * j]), "f"(dq[4 * j + 1]), "f"(dq[4 * j + 2]), "f"(dq[4 * j + 3])
                             : "memory");
            fence_proxy_async_shared();  // the stores, made by ordinary instructions, before the copy engine reads them
            named_barrier_sync<128>(DQ_BAR + wg);
            TRACE_END(store_dq, 0, step);
            if (issuer) {
                int* turn = dq_turns(p) + (bh * (rows / BLOCK_M) + q0 / BLOCK_M) * CONSUMERS + wg;
                if (deterministic) {
                    TRACE_BEGIN(wait_turn);
                    wait_for_turn(turn, key_block);
                    TRACE_END(wait_turn, 0, step);
                }
                TRACE_BEGIN(add_dq);
                bulk_reduce_add_f32(p.dq_accum + ((bh * rows + q0) * 2 + wg * BLOCK_M) * BOX_COLS, dq_tile, DQ_TILE_BYTES);
                bulk_commit_group();
                TRACE_END(add_dq, 0, step);
                if (deterministic) {  // done, then the next key block's turn
                    TRACE_BEGIN(wait_dq_done);
                    bulk_wait_group<0>();
                    fence_proxy_async_global();
                    red_release_gpu_add(turn, -1);
                    TRACE_END(wait_dq_done, 0, step);
                }
            }
        }
        wgmma_fence_operands(dk);
        wgmma_fence_operands(dv);
        TRACE_BEGIN(wait_step);
        __syncthreads();  // every read of this stage's Q, dO and of dSᵀ is done: they may be overwritten
        TRACE_END(wait_step, 0, step);
    }

    if (threadIdx.x % 128 == 0) bulk_wait_group_read<0>();  // the last reduce-add has read its tile

    // dK · scale and dV, bf16, for the warp's 16 keys: rows key_row and key_row + 8, columns 8j + 2·quad.
    TRACE_BEGIN(store_dkdv);
    const int row0 = key0 + wg * WG_KEYS + warp * 16 + group;
    bf16* dK = static_cast<bf16*>(p.dk) + batch * p.dk_stride[0] + kv_head * p.dk_stride[1];
    bf16* dV = static_cast<bf16*>(p.dv) + batch * p.dv_stride[0] + kv_head * p.dv_stride[1];
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int key = row0 + half * 8;
        if (key >= p.len_k) continue;
        #pragma unroll
        for (int j = 0; j < KV_REGS / 4; ++j) {
            const int i = 4 * j + 2 * half;
            *reinterpret_cast<uint32_t*>(dK + key * p.dk_stride[2] + 8 * j + 2 * quad) =
                pack_bf16x2(dk[i] * p.scale, dk[i + 1] * p.scale);
            *reinterpret_cast<uint32_t*>(dV + key * p.dv_stride[2] + 8 * j + 2 * quad) = pack_bf16x2(dv[i], dv[i + 1]);
        }
    }
    TRACE_END(store_dkdv, 0, -1);
}

// --- 3. postprocess: dQ = scale · accumulator, from its block order ---------------------------------

// A CTA per query block: its two 16 KB blocks, each float put back at its row and column (the
// inverse of dq_block_index: the wgmma accumulator layout), times scale, rounded to bf16.
__global__ void __launch_bounds__(NUM_THREADS) dq_convert_kernel(const AttnBwdParams p) {
    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    const int warp = t / 32, group = t % 32 / 4, quad = t % 4;
    const int q0 = blockIdx.x * BLOCK_M, head = blockIdx.y, batch = blockIdx.z;
    const int64_t bh = (int64_t)batch * p.heads + head;
    const float* block = p.dq_accum + ((bh * padded_rows(p.len_q) + q0) * 2 + wg * BLOCK_M) * BOX_COLS;
    bf16* dq = static_cast<bf16*>(p.dq) + batch * p.dq_stride[0] + head * p.dq_stride[1];
    const int row = q0 + warp * 16 + group;  // and row + 8
    #pragma unroll
    for (int j = 0; j < DQ_REGS / 4; ++j) {
        const float4 a = *reinterpret_cast<const float4*>(block + dq_block_index(t, 4 * j));
        const int col = wg * BOX_COLS + 8 * j + 2 * quad;
        if (row < p.len_q)
            *reinterpret_cast<uint32_t*>(dq + row * p.dq_stride[2] + col) = pack_bf16x2(a.x * p.scale, a.y * p.scale);
        if (row + 8 < p.len_q)
            *reinterpret_cast<uint32_t*>(dq + (row + 8) * p.dq_stride[2] + col) = pack_bf16x2(a.z * p.scale, a.w * p.scale);
    }
}

// --- the host side ---------------------------------------------------------------------------------

HOPATTN_EXPORT int hopattn_backward_workspace(const AttnBwdParams* p, int64_t* row_stats_floats,
                                              int64_t* dq_accum_floats) {
    const int64_t rows = (int64_t)(p->len_q + BLOCK_M - 1) / BLOCK_M * BLOCK_M;
    // D and lse₂ per row, then the deterministic mode's turn counters (ints) per query block and half,
    // then its key-block tickets per K/V head.
    *row_stats_floats = 2 * (int64_t)p->batch * p->heads * rows + (int64_t)p->batch * p->heads * (rows / BLOCK_M) * CONSUMERS +
                        (int64_t)p->batch * p->kv_heads;  // + the key-block tickets
    *dq_accum_floats = (int64_t)p->batch * p->heads * rows * HEAD_DIM;  // both modes
    return 0;
}

HOPATTN_EXPORT int hopattn_backward_launch(const AttnBwdParams* p, cudaStream_t stream, char* err, int errlen) {
    if (p->head_dim != HEAD_DIM || p->len_q <= 0 || p->len_k <= 0 || p->kv_heads <= 0 || p->heads % p->kv_heads ||
        !p->row_stats || !p->dq_accum) {
        snprintf(err, errlen, "backward stage needs head_dim %d, len_q and len_k > 0, heads a multiple of kv_heads, "
                 "and its workspace", HEAD_DIM);
        return 1;
    }
    // Q and dO are read in boxes of a step's 64 rows, K and V in boxes of the CTA's 128: 4-D maps
    // [batch, heads, len, 128] with the caller's strides; a box past a head's length reads zeros.
    CUtensorMap q_map, k_map, v_map, do_map;
    if (make_tma_4d_bf16(&q_map, p->q, p->batch, p->heads, p->len_q, HEAD_DIM, p->q_stride, BLOCK_M, BOX_COLS, "q",
                         err, errlen) ||
        make_tma_4d_bf16(&k_map, p->k, p->batch, p->kv_heads, p->len_k, HEAD_DIM, p->k_stride, BLOCK_N, BOX_COLS, "k",
                         err, errlen) ||
        make_tma_4d_bf16(&v_map, p->v, p->batch, p->kv_heads, p->len_k, HEAD_DIM, p->v_stride, BLOCK_N, BOX_COLS, "v",
                         err, errlen) ||
        make_tma_4d_bf16(&do_map, p->dout, p->batch, p->heads, p->len_q, HEAD_DIM, p->dout_stride, BLOCK_M, BOX_COLS,
                         "dout", err, errlen))
        return 1;
    HOPATTN_CHECK(cudaFuncSetAttribute(dkdv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES), err,
                  errlen);
    const int rows = (p->len_q + BLOCK_M - 1) / BLOCK_M * BLOCK_M;
    preprocess_kernel<<<dim3(rows / PRE_ROWS, p->heads, p->batch), 128, 0, stream>>>(*p);
    HOPATTN_CHECK(cudaGetLastError(), err, errlen);
    dkdv_kernel<<<dim3((p->len_k + BLOCK_N - 1) / BLOCK_N, p->kv_heads, p->batch), NUM_THREADS, SMEM_BYTES, stream>>>(
        *p, q_map, k_map, v_map, do_map);
    HOPATTN_CHECK(cudaGetLastError(), err, errlen);
    dq_convert_kernel<<<dim3(rows / BLOCK_M, p->heads, p->batch), NUM_THREADS, 0, stream>>>(*p);
    HOPATTN_CHECK(cudaGetLastError(), err, errlen);
    return 0;
}

HOPATTN_EXPORT int hopattn_describe(KernelInfo* info, char* err, int errlen) {
    return describe_kernel(dkdv_kernel, NUM_THREADS, SMEM_BYTES, BLOCK_M, BLOCK_N, info, err, errlen);
}
