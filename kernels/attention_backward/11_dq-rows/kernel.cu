// Backward stage 11 — dQ in whole rows: the last launch, which turns the fp32 dQ accumulator into
// the caller's bf16 dQ, stages its 64 x 128 tile through shared memory and writes whole rows.
//
// Since stage 04 the accumulator is kept in the wgmma fragments' order (a thread's two rows, two
// columns of each 8), so the bulk reduce-adds can take a warpgroup's tile as stored. Stage 10's
// conversion stored each thread's fragment straight to global memory: 4-byte stores, a warp
// instruction 16 bytes into each of 8 rows, half of each 32-byte sector it touched, about 1.1 TB/s
// (Llama-3.1-8B's 8k call: 0.185 ms where cuDNN's conversion takes 0.056). Here the fragments go
// to a shared tile (rows padded by 16 bytes, so a warp's 4-byte stores hit 32 banks) and leave in
// 16-byte stores, 16 threads to a 256-byte row: every sector whole. The host refuses a dq whose
// base or strides would break a 16-byte store (the op allocates dq contiguous, so it never is).
// Everything else is stage 10's. See notes.md for what it measured.
//
// Stages 03-06's: a CTA of two consumer warpgroups holds 128 keys (64 each);
//   Sᵀ  = K Qᵀ   and  dPᵀ = V dOᵀ   (M = the warpgroup's 64 keys, N = 64 queries; A, B from shared)
//   dV += Pᵀ dO  and  dK += dSᵀ Q   (Pᵀ and dSᵀ are the accumulators above, rounded: A from registers)
//   dQ  = dS K                      (dSᵀ written to shared memory as held, read back as an MN-major A;
//                                    each warpgroup 64 of the 128 head-dim columns, over all 128 keys)
// each warpgroup's dQ share added from shared memory by one bulk reduce-add per step (04), in key
// order in the deterministic mode (05), by the producer's dQ warps (06).
#include <cuda_bf16.h>

#include <type_traits>

#include "../../attention/common/ldmatrix.cuh"
#include "../../attention/common/mbarrier.cuh"
#include "../../attention/common/tma_4d.cuh"
#include "../../attention/common/tma_store.cuh"  // bulk_commit_group, bulk_wait_group_read
#include "../../attention/common/named_barrier.cuh"
#include "../../attention/common/warp_specialize.cuh"
#include "../../attention/common/wgmma.cuh"
#include "../../attention/common/wgmma_rs.cuh"
#include "../common/abi_backward.h"
#include "../common/trace_backward.cuh"
#include "../common/bulk_copy.cuh"
#include "../common/bulk_reduce.cuh"
#include "../common/wgmma_transposed_a.cuh"

constexpr int HEAD_DIM = 128;
constexpr int BLOCK_M = 64;    // query rows per step of the main kernel (and per CTA of the conversion)
constexpr int BLOCK_N = 128;   // keys per CTA of the main kernel
constexpr int CONSUMERS = 2;   // warpgroups per CTA, 64 keys each
constexpr int WG_KEYS = BLOCK_N / CONSUMERS;
constexpr int CONSUMER_THREADS = CONSUMERS * 128;
constexpr int NUM_THREADS = 128 + CONSUMER_THREADS;  // warpgroup 0 produces, warpgroups 1 and 2 consume
constexpr int PRODUCER_REGS = 24;   // setmaxnreg.dec: two threads keep a few addresses and counters
constexpr int CONSUMER_REGS = 240;  // setmaxnreg.inc: what the producer gave up, for the consumers
static_assert(128 * PRODUCER_REGS + CONSUMER_THREADS * CONSUMER_REGS <= 65536, "register file overcommitted");
constexpr int Q_STAGES = 2;    // Q and dO of step i + 1 land while step i computes
constexpr int BOX_COLS = 64;   // a 128-byte swizzled box row holds 64 bf16: a 128-wide tile is two boxes
constexpr int SWIZZLE_ATOM = 1024;  // 8 rows x 128 bytes: the SBO of every descriptor
constexpr int KV_TILE_BYTES = BLOCK_N * HEAD_DIM * 2;
constexpr int Q_TILE_BYTES = BLOCK_M * HEAD_DIM * 2;
constexpr int DS_TILE_BYTES = BLOCK_N * BLOCK_M * 2;  // dSᵀ: [128 keys][64 queries], one box wide
constexpr int DQ_TILE_BYTES = BLOCK_M * BOX_COLS * 4;  // a warpgroup's dQ share, fp32: 16 KB
constexpr int STATS_BYTES = 2 * BLOCK_M * 4;  // per stage: the step's lse₂ and D rows, fp32
constexpr int DQ_BUFFERS = 2;  // per consumer: step i + 1's share is written while step i's is added
// mbarriers: K and V full; per stage Q/dO full and empty; per consumer and dQ buffer full and empty.
constexpr int DS_TILES = 2;    // step i's dSᵀ in tile i % 2: dQ (i − 1) reads the other one
// mbarriers: K and V full; per stage Q/dO full and empty; per consumer and dQ buffer full and empty;
// per dSᵀ tile full (both halves stored) and free (both dQ products that read it retired).
constexpr int NUM_BARRIERS = 1 + 2 * Q_STAGES + 2 * CONSUMERS * DQ_BUFFERS + 2 * DS_TILES;
constexpr int SMEM_BYTES = 2 * KV_TILE_BYTES + Q_STAGES * (2 * Q_TILE_BYTES + STATS_BYTES) + DS_TILES * DS_TILE_BYTES +
                           CONSUMERS * DQ_BUFFERS * DQ_TILE_BYTES + NUM_BARRIERS * 8 + 4;  // + the CTA's key block
