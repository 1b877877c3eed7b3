// Stage 21 — the maximum deferred: an unmasked tile's exponentials go first, the row sums check them after.
//
// Until stage 20, each K/V tile's softmax starts with its row maxima: 64 FMNMX per thread over the
// tile's scores, a quad reduction (four shuffles), the growth test against the running maximum and
// a warp vote, all before the first exponential. In the SASS, 98 instructions between the QK's
// completion and the first MUFU.EX2, on the one path the loop is bound by (stage 19's notes). Yet
// the maximum is only there to keep the exponentials in range, and stage 06 already lets it go
// stale: the exponentials need a reference close enough to the maximum, not the maximum itself.
//
// So here, on an unmasked tile after a tile's first, every exponential is taken against the row's
// reference (its maximum so far) without looking at the tile's scores first. The row sums, computed
// anyway, tell afterwards whether that was safe: a per-thread sum at most 2^24 means every
// exponential is at most 2^24, well within bf16's and fp32's range (the final division cancels any
// common factor exactly, as with the stale maximum). Larger but below 2^64: the row is rebased on
// its largest per-thread sum, a slow path that takes scores grown by 2^19 or so over the reference
// (or a row summed over tens of millions of keys). At 2^64 or more, infinite or NaN (an exponential
// near or past fp32's 2^128): the warp recomputes the tile's scores with mma.sync from Q and K in
// shared memory (K is released only after the check) and takes the exact path. Masked tiles and
// each output tile's first K/V tile keep the exact softmax.
//
// Everything else is stage 20's: the grouped K/V heads, the log-sum-exp, the schedule, the pipeline.
#include <cuda_bf16.h>

#include <type_traits>

#include "../common/abi.h"
#include "../common/ldmatrix.cuh"
#include "../common/mbarrier.cuh"
#include "../common/named_barrier.cuh"
#include "../common/mma_sm80.cuh"  // quad_max, quad_sum: the accumulator rows are spread over quads as before
#include "../common/tma_4d.cuh"
#include "../common/tma_store.cuh"
#include "../common/trace.cuh"
#include "../common/wgmma.cuh"
#include "../common/wgmma_rs.cuh"
#include "../common/warp_specialize.cuh"

constexpr int HEAD_DIM = 128;
constexpr int WG_ROWS = 64;  // query rows per consumer warpgroup: the M of one wgmma
constexpr int CONSUMERS = 2;  // consumer warpgroups per CTA, sharing every K/V tile
constexpr int BLOCK_M = CONSUMERS * WG_ROWS;  // query rows per CTA
constexpr int BLOCK_N = 128;  // key/value rows per iteration
constexpr int NUM_THREADS = (1 + CONSUMERS) * 128;  // warpgroup 0 produces, warpgroups 1 and 2 consume
constexpr int CONSUMER_WARPS = CONSUMERS * 4;  // arrivals on an empty barrier: one per consumer warp
constexpr int KV_STAGES = 2;  // per ring: K and V have a ring of two buffers each, with their own barriers
constexpr int SCHED_STAGES = 2;  // tile-id ring from the producer to the consumers: the next tile is known a tile ahead
constexpr int HEAD_GROUP_BYTES = 24 << 20;  // K + V of the heads in flight together: about half of the 50 MB L2
constexpr int Q_STAGES = 2;   // Q ring: the Q of output tile i + 1 lands while the consumers still read tile i's
constexpr int PRODUCER_REGS = 24;   // setmaxnreg.dec: the producer keeps a few addresses and a counter
constexpr int CONSUMER_REGS = 240;  // setmaxnreg.inc: what the producer gave up, shared by the consumers
constexpr int BOX_COLS = 64;  // a 128-byte swizzled box row holds 64 bf16: a tile is two boxes side by side
constexpr int Q_TILE_BYTES = BLOCK_M * HEAD_DIM * 2;
constexpr int KV_TILE_BYTES = BLOCK_N * HEAD_DIM * 2;
constexpr int O_TILE_BYTES = BLOCK_M * HEAD_DIM * 2;  // bf16 staging of O for the TMA store: 16 KB per consumer
constexpr int NUM_BARRIERS = 2 * Q_STAGES + 4 * KV_STAGES + 2 * SCHED_STAGES;  // a "full" and an "empty" barrier per Q, K, V buffer and tile slot
constexpr int SMEM_BYTES =
    Q_STAGES * Q_TILE_BYTES + KV_STAGES * 2 * KV_TILE_BYTES + O_TILE_BYTES + NUM_BARRIERS * 8 + SCHED_STAGES * 4;

constexpr int K_STEPS = HEAD_DIM / 16;  // k-steps of the QKᵀ product
constexpr int S_REGS = BLOCK_N / 2;     // fp32 accumulators per thread of S (64 x BLOCK_N per warpgroup)
constexpr int O_REGS = HEAD_DIM / 2;    // fp32 accumulators per thread of O (64 x 128)
constexpr int P_REGS = BLOCK_N / 4;     // bf16x2 registers per thread of P (64 x BLOCK_N): S's, halved
constexpr int PV_STEPS = BLOCK_N / 16;  // k-steps of the PV product, four of P's registers each
constexpr int SWIZZLE_ATOM = 1024;      // 8 rows x 128 bytes: the SBO of every descriptor
constexpr float RESCALE_THRESHOLD = 8.f;  // log2 of the growth tolerated before rescaling
constexpr float SUM_LIMIT = 16777216.f;  // 2^24: a per-thread row sum above it rebases the row
constexpr float OVERFLOW_LIMIT = 18446744073709551616.f;  // 2^64: a per-thread sum at or above it (or not
                                                         // finite) recomputes the tile: a rebase stays exact
constexpr int PINGPONG_BAR = 1;  // named barrier PINGPONG_BAR + c: "consumer c may issue its next GEMM" (0 is __syncthreads)
constexpr int PINGPONG_THREADS = 2 * 128;  // per phase: the waiting consumer's bar.sync + the other's bar.arrive
constexpr int EPILOGUE_BAR = 3;  // named barrier EPILOGUE_BAR + c: consumer c's own 128 threads around its O staging
constexpr int EPILOGUE_THREADS = 128;

// The CTA starts with 65536 / 384 = 170 -> 168 registers per thread (ptxas's budget under
// __launch_bounds__(384, 1)); the consumers can only take what the producer gives back.
static_assert(128 * PRODUCER_REGS + CONSUMERS * 128 * CONSUMER_REGS <= 65536, "register file overcommitted");
static_assert(SMEM_BYTES <= 227 * 1024, "more shared memory than one block may have on sm_90");

using bf16 = __nv_bfloat16;