// The products' turns (named barriers of 256 threads; 0 is __syncthreads): warpgroup w issues a
// step's products after bar.sync on TURN_BAR + w, and lets the other go with bar.arrive on its barrier.
constexpr int TURN_BAR = 1;
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

// --- the roles' shared state --------------------------------------------------------------------

// Where everything sits in the CTA's shared memory (byte addresses).
struct Smem {
    uint32_t k, v;            // [128 keys][128] as two [128][64] boxes, swizzled
    uint32_t q, d_o;          // Q_STAGES x [64 queries][128], two boxes each
    uint32_t ds;              // DS_TILES x dSᵀ [128 keys][64 queries], swizzled
    uint32_t dq;              // per consumer and buffer, its dQ share (dq_block_index order)
    uint32_t stats;           // Q_STAGES x (lse₂ [64], D [64]) fp32
    uint32_t kv_full;         // mbarriers, 8 bytes each
    uint32_t q_full, q_empty;             // + 8 * stage
    uint32_t dq_full, dq_empty;           // + 8 * (consumer * DQ_BUFFERS + buffer)
    uint32_t ds_full, ds_free;            // + 8 * tile
    uint32_t key_block;                   // s32: the CTA's key block

    __device__ uint32_t dq_tile(int c, int b) const { return dq + (c * DQ_BUFFERS + b) * DQ_TILE_BYTES; }
    __device__ uint32_t dq_bar(uint32_t base, int c, int b) const { return base + 8 * (c * DQ_BUFFERS + b); }
};

__device__ __forceinline__ Smem smem_layout(uint32_t base) {
    Smem s;
    s.k = base;
    s.v = s.k + KV_TILE_BYTES;
    s.q = s.v + KV_TILE_BYTES;
    s.d_o = s.q + Q_STAGES * Q_TILE_BYTES;
    s.ds = s.d_o + Q_STAGES * Q_TILE_BYTES;
    s.dq = s.ds + DS_TILES * DS_TILE_BYTES;
    s.stats = s.dq + CONSUMERS * DQ_BUFFERS * DQ_TILE_BYTES;
    s.kv_full = s.stats + Q_STAGES * STATS_BYTES;
    s.q_full = s.kv_full + 8;
    s.q_empty = s.q_full + 8 * Q_STAGES;
    s.dq_full = s.q_empty + 8 * Q_STAGES;
    s.dq_empty = s.dq_full + 8 * CONSUMERS * DQ_BUFFERS;
    s.ds_full = s.dq_empty + 8 * CONSUMERS * DQ_BUFFERS;
    s.ds_free = s.ds_full + 8 * DS_TILES;
    s.key_block = s.ds_free + 8 * DS_TILES;
    return s;
}

// The CTA's steps: every query block that sees its keys, of every query head of the K/V head's group,
// in the same order for every role.
struct Steps {
    int key_block, kv_head, batch, group_size, first_block, blocks, rows;
    __device__ int count() const { return group_size * blocks; }
    __device__ int head(int step) const { return kv_head * group_size + step / blocks; }
    __device__ int q0(int step) const { return (first_block + step % blocks) * BLOCK_M; }
};

// --- the producer's first warp: loads --------------------------------------------------------------

// K and V once; then Q, dO and the row statistics (lse₂, D) of each step into its stage, once the
// consumers' eight warps have released that stage (from the third step on: both start empty).
__device__ void load_role(const AttnBwdParams& p, const Smem& s, const Steps& steps, int key0, const CUtensorMap* q_map,
                          const CUtensorMap* k_map, const CUtensorMap* v_map, const CUtensorMap* do_map TRACE_PARAM) {
    mbarrier_arrive_expect_tx(s.kv_full, 2 * KV_TILE_BYTES);
    load_tile<BLOCK_N>(s.k, k_map, key0, steps.kv_head, steps.batch, s.kv_full);
    load_tile<BLOCK_N>(s.v, v_map, key0, steps.kv_head, steps.batch, s.kv_full);
    TRACE_MARK(load_kv, 0, -1);
    for (int step = 0; step < steps.count(); ++step) {
        const int stage = step % Q_STAGES;
        TRACE_BEGIN(wait_empty);
        if (step >= Q_STAGES) mbarrier_wait(s.q_empty + 8 * stage, (step / Q_STAGES - 1) & 1);
        TRACE_END(wait_empty, 0, step);
        const uint32_t full = s.q_full + 8 * stage;
        mbarrier_arrive_expect_tx(full, 2 * Q_TILE_BYTES + STATS_BYTES);
        const int head = steps.head(step), q0 = steps.q0(step);
        load_tile<BLOCK_M>(s.q + stage * Q_TILE_BYTES, q_map, q0, head, steps.batch, full);
        TRACE_MARK(load_q, 0, step);
        load_tile<BLOCK_M>(s.d_o + stage * Q_TILE_BYTES, do_map, q0, head, steps.batch, full);
        const int64_t bh = (int64_t)steps.batch * p.heads + head;
        const uint32_t stats = s.stats + stage * STATS_BYTES;
        bulk_load(stats, p.row_stats + ((int64_t)p.batch * p.heads + bh) * steps.rows + q0, BLOCK_M * 4, full);  // lse₂
        bulk_load(stats + BLOCK_M * 4, p.row_stats + bh * steps.rows + q0, BLOCK_M * 4, full);                   // D
        TRACE_MARK(load_do, 0, step);
    }
}

// --- the producer's second and third warps: dQ, a warp per consumer ----------------------------------

// Each step, consumer c's share: wait for its tile, add it into the accumulator with one bulk
// reduce-add, and give the tile back once the copy engine is done with it. One operation stays in
// flight while the next tile fills (cp.async.bulk.wait_group.read compiles to the same wait as the
// full completion: the tile of step i − 1 is handed back after step i's reduce-add is issued).
// Deterministic: in turn (last key block first), each reduce-add complete before the next turn.
__device__ void dq_role(const AttnBwdParams& p, const Smem& s, const Steps& steps, int c TRACE_PARAM) {
    const bool deterministic = p.deterministic != 0;
    for (int step = 0; step < steps.count(); ++step) {
        const int b = step % DQ_BUFFERS;
        const int64_t bh = (int64_t)steps.batch * p.heads + steps.head(step);
        const int q0 = steps.q0(step);
        TRACE_BEGIN(wait_dq_tile);
        mbarrier_wait(s.dq_bar(s.dq_full, c, b), (step / DQ_BUFFERS) & 1);
        TRACE_END(wait_dq_tile, 0, step);
        int* turn = dq_turns(p) + (bh * (steps.rows / BLOCK_M) + q0 / BLOCK_M) * CONSUMERS + c;
        if (deterministic) {
            TRACE_BEGIN(wait_turn);
            wait_for_turn(turn, steps.key_block);
            TRACE_END(wait_turn, 0, step);
        }
        TRACE_BEGIN(add_dq);
        bulk_reduce_add_f32(p.dq_accum + ((bh * steps.rows + q0) * 2 + c * BLOCK_M) * BOX_COLS, s.dq_tile(c, b),
                            DQ_TILE_BYTES);
        bulk_commit_group();
        TRACE_END(add_dq, 0, step);
        if (deterministic) {  // done, then the next key block's turn, and the tile back
            TRACE_BEGIN(wait_dq_done);
            bulk_wait_group<0>();
            fence_proxy_async_global();
            red_release_gpu_add(turn, -1);
            mbarrier_arrive(s.dq_bar(s.dq_empty, c, b));
            TRACE_END(wait_dq_done, 0, step);
        } else if (step > 0) {  // the previous step's operation is done: its tile back
            TRACE_BEGIN(wait_dq_read);
            bulk_wait_group_read<1>();
            mbarrier_arrive(s.dq_bar(s.dq_empty, c, (step - 1) % DQ_BUFFERS));
            TRACE_END(wait_dq_read, 0, step - 1);
        }
    }
    bulk_wait_group_read<0>();  // the last tile is read before the CTA may exit
}

// --- the consumers --------------------------------------------------------------------------------

__device__ __forceinline__ int ld_shared_s32(uint32_t addr) {
    int value;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(value) : "r"(addr) : "memory");
    return value;
}

__device__ __forceinline__ float2 ld_shared_f32x2(uint32_t addr) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
    return v;
}