// One thread starts the copy of ROWS x 128 tile rows (row `row0` on of head `head` of batch `batch`):
// one TMA per 64-column box, both completing on `bar`, which the caller has told to expect the
// tile's bytes (rows past the head's length come as zeros and count too).
template <int ROWS>
__device__ __forceinline__ void load_tile(uint32_t tile, const CUtensorMap* map, int row0, int head, int batch,
                                          uint32_t bar) {
    #pragma unroll
    for (int box = 0; box < HEAD_DIM / BOX_COLS; ++box)
        tma_load_4d(tile + box * ROWS * BOX_COLS * 2, map, box * BOX_COLS, row0, head, batch, bar);
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

// The descriptor of an operand at `byte_offset` from the start of its tile, given the low word of
// the tile's own descriptor: the high word (stride byte offset, 128-byte swizzle) is the same for
// every operand here, and within a tile only the start address moves. byte_offset is a
// compile-time constant at every call, so this is one add.
__device__ __forceinline__ uint64_t desc_at(uint32_t tile_desc_lo, uint32_t byte_offset) {
    constexpr uint64_t high = make_smem_desc_sw128(0, 0, SWIZZLE_ATOM) & 0xffffffff00000000ull;
    return high | (tile_desc_lo + (byte_offset >> 4));
}
// The low word of a tile's descriptor: start address and leading byte offset.
__device__ __forceinline__ uint32_t desc_lo(uint32_t smem_addr, uint32_t lbo_bytes) {
    return uint32_t(make_smem_desc_sw128(smem_addr, lbo_bytes, SWIZZLE_ATOM));
}

// One 32-bit load from shared memory at a byte address (the tile-id ring).
__device__ __forceinline__ int ld_shared_s32(uint32_t addr) {
    int value;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(value) : "r"(addr) : "memory");
    return value;
}

// Output tile number `out_tile` in the schedule's order, and what the masks leave of its K/V loop.
// The order: groups of `head_group` (batch, head) pairs, one after the other; within a group the
// last q-block of every head, then the one before, ... (the causal mask makes q-block m cost m + 1
// K/V tiles at len_q = len_k: longest first), heads fastest.
struct OutTile {
    int batch, head;
    int kv_head;    // the K/V head its query head reads: head / (heads / kv_heads)
    int m0;         // its first query row
    int kv_tiles;   // K/V tiles it reads: 0 when none of its rows sees a key
    int mask_from;  // the first K/V tile holding a score some row of it must not see
};

template <bool COMPUTED_ORDER>
__device__ __forceinline__ OutTile describe_tile(int out_tile, int q_blocks, const AttnParams& p) {
    OutTile t;
    if constexpr (COMPUTED_ORDER) {  // no mask, every tile costs the same: stage 17's order, head by head
        const int bh = out_tile / q_blocks;
        t.batch = bh / p.heads;
        t.head = bh % p.heads;
        t.m0 = (out_tile % q_blocks) * BLOCK_M;
    } else {
        // Heads whose K and V fit in HEAD_GROUP_BYTES together; a K/V head serves `group` query heads.
        const int group = p.heads / p.kv_heads;
        const int head_group = max(
            1, min(p.batch * p.heads, int(HEAD_GROUP_BYTES / (int64_t(p.len_k) * HEAD_DIM * 2 * 2) * group)));
        const int group_tiles = head_group * q_blocks;
        const int first_bh = out_tile / group_tiles * head_group, r = out_tile % group_tiles;
        const int heads_here = min(head_group, p.batch * p.heads - first_bh);  // the last group may be smaller
        const int bh = first_bh + r % heads_here;
        t.batch = bh / p.heads;
        t.head = bh % p.heads;
        t.m0 = (q_blocks - 1 - r / heads_here) * BLOCK_M;
    }
    t.kv_head = t.head / (p.heads / p.kv_heads);
    // Causal: row i sees keys j <= i + len_k - len_q. The block's last row sees the most keys and
    // its first row the fewest; keys past len_k do not exist.
    const int offset = p.len_k - p.len_q;
    const int seen = p.causal ? min(p.len_k, t.m0 + BLOCK_M + offset) : p.len_k;
    const int seen_by_all = p.causal ? min(p.len_k, t.m0 + 1 + offset) : p.len_k;
    t.kv_tiles = (max(seen, 0) + BLOCK_N - 1) / BLOCK_N;
    t.mask_from = max(seen_by_all, 0) / BLOCK_N;
    return t;
}

// One CTA per SM: setmaxnreg needs the register count at entry to be known (the launch bounds fix
// it at 168), and the consumers' 240 registers per thread leave no room for a second CTA. The grid
// is the SM count (at most the number of output tiles): each CTA loops over output tiles.
// COMPUTED_ORDER: CTA j takes tiles j, j + gridDim.x, ... in stage 17's order (no counter; launches
// without a mask); otherwise tiles are claimed from the counter in the grouped longest-first order.
template <bool COMPUTED_ORDER>
__global__ void __launch_bounds__(NUM_THREADS, 1) attention_kernel(const __grid_constant__ CUtensorMap q_map,
                                                                 const __grid_constant__ CUtensorMap k_map,
                                                                 const __grid_constant__ CUtensorMap v_map,
                                                                 const __grid_constant__ CUtensorMap o_map,
                                                                 const AttnParams p, int* tile_counter) {
    const int warp = threadIdx.x / 32;  // 0..11: warps 0-3 produce, 4-7 and 8-11 are the two consumers
    const int lane = threadIdx.x % 32;
    const int wg = threadIdx.x / 128;   // 0: producer; 1, 2: consumer wg - 1, CTA rows 64 (wg - 1) ..
    const int group = lane / 4;  // accumulator row within the warp's 8-row half
    const int quad = lane % 4;   // accumulator column pair
    TRACE_INIT();

    // The dynamic tile scheduler: tiles are numbered in describe_tile's order; CTA j starts with
    // tile j, and the producer claims each next one from the global counter (gridDim.x + the
    // counter's old value) and hands it to the consumers through the tile-id ring.
    const int q_blocks = (p.len_q + BLOCK_M - 1) / BLOCK_M;  // the last one may run past len_q
    const int num_out_tiles = p.batch * p.heads * q_blocks;

    // 224 KB of tiles and the mbarriers after them. The 128-byte swizzle needs every box (and every
    // wgmma swizzle atom) to start at a multiple of 1024 bytes; all tile sizes are multiples of 1024.
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t q_tiles = smem_addr(smem);                     // + qb * Q_TILE_BYTES: 128 rows, two 128 x 64 boxes
    const uint32_t k_tiles = q_tiles + Q_STAGES * Q_TILE_BYTES;    // + stage * KV_TILE_BYTES
    const uint32_t v_tiles = k_tiles + KV_STAGES * KV_TILE_BYTES;  // + stage * KV_TILE_BYTES
    const uint32_t o_tile = v_tiles + KV_STAGES * KV_TILE_BYTES;  // + consumer * O_TILE_BYTES / 2: two 64 x 64 boxes
    const uint32_t q_full = o_tile + O_TILE_BYTES;  // q_full + 8 * qb: Q of buffer qb has landed
    const uint32_t q_empty = q_full + 8 * Q_STAGES;     // q_empty + 8 * qb: every consumer warp is done with qb
    const uint32_t k_full = q_empty + 8 * Q_STAGES;    // k_full + 8 * b: K of buffer b has landed
    const uint32_t k_empty = k_full + 8 * KV_STAGES;   // k_empty + 8 * b: every consumer warp's QK on b has retired
    const uint32_t v_full = k_empty + 8 * KV_STAGES;   // v_full + 8 * b: V of buffer b has landed
    const uint32_t v_empty = v_full + 8 * KV_STAGES;   // v_empty + 8 * b: every consumer warp's PV on b has retired
    const uint32_t sched_full = v_empty + 8 * KV_STAGES;      // sched_full + 8 * i: slot i holds the next tile id
    const uint32_t sched_empty = sched_full + 8 * SCHED_STAGES;  // sched_empty + 8 * i: every consumer thread has read slot i
    const uint32_t tile_ids = sched_empty + 8 * SCHED_STAGES;    // + 4 * i: slot i (an output tile, or -1: no more)

    if (threadIdx.x == 0) {
        if (q_tiles % 1024) __trap();  // the swizzle and the descriptors below would not hold
        #pragma unroll
        for (int qb = 0; qb < Q_STAGES; ++qb) {
            mbarrier_init(q_full + 8 * qb, 1);                // the producer's arrive.expect_tx (+ Q's bytes)
            mbarrier_init(q_empty + 8 * qb, CONSUMER_WARPS);  // one arrival per consumer warp, after its tile
        }
        #pragma unroll
        for (int b = 0; b < KV_STAGES; ++b) {
            mbarrier_init(k_full + 8 * b, 1);                // the producer's arrive.expect_tx (+ the bytes)
            mbarrier_init(k_empty + 8 * b, CONSUMER_WARPS);  // one arrival per consumer warp
            mbarrier_init(v_full + 8 * b, 1);
            mbarrier_init(v_empty + 8 * b, CONSUMER_WARPS);
        }
        #pragma unroll
        for (int i = 0; i < SCHED_STAGES; ++i) {
            mbarrier_init(sched_full + 8 * i, 1);                // the producer's arrival after writing the id
            mbarrier_init(sched_empty + 8 * i, CONSUMERS * 128);  // one arrival per consumer thread once it has read it
        }
        fence_proxy_async_shared();  // the copy engine must see the initialised barriers
    }
    __syncthreads();  // the last CTA-wide barrier: from here on the roles meet only on mbarriers

    if (wg == 0) {
        // Producer. The whole warpgroup gives up its registers (setmaxnreg is warpgroup-wide), then
        // one thread of warp 0 issues every copy; the other 127 threads have nothing left to do.
        setmaxnreg_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            // Bit b: parity of the next completion of k_empty[b] (v_empty[b]) to wait for. A
            // buffer's first use needs no wait (it starts empty); its n-th refill waits for the n-th
            // completion of its empty barrier (n = 0, 1, ...), i.e. parity n % 2, then flips the
            // bit. q_empty_phase does the same for the two Q buffers. None is reset between output
            // tiles: the rings run on across them, and `it` counts this CTA's K/V tiles so far.
            uint32_t k_empty_phase = 0, v_empty_phase = 0, q_empty_phase = 0;
            // One tile of K or V into its ring: buffer n % 2 for the CTA's n-th tile of that ring.
            const auto load_kv = [&](const CUtensorMap* map, uint32_t tiles, uint32_t full, uint32_t empty,
                                     uint32_t& empty_phase, int n, int row, int head, int batch) {
                const int b = n % KV_STAGES;
                if (n >= KV_STAGES) {
                    TRACE_BEGIN(wait_empty);
                    mbarrier_wait(empty + 8 * b, (empty_phase >> b) & 1);
                    TRACE_END(wait_empty, -1, n);
                    empty_phase ^= 1u << b;
                }
                mbarrier_arrive_expect_tx(full + 8 * b, KV_TILE_BYTES);
                load_tile<BLOCK_N>(tiles + b * KV_TILE_BYTES, map, row, head, batch, full + 8 * b);
            };
            int it = 0;
            // The V tile not issued yet (v_row < 0: none), one behind K: issued after K(it + 1).
            int v_row = -1, v_head = 0, v_batch = 0;
            int local = 0;  // output tiles with work this CTA has started: Q buffer local % Q_STAGES
            for (int n = 0, out_tile = blockIdx.x;; ++n) {
                // Publish the tile (or -1: none left) in slot n % 2, once the consumers have read
                // what that slot held two tiles ago. The mbarrier arrival releases the st.shared
                // to the consumers' waits.
                // (A computed order needs no ring: the consumers compute the same ids.)
                if constexpr (!COMPUTED_ORDER) {
                    // First the V still held back: the consumers cannot finish the last tile, and so
                    // cannot read the ids that free this slot, without it. (Held back across the ids
                    // of two empty tiles, it deadlocked: see notes.md.) Every wait of the producer is
                    // then for consumer work whose loads have all been issued.
                    if (v_row >= 0) {
                        load_kv(&v_map, v_tiles, v_full, v_empty, v_empty_phase, it - 1, v_row, v_head, v_batch);
                        TRACE_MARK(load_v, local - 1, v_row / BLOCK_N);
                        v_row = -1;
                    }
                    const int slot = n % SCHED_STAGES;
                    TRACE_BEGIN(wait_empty);
                    if (n >= SCHED_STAGES) mbarrier_wait(sched_empty + 8 * slot, (n / SCHED_STAGES - 1) & 1);
                    TRACE_END(wait_empty, local, -1);
                    st_shared_b32(tile_ids + 4 * slot, out_tile < num_out_tiles ? out_tile : -1);
                    mbarrier_arrive(sched_full + 8 * slot);
                }
                if (out_tile >= num_out_tiles) break;
                // Claim the next tile now: the atomic's round trip hides behind this tile's loads.
                const int next_tile =
                    COMPUTED_ORDER ? out_tile + int(gridDim.x) : int(gridDim.x) + atomicAdd(tile_counter, 1);
                const OutTile t = describe_tile<COMPUTED_ORDER>(out_tile, q_blocks, p);
                out_tile = next_tile;
                if (t.kv_tiles == 0) continue;  // no row of it sees a key: the consumers write zeros
                // Q of this tile: its buffer last held the Q of tile local - 2, released by all
                // eight consumer warps once that tile's last wgmma had retired.
                const int qb = local % Q_STAGES;
                if (local >= Q_STAGES) {
                    TRACE_BEGIN(wait_empty);
                    mbarrier_wait(q_empty + 8 * qb, (q_empty_phase >> qb) & 1);
                    TRACE_END(wait_empty, local, -1);
                    q_empty_phase ^= 1u << qb;
                }
                ++local;
                mbarrier_arrive_expect_tx(q_full + 8 * qb, Q_TILE_BYTES);
                load_tile<BLOCK_M>(q_tiles + qb * Q_TILE_BYTES, &q_map, t.m0, t.head, t.batch, q_full + 8 * qb);
                TRACE_MARK(load_q, local - 1, -1);
                // K(it) waits for QK of it - 2 (retired in the middle of iteration it - 2), V(it - 1)
                // for PV of it - 3 (retired at the top of iteration it - 1): in this order neither
                // wait holds up a load whose buffer is already free.
                for (int tile = 0; tile < t.kv_tiles; ++tile, ++it) {
                    load_kv(&k_map, k_tiles, k_full, k_empty, k_empty_phase, it, tile * BLOCK_N, t.kv_head, t.batch);
                    TRACE_MARK(load_k, local - 1, tile);
                    if (v_row >= 0) {
                        load_kv(&v_map, v_tiles, v_full, v_empty, v_empty_phase, it - 1, v_row, v_head, v_batch);
                        TRACE_MARK(load_v, local - 1, tile - 1);
                    }
                    v_row = tile * BLOCK_N, v_head = t.kv_head, v_batch = t.batch;
                }
            }
            if (v_row >= 0) {
                load_kv(&v_map, v_tiles, v_full, v_empty, v_empty_phase, it - 1, v_row, v_head, v_batch);
                TRACE_MARK(load_v, local - 1, v_row / BLOCK_N);
            }
        }
        return;  // the producer's branch ends here: no code below runs in both roles
    }

    // Consumer warpgroup wg - 1 (the rest of the kernel): stage 13's loop on its 64 query rows, once
    // per output tile.
    setmaxnreg_inc<CONSUMER_REGS>();
    const int consumer = wg - 1;  // rows 64 consumer .. 64 consumer + 63 of the CTA's 128
    // exp(scale * (s - m)) = 2^(s * scale_log2 - m * scale_log2): one FFMA feeds each EX2.
    const float scale_log2 = p.scale * 1.4426950408889634f;

    // Pingpong, as in stage 13: one turn per iteration, QK of tile t and PV of tile t - 1 issued
    // together. Consumer c syncs on barrier PINGPONG_BAR + c before its turn and, once the turn's
    // wgmmas are issued, arrives on the other consumer's barrier. The turns run on across output
    // tiles (both consumers walk the same tiles, so their turn counts match): consumer 1's arrival
    // here, once per CTA, lets consumer 0 go first. Consumer 1 also arrives after its very last turn
    // — whether a tile is its last is known only once the next id is read — and consumer 0 takes
    // that arrival with one sync after the loop: every phase of both barriers completes.
    const uint32_t my_turn = PINGPONG_BAR + consumer;
    const uint32_t other_turn = PINGPONG_BAR + (1 - consumer);

    // Bit b: parity of the next completion of k_full[b] (v_full[b]) to wait for; q_phase: of
    // q_full[qb]. All run on across output tiles, as the producer's rings do. The K/V tile `tile` of
    // the current output tile is the CTA's K/V tile kv_base + tile, in buffer (kv_base + tile) % 2
    // of both rings.
    uint32_t k_phase = 0, v_phase = 0, q_phase = 0;
    int kv_base = 0;
    // The O staging of this consumer: its 64 rows as two 64 x 64 boxes (8 KB each), 128-byte
    // swizzled as the O map says. Thread 0 of the warpgroup issues the TMA stores, and so it is also
    // the only thread that can wait for them (bulk groups are per thread).
    const uint32_t o_stage = o_tile + consumer * (WG_ROWS * HEAD_DIM * 2);
    const bool store_thread = threadIdx.x % 128 == 0;
    const uint32_t epilogue_bar = EPILOGUE_BAR + consumer;
    const int offset = p.len_k - p.len_q;  // causal: row i sees keys j <= i + offset
    if (consumer == 1) named_barrier_arrive<PINGPONG_THREADS>(other_turn);
    int local = 0;
    for (int n = 0;; ++n) {
        // The next tile id: computed (stage 17's order, no ring), or from the producer's ring.
        int out_tile;
        if constexpr (COMPUTED_ORDER) {  // uniform by construction
            out_tile = int(blockIdx.x) + n * int(gridDim.x);
            if (out_tile >= num_out_tiles) out_tile = -1;
        } else {
            // Every thread that read the slot arrives on its empty barrier itself: an arrival
            // releases only the arriving thread's own reads, so one lane speaking for the warp would
            // leave the other lanes' reads unordered before the producer's next write
            // (compute-sanitizer's racecheck reports exactly that).
            const int slot = n % SCHED_STAGES;
            TRACE_BEGIN(wait_tile);
            mbarrier_wait(sched_full + 8 * slot, (n / SCHED_STAGES) & 1);  // the slot's (n / 2)-th use
            TRACE_END(wait_tile, n, -1);
            // A value loaded from shared memory is per-thread to the compiler; taken from lane 0 with
            // a shuffle it is warp-uniform, and more of the tile's descriptor arithmetic stays in
            // uniform registers (the kernel's R2UR moves drop from 196 to 125; stage 17, whose tiles
            // are computed, has 71).
            out_tile = __shfl_sync(0xffffffffu, ld_shared_s32(tile_ids + 4 * slot), 0);
            mbarrier_arrive(sched_empty + 8 * slot);
        }
        if (out_tile < 0) break;
        const OutTile t = describe_tile<COMPUTED_ORDER>(out_tile, q_blocks, p);
        const int num_tiles = t.kv_tiles;
        // This consumer's 64 rows: the first of them, and the two this thread holds in the
        // accumulators (rows group and group + 8 of its warp's 16).
        const int o_row = t.m0 + consumer * WG_ROWS;
        const int my_row[2] = {o_row + (warp % 4) * 16 + group, o_row + (warp % 4) * 16 + group + 8};
        // Keys row my_row[h] may see: columns < limit[h] (all rows past len_q see as many as the last).
        int limit[2];
        #pragma unroll
        for (int h = 0; h < 2; ++h) limit[h] = p.causal ? min(p.len_k, my_row[h] + offset + 1) : p.len_k;
        const int qb = local % Q_STAGES;
        if (num_tiles > 0) ++local;  // the producer loads no Q for a tile whose rows see no key
        const uint32_t q_tile = q_tiles + qb * Q_TILE_BYTES;
        // This consumer's rows of Q: 64 c rows (8 swizzle atoms, 8 KB) into the tile's first box.
        const uint32_t q_desc = desc_lo(q_tile + consumer * (WG_ROWS * BOX_COLS * 2), 16);
        const auto stage_of = [&](int tile) { return (kv_base + tile) % KV_STAGES; };

        // Per thread: 64 fp32 registers of O and 64 of S (its warpgroup's 64 x 128 and 64 x 128 tiles
        // spread over 128 threads), then 32 bf16x2 registers of P; Q, K and V never pass through registers.
        // P now outlives an iteration: P of tile t - 1 is read by the PV wgmma that runs during the
        // softmax of tile t, so S (tile t, in fp32) and P (tile t - 1, in bf16) are live together.
        // All of it starts afresh for every output tile.
        float o_acc[O_REGS] = {};
        float s[S_REGS];
        uint32_t p_frag[P_REGS];
        float row_max[2] = {-INFINITY, -INFINITY};  // rows group and group + 8, unscaled scores
        float row_sum[2] = {};  // this thread's share; the quad is summed after the loop
        float correction[2];    // O's rescale from the last softmax, applied once its PV has retired
        bool rescale_o = false;

        // A tile whose rows see no key skips all of this: its O stays 0 and so does its row sum, and
        // the epilogue stores zeros. (Branching around the work on a uniform condition keeps the
        // loop's descriptor arithmetic in uniform registers; a per-thread test on the rows here
        // would not.)
        if (num_tiles > 0) {
            TRACE_BEGIN(wait_q);
            mbarrier_wait(q_full + 8 * qb, (q_phase >> qb) & 1);  // this tile's Q has landed
            TRACE_END(wait_q, n, -1);
            q_phase ^= 1u << qb;

            const auto wait_full = [&](uint32_t full, uint32_t& phase, int tile) {
                const int b = stage_of(tile);
                mbarrier_wait(full + 8 * b, (phase >> b) & 1);
                phase ^= 1u << b;
            };
            // Retires this warp's QK of `tile` (the caller has waited for its wgmma group): K's buffer is
            // free, one arrival of the eight, lane 0 speaking for the warp.
            const auto release_k = [&](int tile) {
                if (lane == 0) mbarrier_arrive(k_empty + 8 * stage_of(tile));
            };

            // S = Q Kᵀ (64 x 128 per warpgroup): eight k-steps of 16 head-dim columns, one wgmma group. Q (A)
            // and K (B = Kᵀ) are both K-major: a 16-column step is 32 bytes into each 128-byte swizzled row,
            // in box kk / 4. Both consumers read the same K; consumer c's 64 rows of Q start 64 c rows
            // (8 swizzle atoms, 8 KB) into each 128-row box of Q (q_desc). Each step's descriptors are
            // the tiles' base descriptors plus the step's constant offset.
            const auto issue_qk = [&](int tile) {
                const uint32_t k_desc = desc_lo(k_tiles + stage_of(tile) * KV_TILE_BYTES, 16);
                #pragma unroll
                for (int kk = 0; kk < K_STEPS; ++kk) {
                    const uint32_t in_row = (kk * 16 % BOX_COLS) * 2;  // bytes into the 128-byte box row
                    const uint64_t desc_q = desc_at(q_desc, (kk * 16 / BOX_COLS) * (BLOCK_M * BOX_COLS * 2) + in_row);
                    const uint64_t desc_k = desc_at(k_desc, (kk * 16 / BOX_COLS) * (BLOCK_N * BOX_COLS * 2) + in_row);
                    wgmma_m64n128k16_bf16_ss<0>(s, desc_q, desc_k, kk > 0);  // the first step overwrites S
                }
                wgmma_commit();
            };

            // O += P V (64 x 128 per warpgroup, both reading the same V): eight k-steps of 16 keys, one wgmma
            // group. P (A) comes from registers, four per thread and step. V (B) is MN-major — row k of B is
            // row k of V, head-dim contiguous — so the transpose bit is set; a step is 16 V rows = two
            // 1024-byte atoms apart by SBO, and the two 64-column boxes of V are LBO = one box apart.
            const auto issue_pv = [&](int tile) {
                const uint32_t v_desc = desc_lo(v_tiles + stage_of(tile) * KV_TILE_BYTES, BLOCK_N * BOX_COLS * 2);
                #pragma unroll
                for (int j = 0; j < PV_STEPS; ++j) {
                    const uint64_t desc_v = desc_at(v_desc, j * 16 * 128);
                    wgmma_m64n128k16_bf16_rs<1>(o_acc, p_frag[4 * j], p_frag[4 * j + 1], p_frag[4 * j + 2], p_frag[4 * j + 3],
                                                desc_v, 1);
                }
                wgmma_commit();
            };

            // Online softmax on the accumulator layout, in place: s[4j + 2 half + c] is row group + 8 half,
            // column 8j + 2 quad + c. The running max only moves (and O and the sums are only rescaled)
            // when some row's max grew by more than 2^8 in exp2 units; otherwise P is computed against
            // the stale max, stays below 2^8 and the final division cancels the difference exactly. This
            // runs while the previous tile's PV is in flight: it must not touch O (the rescale is recorded
            // in `correction` and applied after the PV has retired) nor P's registers (it leaves the
            // probabilities in S, in fp32). On the tiles from t.mask_from on, the scores a row must not
            // see become -inf first: their exponentials are 0 and they move no maximum. `masked` is a
            // compile-time constant (std::true_type or std::false_type): with a run-time test, ptxas
            // if-converts the mask into 130 compares and selects that every tile then executes.
            const auto softmax = [&](int tile, auto masked) {
                if constexpr (decltype(masked)::value) {
                    #pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        const int keep = limit[half] - tile * BLOCK_N - 2 * quad;  // columns 8j + c below it stay
                        #pragma unroll
                        for (int j = 0; j < BLOCK_N / 8; ++j) {
                            if (8 * j >= keep) s[4 * j + 2 * half] = -INFINITY;
                            if (8 * j + 1 >= keep) s[4 * j + 2 * half + 1] = -INFINITY;
                        }
                    }
                }
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
                rescale_o = __any_sync(0xffffffffu, grew);  // warp-uniform: every lane takes the same path
                if (rescale_o) {
                    #pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        const float new_max = fmaxf(row_max[half], tile_max[half]);
                        // A row that has seen no key yet stays at -inf: nothing to correct (not 2^NaN).
                        correction[half] = new_max == -INFINITY ? 1.f : exp2_approx((row_max[half] - new_max) * scale_log2);
                        row_max[half] = new_max;
                        row_sum[half] *= correction[half];
                    }
                }
                #pragma unroll
                for (int half = 0; half < 2; ++half) {
                    // Against 0 for a row that has seen no key: its scores are all -inf, 2^-inf = 0.
                    const float max_scaled = row_max[half] == -INFINITY ? 0.f : row_max[half] * scale_log2;
                    #pragma unroll
                    for (int j = 0; j < BLOCK_N / 8; ++j) {
                        s[4 * j + 2 * half] = exp2_approx(fmaf(s[4 * j + 2 * half], scale_log2, -max_scaled));
                        s[4 * j + 2 * half + 1] = exp2_approx(fmaf(s[4 * j + 2 * half + 1], scale_log2, -max_scaled));
                        row_sum[half] += s[4 * j + 2 * half] + s[4 * j + 2 * half + 1];
                    }
                }
                // Keeps the exponentials here (ex2 is a plain asm statement the compiler may sink to its
                // use, the packing after the PV's wait_group).
                wgmma_fence_operands(s);
                wgmma_fence_operands(row_sum);
            };

            // The overflow path's scores, recomputed by this warp alone: a wgmma needs all four warps of
            // the warpgroup, and the overflow may be in one warp's rows only. S of its 16 rows for the
            // keys of `tile`, with mma.sync from the same swizzled Q and K tiles in shared memory (row r,
            // 16-byte chunk c of a 128-byte box row sits at chunk c ^ (r % 8)). The m16n8k16 accumulator
            // of each 8-key block holds rows group, group + 8 and columns 2 quad, +1: S's layout.
            const auto recompute_scores = [&](int tile) {
                const uint32_t k_tile = k_tiles + stage_of(tile) * KV_TILE_BYTES;
                const int q_row = consumer * WG_ROWS + (warp % 4) * 16 + lane % 16;  // of the tile's 128
                #pragma unroll
                for (int i = 0; i < S_REGS; ++i) s[i] = 0.f;
                #pragma unroll 1
                for (int kk = 0; kk < K_STEPS; ++kk) {
                    // A: rows q_row, head-dim columns 16 kk (lanes 0-15) and 16 kk + 8 (lanes 16-31).
                    const int q_col = kk * 16 + (lane / 16) * 8;
                    uint32_t a[4];
                    ldmatrix_x4(a, q_tile + (q_col / BOX_COLS) * (BLOCK_M * BOX_COLS * 2) + q_row * 128 +
                                       ((q_col % BOX_COLS / 8) ^ (q_row % 8)) * 16);
                    #pragma unroll
                    for (int j2 = 0; j2 < BLOCK_N / 16; ++j2) {
                        // B, two 8-key blocks: keys 16 j2 + 8 (lane / 16) + lane % 8, columns 16 kk + 8 (lane / 8 % 2).
                        const int key = j2 * 16 + (lane / 16) * 8 + lane % 8;
                        const int k_col = kk * 16 + (lane / 8 % 2) * 8;
                        uint32_t b[4];
                        ldmatrix_x4(b, k_tile + (k_col / BOX_COLS) * (BLOCK_N * BOX_COLS * 2) + key * 128 +
                                           ((k_col % BOX_COLS / 8) ^ (key % 8)) * 16);
                        mma_m16n8k16_bf16(&s[8 * j2], a, &b[0]);
                        mma_m16n8k16_bf16(&s[8 * j2 + 4], a, &b[2]);
                    }
                }
            };

            // An unmasked tile after the first: every exponential against the row's reference, unseen
            // scores and all; the row sums then tell whether any came out large or overflowed.
            const auto softmax_unmasked = [&](int tile) {
                const float sum_before[2] = {row_sum[0], row_sum[1]};
                #pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const float max_scaled = row_max[half] * scale_log2;  // finite: the first tile saw every row's keys
                    #pragma unroll
                    for (int j = 0; j < BLOCK_N / 8; ++j) {
                        s[4 * j + 2 * half] = exp2_approx(fmaf(s[4 * j + 2 * half], scale_log2, -max_scaled));
                        s[4 * j + 2 * half + 1] = exp2_approx(fmaf(s[4 * j + 2 * half + 1], scale_log2, -max_scaled));
                        row_sum[half] += s[4 * j + 2 * half] + s[4 * j + 2 * half + 1];
                    }
                }
                rescale_o = false;
                // NaN compares false: it counts as large, and then as overflowed.
                const bool large = !(row_sum[0] <= SUM_LIMIT && row_sum[1] <= SUM_LIMIT);
                if (__any_sync(0xffffffffu, large)) {
                    const bool lost = !(row_sum[0] < OVERFLOW_LIMIT && row_sum[1] < OVERFLOW_LIMIT);
                    if (__any_sync(0xffffffffu, lost)) {
                        // Some exponential overflowed, or came so close that no rebase could bring it back
                        // in range exactly: recompute the tile's scores (K is still held) and take the exact
                        // path from the sums before it.
                        row_sum[0] = sum_before[0];
                        row_sum[1] = sum_before[1];
                        recompute_scores(tile);
                        softmax(tile, std::false_type{});
                    } else {
                        // Rebase each row on its largest per-thread sum M: P, the sum and (at the next top) O
                        // scale by 2^-k = 1 / M, the reference moves up by k = log2 M. Every sum is below
                        // 2^64 here, so 2^-k is a normal float (ex2.approx flushes results below 2^-126 to
                        // zero, which would erase the row), and afterwards no per-thread sum is above 1.
                        #pragma unroll
                        for (int half = 0; half < 2; ++half) {
                            const float top = quad_max(row_sum[half]);
                            const float k = top > 1.f ? __log2f(top) : 0.f;
                            const float c = exp2_approx(-k);
                            correction[half] = c;
                            row_max[half] += k / scale_log2;
                            row_sum[half] *= c;
                            #pragma unroll
                            for (int j = 0; j < BLOCK_N / 8; ++j) {
                                s[4 * j + 2 * half] *= c;
                                s[4 * j + 2 * half + 1] *= c;
                            }
                        }
                        rescale_o = true;
                    }
                }
                release_k(tile);
                wgmma_fence_operands(s);
                wgmma_fence_operands(row_sum);
            };

            // After the previous PV has retired: rescale O if the softmax moved the max, and round this
            // tile's probabilities into P, the A operand of its PV: p_frag[2j + half] = the pair
            // s[4j + 2 half], s[4j + 2 half + 1] (row group + 8 half, columns 8j + 2 quad, +1), so k-step k
            // of PV (keys 16k..16k+15) reads p_frag[4k..4k+3] = {row group, row group + 8} x {columns
            // 2 quad, 8 + 2 quad}: wgmma's A fragment layout.
            const auto rescale_and_pack = [&]() {
                if (rescale_o) {
                    #pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        #pragma unroll
                        for (int j = 0; j < HEAD_DIM / 8; ++j) {
                            o_acc[4 * j + 2 * half] *= correction[half];
                            o_acc[4 * j + 2 * half + 1] *= correction[half];
                        }
                    }
                }
                #pragma unroll
                for (int half = 0; half < 2; ++half) {
                    #pragma unroll
                    for (int j = 0; j < BLOCK_N / 8; ++j)
                        p_frag[2 * j + half] = pack_bf16x2(s[4 * j + 2 * half], s[4 * j + 2 * half + 1]);
                }
                wgmma_fence_operands(p_frag);  // P is computed before the next turn's fence, not sunk past it
            };

            // Retires this warp's PV of `tile` (wait_group 0): O is final for it, and its reads of P's
            // registers and of V are over, so lane 0 frees the buffer for the whole warp (one arrival of
            // the eight; wait_group is warp-synchronous). tile < 0: no PV was in flight.
            const auto retire_pv = [&](int tile) {
                TRACE_BEGIN(wait_pv);
                wgmma_wait<0>();
                TRACE_END(wait_pv, n, tile);
                wgmma_fence_operands(o_acc);
                wgmma_fence_operands(p_frag);  // P stays allocated up to here
                if (tile >= 0 && lane == 0) mbarrier_arrive(v_empty + 8 * stage_of(tile));
            };

            // Tile 0: its QK alone in the first turn, then its softmax (no PV to overlap yet).
            TRACE_BEGIN(wait_k);
            wait_full(k_full, k_phase, 0);
            TRACE_END(wait_k, n, 0);
            TRACE_BEGIN(wait_turn);
            named_barrier_sync<PINGPONG_THREADS>(my_turn);
            TRACE_END(wait_turn, n, 0);
            TRACE_BEGIN(qk);
            wgmma_fence();  // S and O were last written by ordinary instructions
            issue_qk(0);
            TRACE_END(qk, n, 0);
            named_barrier_arrive<PINGPONG_THREADS>(other_turn);  // turn over: the other consumer's turn
            TRACE_BEGIN(wait_qk);
            wgmma_wait<0>();
            wgmma_fence_operands(s);
            TRACE_END(wait_qk, n, 0);
            release_k(0);
            TRACE_BEGIN(softmax);
            if (t.mask_from == 0) softmax(0, std::true_type{});
            else softmax(0, std::false_type{});
            TRACE_END(softmax, n, 0);

            // Tile t: one turn issues QK of t (group 1) and then PV of t - 1 (group 2). wait_group 1 returns
            // once all but the newest group have retired — QK of t — and the softmax of t runs while PV of
            // t - 1 is still on the tensor cores. That PV is retired at the top of the next iteration, not
            // right after the softmax: ptxas places a wait_group wherever it likes among the independent
            // instructions of its basic block, and hoists it above the exponentials (which then wait for
            // the PV and overlap nothing); the loop's back edge keeps it after them.
            const auto iteration = [&](int tile, auto masked) {
                retire_pv(tile - 2);
                TRACE_BEGIN(rescale);
                rescale_and_pack();  // P of t - 1, and O rescaled for it
                TRACE_END(rescale, n, tile - 1);
                TRACE_BEGIN(wait_k);
                wait_full(k_full, k_phase, tile);
                TRACE_END(wait_k, n, tile);
                TRACE_BEGIN(wait_v);
                wait_full(v_full, v_phase, tile - 1);
                TRACE_END(wait_v, n, tile - 1);
                TRACE_BEGIN(wait_turn);
                named_barrier_sync<PINGPONG_THREADS>(my_turn);  // the other consumer has issued its turn
                TRACE_END(wait_turn, n, tile);
                TRACE_BEGIN(qk);
                wgmma_fence();  // O was rescaled, P written and S read by ordinary instructions
                issue_qk(tile);
                TRACE_END(qk, n, tile);
                TRACE_BEGIN(pv);
                issue_pv(tile - 1);
                TRACE_END(pv, n, tile - 1);
                named_barrier_arrive<PINGPONG_THREADS>(other_turn);  // turn over: the other consumer's turn
                TRACE_BEGIN(wait_qk);
                wgmma_wait<1>();  // QK of t has retired; PV of t - 1 may still run
                wgmma_fence_operands(s);
                TRACE_END(wait_qk, n, tile);
                TRACE_BEGIN(softmax);
                if constexpr (decltype(masked)::value) {
                    release_k(tile);
                    softmax(tile, masked);
                } else {
                    softmax_unmasked(tile);  // releases K once it knows the scores are not needed again
                }
                TRACE_END(softmax, n, tile);
            };
            // Two loops: the tiles every row sees whole, without a mask, then the tiles the diagonal
            // (or the end of the keys) crosses, with one.
            const int unmasked_end = max(1, min(t.mask_from, num_tiles));
            for (int tile = 1; tile < unmasked_end; ++tile) iteration(tile, std::false_type{});
            for (int tile = unmasked_end; tile < num_tiles; ++tile) iteration(tile, std::true_type{});

            // The last PV alone in the last turn of the tile. The turns go on into the next output tile
            // (whose first turn, QK of its tile 0, consumer 0 takes after this one of consumer 1's), except
            // after consumer 1's last turn of its last tile, which it does not hand over.
            retire_pv(num_tiles - 2);
            TRACE_BEGIN(rescale);
            rescale_and_pack();
            TRACE_END(rescale, n, num_tiles - 1);
            TRACE_BEGIN(wait_v);
            wait_full(v_full, v_phase, num_tiles - 1);
            TRACE_END(wait_v, n, num_tiles - 1);
            TRACE_BEGIN(wait_turn);
            named_barrier_sync<PINGPONG_THREADS>(my_turn);
            TRACE_END(wait_turn, n, num_tiles);
            TRACE_BEGIN(pv);
            wgmma_fence();  // O was rescaled and P written by ordinary instructions
            issue_pv(num_tiles - 1);
            TRACE_END(pv, n, num_tiles - 1);
            named_barrier_arrive<PINGPONG_THREADS>(other_turn);
            retire_pv(num_tiles - 1);
            // Every wgmma of this tile has retired, the last QK (the last reader of Q) among them: lane 0
            // frees the Q buffer for its warp. The producer refills it with the Q of the tile after next.
            if (lane == 0) mbarrier_arrive(q_empty + 8 * qb);
        }

        // Epilogue: finish the row sums across the quad, divide, round to bf16 into the staging buffer.
        // A row that saw no key has a sum of 0 and an output of 0 (not 0 / 0).
        TRACE_BEGIN(epilogue);
        // The log-sum-exp, ln(sum_j e^(scale s_j)) = ln 2 (scale_log2 max + log2(sum)), from lane 0 of
        // each quad for its two rows: -inf for a row that saw no key (sum 0, max -inf).
        float inv_sum[2];
        #pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float sum = quad_sum(row_sum[half]);
            inv_sum[half] = sum > 0.f ? 1.f / sum : 0.f;
            if (p.lse != nullptr && quad == 0 && my_row[half] < p.len_q) {
                const float lse = sum > 0.f ? (row_max[half] * scale_log2 + __log2f(sum)) * 0.6931471805599453f
                                            : -INFINITY;
                p.lse[(int64_t(t.batch) * p.heads + t.head) * p.len_q + my_row[half]] = lse;
            }
        }
        // The buffer may still feed the previous tile's TMA store: its issuer waits until the copy
        // engine has read it, and the consumer's barrier holds the other 127 threads until then.
        if (store_thread) bulk_wait_group_read<0>();
        named_barrier_sync<EPILOGUE_THREADS>(epilogue_bar);
        // Row r of the consumer's 64 (r % 8 = group), columns 8j + 2 quad, +1: box j / 8, 16-byte
        // chunk j % 8 of the 128-byte box row, which the swizzle stores at chunk (j % 8) ^ (r % 8).
        // A warp's 32 stores of one (j, half) hit 8 rows x 4 quads: 8 distinct chunks (the XOR with
        // 8 distinct groups) x 4 words = 32 distinct banks, no conflict.
        #pragma unroll
        for (int j = 0; j < HEAD_DIM / 8; ++j) {
            #pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = (warp % 4) * 16 + group + 8 * half;
                const uint32_t addr = o_stage + (j / 8) * (WG_ROWS * BOX_COLS * 2) + r * 128 +
                                      (((j % 8) ^ group) * 16) + quad * 4;
                st_shared_b32(addr, pack_bf16x2(o_acc[4 * j + 2 * half] * inv_sum[half],
                                                o_acc[4 * j + 2 * half + 1] * inv_sum[half]));
            }
        }
        fence_proxy_async_shared();  // this thread's stores, made visible to the copy engine
        named_barrier_sync<EPILOGUE_THREADS>(epilogue_bar);  // all 128 threads have written and fenced
        TRACE_END(epilogue, n, -1);
        if (store_thread) {
            #pragma unroll
            for (int box = 0; box < HEAD_DIM / BOX_COLS; ++box)
                tma_store_4d(&o_map, o_stage + box * (WG_ROWS * BOX_COLS * 2), box * BOX_COLS, o_row, t.head, t.batch);
            bulk_commit_group();  // the store runs on while this consumer starts the next tile
            TRACE_MARK(store, n, -1);
        }
        kv_base += num_tiles;
    }
    // Consumer 1's arrival after its last turn (or its first one, in a CTA that had no turn).
    if (consumer == 0) named_barrier_sync<PINGPONG_THREADS>(my_turn);
    // The last stores must have finished with shared memory (and their writes with global memory)
    // before the CTA exits and its shared memory goes to the next kernel.
    if (store_thread) bulk_wait_group<0>();
}