// Pᵀ = 2^(Sᵀ·scale·log2 e − lse₂) in place of Sᵀ (masked: keys past len_k; causal: keys past a
// query's diagonal, only in the blocks that have either, a loop of their own), then dSᵀ = Pᵀ ∘ (dPᵀ − D); both rounded to
// bf16 pairs, the A operands of dV and dK. Thread's columns: queries q0 + 8j + 2·quad (+1), whose lse₂
// and D it reads from the stage's statistics (`stats` points at its own pair: + 32 bytes per j, D
// 256 bytes on) when it needs them, in place of holding 32 of them in registers.
__device__ __forceinline__ void softmax_gradient(float (&st)[ST_REGS], float (&dpt)[ST_REGS],
                                                 uint32_t (&p_frag)[ST_REGS / 2], uint32_t (&ds_frag)[ST_REGS / 2],
                                                 uint32_t stats, const AttnBwdParams& p, int key_row, int q0,
                                                 bool masked, int quad, int step TRACE_PARAM) {
    const float scale_log2 = p.scale * LOG2E;
    const int offset = p.len_k - p.len_q;  // causal: query i sees keys j <= i + offset
    const bool causal = p.causal != 0;
    TRACE_BEGIN(wait_qk);
    wgmma_wait<1>();
    wgmma_fence_operands(st);
    TRACE_END(wait_qk, 0, step);
    TRACE_BEGIN(softmax);
    if (!masked) {
        #pragma unroll
        for (int i = 0; i < ST_REGS; ++i) {
            const float2 lse2 = ld_shared_f32x2(stats + 32 * (i / 4));
            st[i] = exp2_approx(fmaf(st[i], scale_log2, -(i % 2 ? lse2.y : lse2.x)));  // Pᵀ
        }
    } else {
        // Which columns each of the thread's two key rows sees, as one threshold: column 8j + 2·quad
        // + e (e = 0, 1) of the step is visible to key row r when 8j + e >= first_col[r] (INT_MAX for a
        // key past len_k). A hidden element goes through ex2 from −∞ (2^−∞ = +0): a compare and a
        // select, no branch.
        int first_col[2];
        #pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int key = key_row + 8 * r;
            first_col[r] = key >= p.len_k ? INT_MAX : causal ? key - offset - q0 - 2 * quad : INT_MIN;
        }
        #pragma unroll
        for (int i = 0; i < ST_REGS; ++i) {
            const float2 lse2 = ld_shared_f32x2(stats + 32 * (i / 4));
            const float x = fmaf(st[i], scale_log2, -(i % 2 ? lse2.y : lse2.x));
            st[i] = exp2_approx(8 * (i / 4) + i % 2 >= first_col[i % 4 / 2] ? x : -INFINITY);  // Pᵀ
        }
    }
    TRACE_END(softmax, 0, step);
    TRACE_BEGIN(wait_dp);
    wgmma_wait<0>();
    wgmma_fence_operands(dpt);
    TRACE_END(wait_dp, 0, step);
    TRACE_BEGIN(ds);
    #pragma unroll
    for (int i = 0; i < ST_REGS; i += 2) {
        const float2 d = ld_shared_f32x2(stats + BLOCK_M * 4 + 32 * (i / 4));
        const float ds0 = st[i] * (dpt[i] - d.x), ds1 = st[i + 1] * (dpt[i + 1] - d.y);  // dSᵀ
        p_frag[i / 2] = pack_bf16x2(st[i], st[i + 1]);
        ds_frag[i / 2] = pack_bf16x2(ds0, ds1);
    }
}

// dSᵀ to shared memory as held: row = key, the 16-byte chunk j of a row holds queries 8j..8j+7, at
// chunk j ^ (row % 8) (the 128-byte swizzle). A warp's 32 stores of a j hit 32 different banks.
__device__ __forceinline__ void store_ds(uint32_t ds_tile, const uint32_t (&ds_frag)[ST_REGS / 2], int wg, int warp,
                                         int group, int quad) {
    #pragma unroll
    for (int j = 0; j < ST_REGS / 4; ++j) {
        const int row = wg * WG_KEYS + warp * 16 + group;
        const uint32_t at = ds_tile + row * 128 + ((j ^ group) * 16) + quad * 4;
        st_shared_b32(at, ds_frag[2 * j]);
        st_shared_b32(at + 8 * 128, ds_frag[2 * j + 1]);
    }
}

// Sᵀ = K Qᵀ of one step, once its Q and dO have landed (one commit group); and dPᵀ = V dOᵀ (another).
// Q and dO are K-major B operands (a row is a query's head dim). The two are issued apart: Sᵀ as
// soon as the step before has issued its dQ product, dPᵀ once that step's dQ share is stored.
__device__ __forceinline__ void issue_s(float (&st)[ST_REGS], const Smem& s, uint32_t k_rows, int step TRACE_PARAM) {
    const int stage = step % Q_STAGES;
    TRACE_BEGIN(wait_qdo);
    mbarrier_wait(s.q_full + 8 * stage, (step / Q_STAGES) & 1);
    TRACE_END(wait_qdo, 0, step);
    TRACE_BEGIN(qk);
    wgmma_fence();
    gemm_over_head_dim(st, k_rows, desc_lo(s.q + stage * Q_TILE_BYTES, 16));
    TRACE_END(qk, 0, step);
}
__device__ __forceinline__ void issue_dp(float (&dpt)[ST_REGS], const Smem& s, uint32_t v_rows, int step) {
    wgmma_fence();
    gemm_over_head_dim(dpt, v_rows, desc_lo(s.d_o + (step % Q_STAGES) * Q_TILE_BYTES, 16));
}