HOPATTN_EXPORT int hopattn_launch(const AttnParams* p, cudaStream_t stream, char* err, int errlen) {
    if (p->head_dim != HEAD_DIM) {
        snprintf(err, errlen, "stage needs head_dim %d, got %d", HEAD_DIM, p->head_dim);
        return 1;
    }
    if (p->len_q <= 0 || p->len_k <= 0 || p->batch <= 0 || p->heads <= 0) {
        snprintf(err, errlen, "stage needs positive batch, heads, len_q and len_k");
        return 1;
    }
    if (p->kv_heads <= 0 || p->heads % p->kv_heads) {
        snprintf(err, errlen, "stage needs heads (%d) to be a multiple of kv_heads (%d)", p->heads, p->kv_heads);
        return 1;
    }
    // Q, K and V are read and O written through 4-D maps [batch, heads, len, 128] with the caller's
    // strides (BHSD, BSHD or any other with a dense head-dim axis and 16-byte multiples): a box
    // that runs past a head's length reads zeros and writes nothing. Q and O boxes are one
    // consumer's or the CTA's rows, K and V boxes one K/V tile; all are 64 columns (128 bytes) wide.
    CUtensorMap q_map, k_map, v_map, o_map;
    if (make_tma_4d_bf16(&q_map, p->q, p->batch, p->heads, p->len_q, HEAD_DIM, p->q_stride, BLOCK_M, BOX_COLS, "q",
                         err, errlen) ||
        make_tma_4d_bf16(&k_map, p->k, p->batch, p->kv_heads, p->len_k, HEAD_DIM, p->k_stride, BLOCK_N, BOX_COLS, "k",
                         err, errlen) ||
        make_tma_4d_bf16(&v_map, p->v, p->batch, p->kv_heads, p->len_k, HEAD_DIM, p->v_stride, BLOCK_N, BOX_COLS, "v",
                         err, errlen) ||
        make_tma_4d_bf16(&o_map, p->o, p->batch, p->heads, p->len_q, HEAD_DIM, p->o_stride, WG_ROWS, BOX_COLS, "out",
                         err, errlen))
        return 1;
    // Causal tiles differ in cost: claimed longest first. Without a mask: stage 17's computed order.
    const auto kernel = p->causal ? attention_kernel<false> : attention_kernel<true>;
    HOPATTN_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES), err, errlen);
    // Persistent grid: one CTA per SM (the kernel fits no second one), never more CTAs than tiles.
    const int64_t num_out_tiles = int64_t(p->batch) * p->heads * ((p->len_q + BLOCK_M - 1) / BLOCK_M);
    if (num_out_tiles >= (int64_t(1) << 31)) {
        snprintf(err, errlen, "stage needs batch * heads * ceil(len_q / %d) < 2^31", BLOCK_M);
        return 1;
    }
    int num_sms = p->num_sms;
    if (num_sms <= 0) {  // not filled in by the caller: ask the current device
        int device = 0;
        HOPATTN_CHECK(cudaGetDevice(&device), err, errlen);
        HOPATTN_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device), err, errlen);
    }
    const dim3 grid(num_out_tiles < num_sms ? int(num_out_tiles) : num_sms);
    // The scheduler's counter (causal only): 4 bytes of this launch's own, zeroed and freed in
    // stream order.
    int* tile_counter = nullptr;
    if (p->causal) {
        HOPATTN_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&tile_counter), sizeof(int), stream), err, errlen);
        HOPATTN_CHECK(cudaMemsetAsync(tile_counter, 0, sizeof(int), stream), err, errlen);
    }
    kernel<<<grid, NUM_THREADS, SMEM_BYTES, stream>>>(q_map, k_map, v_map, o_map, *p, tile_counter);
    const cudaError_t launched = cudaGetLastError();
    if (tile_counter) HOPATTN_CHECK(cudaFreeAsync(tile_counter, stream), err, errlen);
    HOPATTN_CHECK(launched, err, errlen);
    return 0;
}

HOPATTN_EXPORT int hopattn_describe(KernelInfo* info, char* err, int errlen) {
    return describe_kernel(attention_kernel<false>, NUM_THREADS, SMEM_BYTES, BLOCK_M, BLOCK_N, info, err, errlen);
}