// Consumer warpgroup wg (keys wg·64.. of the CTA's 128): every step's five products; dK and dV stay
// in registers to the end, dQ's share goes to the dQ warp through a tile.
//
// Against stage 08, the dQ product of step i is issued in step i + 1, and the products are issued in
// turns. Per warpgroup, rest(i), in its turn:
//   dV, dK (i) | dSᵀ (i) stored, "full" (i) | dQ (i − 1) once "full" (i − 1) | wait<1> | Sᵀ (i + 1)
// then, out of turn: wait<1> (dQ (i − 1) retired: "free" (i − 1), its share stored), dPᵀ (i + 1) and
// the softmax of step i + 1, while the other warpgroup issues its turn. Tile i % 2 is overwritten by
// dSᵀ (i + 2) only once both dQ (i) products have retired ("free"); "full" (i − 1) was completed by the
// other warpgroup before it let this one take its turn i, so neither wait holds anything up in the
// steady state. Registers as in 08: dK, dV 128 + dQ 32 + Sᵀ 32 in flight together.
__device__ void consumer_role(const AttnBwdParams& p, const Smem& s, const Steps& steps, int key0, int wg TRACE_PARAM) {
    const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32, group = lane / 4, quad = lane % 4;
    const bool causal = p.causal != 0;
    const int offset = p.len_k - p.len_q;
    // Descriptors: this warpgroup's 64 rows of K and V as the A of Sᵀ and dPᵀ (K-major), K's box
    // `wg` as the B of dQ (MN-major: rows are keys), dSᵀ as the MN-major A of dQ.
    const uint32_t k_rows = desc_lo(s.k + wg * WG_KEYS * 128, 16);
    const uint32_t v_rows = desc_lo(s.v + wg * WG_KEYS * 128, 16);
    const uint32_t k_box = desc_lo(s.k + wg * BLOCK_N * 128, 16);
    const uint32_t ds_a = desc_lo(s.ds, 16);
    float dk[KV_REGS] = {}, dv[KV_REGS] = {};
    // Declared once: the GEMMs of every step write the same registers (no copies into place, which
    // would make ptxas wait for the wgmmas in flight).
    float st[ST_REGS], dpt[ST_REGS], dq[DQ_REGS];
    const int key_row = key0 + wg * WG_KEYS + warp * 16 + group;  // and key_row + 8
    const int count = steps.count();
    TRACE_BEGIN(wait_kv);
    mbarrier_wait(s.kv_full, 0);
    TRACE_END(wait_kv, 0, -1);
    uint32_t p_frag[ST_REGS / 2], ds_frag[ST_REGS / 2];

    // The softmax and dSᵀ of a step whose Sᵀ and dPᵀ are in flight: Pᵀ and dSᵀ in bf16 pairs, every
    // wgmma of the warpgroup retired after it.
    auto scores = [&](const int step) {
        const int q0 = steps.q0(step);
        const bool masked = key0 + BLOCK_N > p.len_k || (causal && key0 + BLOCK_N - 1 > q0 + offset);
        softmax_gradient(st, dpt, p_frag, ds_frag, s.stats + (step % Q_STAGES) * STATS_BYTES + 8 * quad, p, key_row,
                         q0, masked, quad, step TRACE_ARG);
        wgmma_fence_operands(p_frag);
        wgmma_fence_operands(ds_frag);
        TRACE_END(ds, 0, step);
    };

    // The products of step `step` in this warpgroup's turn (dV, dK, dQ (step − 1), and unless `last`
    // the next Sᵀ), then dQ (step − 1)'s share and, unless `last`, the next step's dPᵀ and scores.
    // The loop's iterations meet where no wgmma is in flight, after the scores: ptxas serialises
    // every wgmma of the kernel if one is in flight across the loop's back edge (its remark C7514),
    // or if one sits under a condition it cannot see is uniform (C7518).
    // Step −1 is a product over tile 1 whose result is never stored: the first turn issues it so that
    // every turn has the same wgmmas and waits, without a condition around them (ptxas serialises every
    // wgmma of the kernel when their waits differ by path). Its "full" wait is for the phase before the
    // barrier's first, which try_wait counts as complete. What it reads is whatever tile 1 holds —
    // possibly step 1's dSᵀ half-written by the other warpgroup, which does not wait for this read
    // ("free" is waited for from step 2 on) — and only this discarded accumulator sees it.
    auto issue_dq = [&](const int step) {  // dQ (the step's 64 queries x this warpgroup's 64 columns) = dS K
        const int tile = (step + DS_TILES) % DS_TILES;
        TRACE_BEGIN(wait_ds);
        mbarrier_wait(s.ds_full + 8 * tile, ((step + DS_TILES) / DS_TILES + 1) & 1);
        TRACE_END(wait_ds, 0, step);
        TRACE_BEGIN(dq);
        wgmma_fence();
        const uint32_t at = tile * DS_TILE_BYTES;
        wgmma_m64n64k16_bf16_ss_first<1, 1>(dq, desc_at(ds_a, at), desc_at(k_box, 0));
        #pragma unroll
        for (int kk = 1; kk < N_STEPS; ++kk)
            wgmma_m64n64k16_bf16_ss_mn_a<1>(dq, desc_at(ds_a, at + kk * 16 * 128), desc_at(k_box, kk * 16 * 128), 1);
        wgmma_commit();
        TRACE_END(dq, 0, step);
    };
    // dQ (step)'s share into tile b once the dQ warp has handed it back (from the third step on), then
    // to the dQ warp: every thread's stores, fenced for the copy engine, then its arrival. Its product
    // has retired: the dSᵀ tile it read is free as far as this warpgroup goes.
    auto store_dq = [&](const int step) {
        const int b = step % DQ_BUFFERS;
        mbarrier_arrive(s.ds_free + 8 * (step % DS_TILES));
        TRACE_BEGIN(wait_dq_read);
        if (step >= DQ_BUFFERS) mbarrier_wait(s.dq_bar(s.dq_empty, wg, b), (step / DQ_BUFFERS - 1) & 1);
        TRACE_END(wait_dq_read, 0, step);
        TRACE_BEGIN(store_dq);
        const uint32_t tile = s.dq_tile(wg, b);
        #pragma unroll
        for (int j = 0; j < DQ_REGS / 4; ++j)
            asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(tile + 4 * dq_block_index(t, 4 * j)),
                         "f"(dq[4 * j]), "f"(dq[4 * j + 1]), "f"(dq[4 * j + 2]), "f"(dq[4 * j + 3])
                         : "memory");
        fence_proxy_async_shared();
        mbarrier_arrive(s.dq_bar(s.dq_full, wg, b));
        TRACE_END(store_dq, 0, step);
    };
    auto rest = [&](const int step, auto last) {
        constexpr bool LAST = decltype(last)::value;
        const int stage = step % Q_STAGES, tile = step % DS_TILES;
        const uint32_t q_tile = s.q + stage * Q_TILE_BYTES, do_tile = s.d_o + stage * Q_TILE_BYTES;

        // This warpgroup's turn: the other has issued its products of the step before (its turn ends
        // with the barrier this one syncs on). Warpgroup 0's first turn waits for nothing.
        TRACE_BEGIN(wait_turn);
        if (wg == 1 || step > 0) named_barrier_sync<CONSUMER_THREADS>(TURN_BAR + wg);
        TRACE_END(wait_turn, 0, step);

        // dV += Pᵀ dO and dK += dSᵀ Q: dO and Q are MN-major B operands (rows are queries), two boxes wide.
        TRACE_BEGIN(dvdk);
        wgmma_fence();
        const uint32_t do_mn = desc_lo(do_tile, Q_TILE_BYTES / 2), q_mn = desc_lo(q_tile, Q_TILE_BYTES / 2);
        #pragma unroll
        for (int k = 0; k < M_STEPS; ++k)
            wgmma_m64n128k16_bf16_rs<1>(dv, p_frag[4 * k], p_frag[4 * k + 1], p_frag[4 * k + 2], p_frag[4 * k + 3],
                                        desc_at(do_mn, k * 16 * 128), 1);
        #pragma unroll
        for (int k = 0; k < M_STEPS; ++k)
            wgmma_m64n128k16_bf16_rs<1>(dk, ds_frag[4 * k], ds_frag[4 * k + 1], ds_frag[4 * k + 2], ds_frag[4 * k + 3],
                                        desc_at(q_mn, k * 16 * 128), 1);
        wgmma_commit();
        TRACE_END(dvdk, 0, step);

        // dSᵀ (step) into its tile, once both dQ (step − 2) products that read it have retired.
        TRACE_BEGIN(wait_ds_free);
        if (step >= DS_TILES) mbarrier_wait(s.ds_free + 8 * tile, (step / DS_TILES - 1) & 1);
        TRACE_END(wait_ds_free, 0, step);
        TRACE_BEGIN(store_ds);
        store_ds(s.ds + tile * DS_TILE_BYTES, ds_frag, wg, warp, group, quad);
        fence_proxy_async_shared();  // the stores, made by ordinary instructions, before wgmma reads them
        mbarrier_arrive(s.ds_full + 8 * tile);
        TRACE_END(store_ds, 0, step);

        issue_dq(step - 1);

        // dV and dK retired (dQ may still run): the stage's Q and dO are read for the last time, and
        // Pᵀ and dSᵀ's registers are free for the next step's Sᵀ.
        TRACE_BEGIN(wait_dvdk);
        wgmma_wait<1>();
        wgmma_fence_operands(dk);
        wgmma_fence_operands(dv);
        TRACE_END(wait_dvdk, 0, step);
        if (lane == 0) mbarrier_arrive(s.q_empty + 8 * stage);  // this warp's products that read Q and dO have retired

        if constexpr (!LAST) issue_s(st, s, k_rows, step + 1 TRACE_ARG);
        // The turn ends: the other warpgroup may issue (its last turn lets nobody go).
        if (wg == 0 || !LAST) named_barrier_arrive<CONSUMER_THREADS>(TURN_BAR + 1 - wg);

        TRACE_BEGIN(wait_dq);
        wgmma_wait<LAST ? 0 : 1>();
        wgmma_fence_operands(dq);
        TRACE_END(wait_dq, 0, step - 1);
        if (step > 0) store_dq(step - 1);

        // The next step's dPᵀ (its issue falls in that step's wait_qk event), softmax and dSᵀ.
        if constexpr (!LAST) {
            issue_dp(dpt, s, v_rows, step + 1);
            scores(step + 1);
        }
    };

    // Every CTA has a step: a causal key block's first query block is below the last (key0 < len_k),
    // and the group has a query head. The prologue: step 0's Sᵀ, dPᵀ and scores.
    issue_s(st, s, k_rows, 0 TRACE_ARG);
    issue_dp(dpt, s, v_rows, 0);
    scores(0);
    for (int step = 0; step + 1 < count; ++step) rest(step, std::false_type{});
    rest(count - 1, std::true_type{});
    // The last step's dQ, alone (its dSᵀ tile full once the other warpgroup has stored its half).
    issue_dq(count - 1);
    wgmma_wait<0>();
    wgmma_fence_operands(dq);
    store_dq(count - 1);

    // dK · scale and dV, bf16, for the warp's 16 keys: rows key_row and key_row + 8, columns 8j + 2·quad.
    TRACE_BEGIN(store_dkdv);
    bf16* dK = static_cast<bf16*>(p.dk) + steps.batch * p.dk_stride[0] + steps.kv_head * p.dk_stride[1];
    bf16* dV = static_cast<bf16*>(p.dv) + steps.batch * p.dv_stride[0] + steps.kv_head * p.dv_stride[1];
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int key = key_row + half * 8;
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

// --- the kernel: a CTA per 128 keys of a K/V head, its roles --------------------------------------

struct CtaTile {
    int key_block, kv_head, batch;
};

constexpr int WINDOW_WAVES = 2;  // waves of CTAs a window of (K/V head, batch) pairs fills

// The CTA's key block, K/V head and batch. Default causal mode: from the linear CTA index, a window
// of pairs at a time, in it the key blocks from 0 (the heaviest) up, the window's pairs fastest.
// Otherwise blockIdx's (x, y, z); the deterministic mode then replaces the key block by its head's
// ticket (and a grid of 2^32 CTAs or more, which a 32-bit linear index cannot count, keeps them too).
__device__ __forceinline__ CtaTile cta_tile(const AttnBwdParams& p) {
    const bool counted = (uint64_t)gridDim.x * gridDim.y * gridDim.z <= 0xffffffffu;  // 32-bit index below
    if (!p.causal || p.deterministic || !counted) return {int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
    unsigned sms;
    asm("mov.u32 %0, %%nsmid;" : "=r"(sms));  // an upper bound on the SM count, all a window needs
    const unsigned key_blocks = gridDim.x, pairs = gridDim.y * gridDim.z;
    const unsigned window = min(pairs, max(1u, (WINDOW_WAVES * sms + key_blocks - 1) / key_blocks));
    const unsigned linear = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned first_pair = linear / (window * key_blocks) * window;
    const unsigned in_window = linear % (window * key_blocks);
    const unsigned width = min(window, pairs - first_pair);  // the last window may hold fewer pairs
    const unsigned pair = first_pair + in_window % width;
    return {int(in_window / width), int(pair % gridDim.y), int(pair / gridDim.y)};
}

__global__ void __launch_bounds__(NUM_THREADS, 1) dkdv_kernel(const __grid_constant__ AttnBwdParams p,
                                                              const __grid_constant__ CUtensorMap q_map,
                                                              const __grid_constant__ CUtensorMap k_map,
                                                              const __grid_constant__ CUtensorMap v_map,
                                                              const __grid_constant__ CUtensorMap do_map) {
    TRACE_INIT();
    extern __shared__ __align__(1024) unsigned char smem[];
    const Smem s = smem_layout(smem_addr(smem));
    const CtaTile tile = cta_tile(p);
    if (threadIdx.x == 0) {
        // The CTA's key block: cta_tile's, or in the deterministic mode its K/V head's next ticket,
        // counted from the last key block down.
        st_shared_b32(s.key_block, p.deterministic ? int(gridDim.x) - 1 - atomicAdd(key_block_tickets(p) + tile.batch * p.kv_heads + tile.kv_head, 1)
                                                   : tile.key_block);
        mbarrier_init(s.kv_full, 1);
        for (int st = 0; st < Q_STAGES; ++st) {
            mbarrier_init(s.q_full + 8 * st, 1);                     // the loader's arrive.expect_tx (+ the bytes)
            mbarrier_init(s.q_empty + 8 * st, CONSUMER_THREADS / 32);  // one arrival per consumer warp
        }
        for (int c = 0; c < CONSUMERS; ++c)
            for (int b = 0; b < DQ_BUFFERS; ++b) {
                mbarrier_init(s.dq_bar(s.dq_full, c, b), 128);  // every thread of consumer c, after its stores
                mbarrier_init(s.dq_bar(s.dq_empty, c, b), 1);   // consumer c's dQ warp, once the copy engine is done
            }
        for (int b = 0; b < DS_TILES; ++b) {
            mbarrier_init(s.ds_full + 8 * b, CONSUMER_THREADS);  // every consumer thread, after its dSᵀ stores
            mbarrier_init(s.ds_free + 8 * b, CONSUMER_THREADS);  // every consumer thread, its dQ product retired
        }
        fence_proxy_async_shared();  // the copy engine must see the initialised barriers
    }
    __syncthreads();  // the last CTA-wide barrier: from here on the roles meet only on mbarriers

    Steps steps;
    steps.key_block = ld_shared_s32(s.key_block);
    const int key0 = steps.key_block * BLOCK_N;
    steps.kv_head = tile.kv_head;
    steps.batch = tile.batch;
    steps.group_size = p.heads / p.kv_heads;
    steps.rows = padded_rows(p.len_q);
    steps.first_block = first_query_block(key0, p.len_q, p.len_k, p.causal != 0);
    steps.blocks = steps.rows / BLOCK_M - steps.first_block;

    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        setmaxnreg_dec<PRODUCER_REGS>();
        const int warp = threadIdx.x / 32;
        if (warp == 0 && threadIdx.x % 32 == 0) load_role(p, s, steps, key0, &q_map, &k_map, &v_map, &do_map TRACE_ARG);
        if (warp >= 1 && warp <= CONSUMERS && threadIdx.x % 32 == 0) dq_role(p, s, steps, warp - 1 TRACE_ARG);
    } else {
        setmaxnreg_inc<CONSUMER_REGS>();
        consumer_role(p, s, steps, key0, wg - 1 TRACE_ARG);
    }
}

// --- 3. postprocess: dQ = scale · accumulator, from its block order ---------------------------------

// A CTA per query block: its two 16 KB blocks, each float put back at its row and column (the
// inverse of dq_block_index: the wgmma accumulator layout), times scale, rounded to bf16.
// dQ = scale · the fp32 accumulator, in bf16, written in whole rows. A thread's share of the
// accumulator is the wgmma fragment's: two rows, two columns of each 8. Stored straight to global
// memory (stage 10), each warp store wrote 16 bytes into each of 8 rows, half of each 32-byte sector
// it touched; here the CTA's 64 x 128 tile goes through shared memory (rows padded by 16 bytes, so
// a warp's 4-byte stores hit 32 banks), and leaves as 16-byte stores, 16 threads to a 256-byte row.
constexpr int DQ_ROW_PITCH = HEAD_DIM * 2 + 16;  // bytes per row of the staging tile

__global__ void __launch_bounds__(CONSUMER_THREADS) dq_convert_kernel(const AttnBwdParams p) {
    __shared__ __align__(16) unsigned char tile[BLOCK_M * DQ_ROW_PITCH];
    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    const int warp = t / 32, group = t % 32 / 4, quad = t % 4;
    const int q0 = blockIdx.x * BLOCK_M, head = blockIdx.y, batch = blockIdx.z;
    const int64_t bh = (int64_t)batch * p.heads + head;
    const float* block = p.dq_accum + ((bh * padded_rows(p.len_q) + q0) * 2 + wg * BLOCK_M) * BOX_COLS;
    const int row = warp * 16 + group;  // of the tile, and row + 8
    #pragma unroll
    for (int j = 0; j < DQ_REGS / 4; ++j) {
        const float4 a = *reinterpret_cast<const float4*>(block + dq_block_index(t, 4 * j));
        const int col = wg * BOX_COLS + 8 * j + 2 * quad;
        *reinterpret_cast<uint32_t*>(tile + row * DQ_ROW_PITCH + col * 2) = pack_bf16x2(a.x * p.scale, a.y * p.scale);
        *reinterpret_cast<uint32_t*>(tile + (row + 8) * DQ_ROW_PITCH + col * 2) =
            pack_bf16x2(a.z * p.scale, a.w * p.scale);
    }
    __syncthreads();
    bf16* dq = static_cast<bf16*>(p.dq) + batch * p.dq_stride[0] + head * p.dq_stride[1];
    constexpr int CHUNKS = HEAD_DIM * 2 / 16;  // 16-byte pieces of a row
    #pragma unroll
    for (int i = threadIdx.x; i < BLOCK_M * CHUNKS; i += CONSUMER_THREADS) {
        const int r = i / CHUNKS, c = i % CHUNKS;
        if (q0 + r < p.len_q)
            *reinterpret_cast<uint4*>(dq + (int64_t)(q0 + r) * p.dq_stride[2] + c * 8) =
                *reinterpret_cast<const uint4*>(tile + r * DQ_ROW_PITCH + c * 16);
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
    // dQ leaves in 16-byte stores: its base and row stride must allow them (the op allocates dq
    // contiguous, so they do).
    if (reinterpret_cast<uintptr_t>(p->dq) % 16 || p->dq_stride[2] % 8 || p->dq_stride[1] % 8 || p->dq_stride[0] % 8) {
        snprintf(err, errlen, "backward stage needs dq 16-byte aligned with strides that are multiples of 8 elements");
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
    dq_convert_kernel<<<dim3(rows / BLOCK_M, p->heads, p->batch), CONSUMER_THREADS, 0, stream>>>(*p);
    HOPATTN_CHECK(cudaGetLastError(), err, errlen);
    return 0;
}

HOPATTN_EXPORT int hopattn_describe(KernelInfo* info, char* err, int errlen) {
    return describe_kernel(dkdv_kernel, NUM_THREADS, SMEM_BYTES, BLOCK_M, BLOCK_N, info, err, errlen);
}
