// Stage 23 — stage 22's kernel, organised by role.
//
// Stage 22 is one __global__ function of about 870 lines: the producer's loads, the consumers'
// GEMMs, their softmax and their epilogue are a dozen lambdas that capture everything by
// reference, and what each of them reads and writes (a phase bit, the row sums, the K/V counter)
// is visible only by reading them all. This stage cuts the same code by role, as FlashAttention-3's
// hopper/ does (the tile scheduler, the mainloop's load and mma, the softmax, the epilogue): small
// structs and functions whose state is passed in and out explicitly —
//
//   SmemLayout        where every tile, barrier and tile-id slot lives (computed once, read by all)
//   TileScheduler     first() / next() for the producer, publish() of the tile-id ring, receive()
//                     for the consumers; describe_tile turns an id into coordinates and a K/V range
//   ProducerState     the producer's ring phases, its K/V counter, the V it holds back, its Q count
//   Producer          the mainloop's load side: Q, K and V into their rings (TMA)
//   ConsumerPipeline  a consumer's phases of the full barriers and its K/V counter
//   ConsumerMainloop  the mainloop's mma side: waits, the QK and PV wgmmas, the pingpong turns, the
//                     rare mma.sync recompute of a warp's scores, the buffer releases
//   Softmax           the online softmax's row state (max, sums, O's pending correction) and its steps
//   Epilogue          the log-sum-exp, O / sum into the staging buffer, the TMA store
//
// — and the kernel itself is the setup and the two role loops that call them. The instruction
// wrappers that many stages copied move to common/instructions.cuh (exp2_approx, pack_bf16x2,
// ld_shared_s32) and common/wgmma_desc.cuh (desc_lo, desc_at).
//
// Nothing of the algorithm changes: every function is inlined into the kernel, every statement
// runs in stage 22's order on the same values, and the machine code is stage 22's, instruction
// for instruction and register for register (tests/test_stage23_sass.py compares the SASS). A few
// choices below exist only for that (the order of some structs' members, where the accumulators
// are declared, one argument by reference): each says so where it is made, and notes.md says why.
#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "../common/abi.h"
#include "../common/fast_divmod.cuh"
#include "../common/instructions.cuh"
#include "../common/ldmatrix.cuh"
#include "../common/mbarrier.cuh"
#include "../common/named_barrier.cuh"
#include "../common/mma_sm80.cuh"  // quad_max, quad_sum: the accumulator rows are spread over quads as before
#include "../common/tma_4d.cuh"
#include "../common/tma_store.cuh"
#include "../common/trace.cuh"
#include "../common/wgmma.cuh"
#include "../common/wgmma_desc.cuh"
#include "../common/wgmma_rs.cuh"
#include "../common/wgmma_shapes.cuh"
#include "../common/warp_specialize.cuh"


// ---------------------------------------------------------------------------------------------
// The tile of each head dim (notes.md gives the arithmetic behind each number). The CTA's query
// rows are its consumer warpgroups' 64 each; a K/V tile is BLOCK_N keys; a tile row of Q, K, V or
// O in shared memory is whole 64-column boxes of the 128-byte swizzle (head dim 96 is two boxes,
// the second half zeros: the copy engine fills the columns past the tensor's with zeros, and the
// GEMMs and the store leave them out or write zeros that the store drops). What has to fit:
// the shared memory, at most 227 KB a block, and the registers of a consumer thread, its share of
// O (HEAD_DIM_V / 2 fp32) and of S (BLOCK_N / 2 fp32) with P (BLOCK_N / 4) and the rest, within
// the setmaxnreg budget (the 64K registers of the SM, less the producer's, over the consumers).
template <int HEAD_DIM>
struct HeadDimTile;  // only the head dims below exist: any other does not compile

template <>
struct HeadDimTile<128> {  // stage 23's tile, and the one the stage's figures draw (first in this file)
    static constexpr int HEAD_DIM = 128;      // of Q and K
    static constexpr int HEAD_DIM_V = 128;    // of V and O
    static constexpr int CONSUMERS = 2;       // 128 query rows
    static constexpr int BLOCK_N = 128;       // O 64 + S 64 + P 32 registers of 240
    static constexpr int KV_STAGES = 2;
    static constexpr int Q_STAGES = 2;        // 224 KB: Q 2 x 32 + K 2 x 32 + V 2 x 32 + O 32
    static constexpr int O_BUFFERS = 1;       // O's staging has a buffer of its own
    static constexpr int PRODUCER_REGS = 24;
    static constexpr int CONSUMER_REGS = 240;
};

template <>
struct HeadDimTile<64> {
    static constexpr int HEAD_DIM = 64;
    static constexpr int HEAD_DIM_V = 64;
    static constexpr int CONSUMERS = 3;       // 192 query rows: each softmax has two other turns to hide behind
    static constexpr int BLOCK_N = 96;        // O 32 + S 48 + P 24 registers of 160 (128 keys spill)
    static constexpr int KV_STAGES = 4;       // a K/V tile is 12 KB and a turn short: four in flight
    static constexpr int Q_STAGES = 2;        // 168 KB: Q 2 x 24 + K 4 x 12 + V 4 x 12 + O 24
    static constexpr int O_BUFFERS = 1;
    static constexpr int PRODUCER_REGS = 24;
    static constexpr int CONSUMER_REGS = 160;  // 24 x 128 + 3 x 160 x 128 = 64,512 of 65,536
};

template <>
struct HeadDimTile<96> {  // head dim 128's tile: Q, K and V rows are two boxes, the second half zeros (not multiplied)
    static constexpr int HEAD_DIM = 96;
    static constexpr int HEAD_DIM_V = 96;
    static constexpr int CONSUMERS = 2;
    static constexpr int BLOCK_N = 128;       // O 48 + S 64 + P 32 registers of 240
    static constexpr int KV_STAGES = 2;
    static constexpr int Q_STAGES = 2;        // 224 KB, as head dim 128's
    static constexpr int O_BUFFERS = 1;
    static constexpr int PRODUCER_REGS = 24;
    static constexpr int CONSUMER_REGS = 240;
};

template <>
struct HeadDimTile<192> {  // DeepSeek's MLA prefill: Q and K 192, V and O 128
    static constexpr int HEAD_DIM = 192;
    static constexpr int HEAD_DIM_V = 128;
    static constexpr int CONSUMERS = 2;
    static constexpr int BLOCK_N = 128;       // O 64 + S 64 + P 32 registers of 240, as head dim 128's
    static constexpr int KV_STAGES = 2;
    static constexpr int Q_STAGES = 1;        // 208 KB: Q 48 + K 2 x 48 + V 2 x 32, O in the Q buffer
    static constexpr int O_BUFFERS = 0;       // O staged in its consumer's rows of the Q buffer
    static constexpr int PRODUCER_REGS = 24;
    static constexpr int CONSUMER_REGS = 240;
};

template <>
struct HeadDimTile<256> {
    static constexpr int HEAD_DIM = 256;
    static constexpr int HEAD_DIM_V = 256;
    static constexpr int CONSUMERS = 2;
    static constexpr int BLOCK_N = 80;        // O 128 + S 40 + P 20 registers of 240 (Q_DESC_PER_TURN)
    static constexpr int KV_STAGES = 2;
    static constexpr int Q_STAGES = 1;        // 224 KB: Q 64 + K 2 x 40 + V 2 x 40, O in the Q buffer
    static constexpr int O_BUFFERS = 0;
    static constexpr int PRODUCER_REGS = 24;
    static constexpr int CONSUMER_REGS = 240;
};

// ---------------------------------------------------------------------------------------------
// Trace points (common/trace.cuh) are empty without -DHOPATTN_TRACE. In the traced build they name
// the recorder's per-thread state (trace_warp_, trace_stamp_, trace_start_), which the trace
// initialisation at the top of the kernel declares. Every struct below that has trace points
// derives from TraceRefs, references to that state under the same names, so the points inside its
// functions compile as they did inside the kernel's lambdas; untraced, TraceRefs is empty.
#ifdef HOPATTN_TRACE_RECORDER
struct TraceRefs {
    TraceWarp& trace_warp_;
    uint32_t (&trace_stamp_)[TRACE_NSTAMPS];
    uint32_t (&trace_start_)[kevent_count];
};
#define TRACE_REFS (TraceRefs{trace_warp_, trace_stamp_, trace_start_})
#else
struct TraceRefs {};
#define TRACE_REFS (TraceRefs{})
#endif

template <int D>
struct Attention;

// The kernel, one per head dim and order (defined at the end: the setup and the role loops of
// Attention<D>::kernel_main).
template <int D, bool COMPUTED_ORDER>
__global__ void __launch_bounds__(Attention<D>::NUM_THREADS, 1) attention_kernel(
    const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
    const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap o_map, const AttnParams p,
    const typename Attention<D>::TileOrder order, int* tile_counter);

// ---------------------------------------------------------------------------------------------
// Stage 23's kernel for head dim D: everything from here to the kernel's definition is one class
// template, whose members are stage 23's constants, structs and functions, written for any tile.
// (Its body is not indented, so that the diff against stage 23 shows what the head dim changes.)
template <int D>
struct Attention {
using Tile = HeadDimTile<D>;
static constexpr int HEAD_DIM = Tile::HEAD_DIM;  // of Q and K: the depth of the QKᵀ product
static constexpr int HEAD_DIM_V = Tile::HEAD_DIM_V;  // of V and O: the width of the PV product
static constexpr int WG_ROWS = 64;  // query rows per consumer warpgroup: the M of one wgmma
static constexpr int CONSUMERS = Tile::CONSUMERS;  // consumer warpgroups per CTA, sharing every K/V tile
static constexpr int BLOCK_M = CONSUMERS * WG_ROWS;  // query rows per CTA
static constexpr int BLOCK_N = Tile::BLOCK_N;  // key/value rows per iteration
static constexpr int NUM_THREADS = (1 + CONSUMERS) * 128;  // warpgroup 0 produces, warpgroups 1, 2 (, 3) consume
static constexpr int CONSUMER_WARPS = CONSUMERS * 4;  // arrivals on an empty barrier: one per consumer warp
static constexpr int KV_STAGES = Tile::KV_STAGES;  // per ring: K and V have a ring of buffers each, with their own barriers
static constexpr int SCHED_STAGES = 2;  // tile-id ring from the producer to the consumers: the next tile is known a tile ahead
static constexpr int HEAD_GROUP_BYTES = 24 << 20;  // K + V of the heads in flight together: about half of the 50 MB L2
static constexpr int Q_STAGES = Tile::Q_STAGES;   // Q ring: with two, the Q of output tile i + 1 lands while the consumers still read tile i's
static constexpr int O_BUFFERS = Tile::O_BUFFERS;  // 1: O's staging has its own buffer; 0: it is the Q buffer
static constexpr bool O_IN_Q = O_BUFFERS == 0;
static constexpr int PRODUCER_REGS = Tile::PRODUCER_REGS;   // setmaxnreg.dec: the producer keeps a few addresses and a counter
static constexpr int CONSUMER_REGS = Tile::CONSUMER_REGS;  // setmaxnreg.inc: what the producer gave up, shared by the consumers
static constexpr int BOX_COLS = 64;  // a 128-byte swizzled box row holds 64 bf16: a tile is boxes side by side
static constexpr int BOXES = (HEAD_DIM + BOX_COLS - 1) / BOX_COLS;  // boxes of a Q or K tile
static constexpr int V_BOXES = (HEAD_DIM_V + BOX_COLS - 1) / BOX_COLS;  // boxes of a V or O tile
static constexpr int V_TILE_COLS = V_BOXES * BOX_COLS;  // columns of a V tile and of O's staging (96: 128)
static constexpr int O_COLS = HEAD_DIM_V;  // columns of O in registers: the PV product's N (96: box 0 and half of box 1)
static constexpr int Q_BOX_BYTES = BLOCK_M * BOX_COLS * 2;
static constexpr int Q_TILE_BYTES = BOXES * Q_BOX_BYTES;
static constexpr int K_TILE_BYTES = BOXES * BLOCK_N * BOX_COLS * 2;
static constexpr int V_TILE_BYTES = V_BOXES * BLOCK_N * BOX_COLS * 2;
static constexpr int O_TILE_BYTES = BLOCK_M * V_TILE_COLS * 2;  // bf16 staging of O for the TMA store: 64 rows per consumer
static constexpr int O_STAGING_BYTES = O_BUFFERS * O_TILE_BYTES;
static constexpr int NUM_BARRIERS = 2 * Q_STAGES + 4 * KV_STAGES + 2 * SCHED_STAGES;  // a "full" and an "empty" barrier per Q, K, V buffer and tile slot
static constexpr int SMEM_BYTES =
    Q_STAGES * Q_TILE_BYTES + KV_STAGES * (K_TILE_BYTES + V_TILE_BYTES) + O_STAGING_BYTES + NUM_BARRIERS * 8 + SCHED_STAGES * 4;

static constexpr int K_STEPS = HEAD_DIM / 16;  // k-steps of the QKᵀ product
static constexpr int S_REGS = BLOCK_N / 2;     // fp32 accumulators per thread of S (64 x BLOCK_N per warpgroup)
static constexpr int O_REGS = O_COLS / 2;  // fp32 accumulators per thread of O (64 x O_COLS)
static constexpr int P_REGS = BLOCK_N / 4;     // bf16x2 registers per thread of P (64 x BLOCK_N): S's, halved
static constexpr int PV_STEPS = BLOCK_N / 16;  // k-steps of the PV product, four of P's registers each
// The Q descriptors of a turn's K_STEPS k-steps do not change within an output tile, and the compiler
// computes them once per tile and keeps them, two registers each, across the K/V loop. Where the
// accumulators take more than head dim 128's 160 registers (head dim 256: 188 of 240, and sixteen
// descriptors), that spills; there the descriptors' base goes through an empty asm statement in
// every turn (issue_qk), which the compiler cannot hoist: sixteen adds a turn, and no spill.
static constexpr bool Q_DESC_PER_TURN = O_REGS + S_REGS + P_REGS > 160;
static constexpr float RESCALE_THRESHOLD = 8.f;  // log2 of the growth tolerated before rescaling
static constexpr float SUM_LIMIT = 16777216.f;  // 2^24: a per-thread row sum above it rebases the row
static constexpr float OVERFLOW_LIMIT = 18446744073709551616.f;  // 2^64: a per-thread sum at or above it (or not
                                                                // finite) recomputes the tile: a rebase stays exact
static constexpr int PINGPONG_BAR = 1;  // named barrier PINGPONG_BAR + c: "consumer c may issue its next GEMM" (0 is __syncthreads)
static constexpr int PINGPONG_THREADS = 2 * 128;  // per phase: the waiting consumer's bar.sync + the one before's bar.arrive
static constexpr int EPILOGUE_BAR = PINGPONG_BAR + CONSUMERS;  // named barrier EPILOGUE_BAR + c: consumer c's own 128 threads around its O staging
static constexpr int EPILOGUE_THREADS = 128;
// Consumer c's O staging: box j (its 64 rows x 64 columns, 8 KB) at o_tile + c * O_CONSUMER_OFFSET +
// j * O_BOX_STRIDE. In a buffer of its own, the consumer's boxes follow each other; in the Q buffer,
// they are the consumer's 64 rows of each Q box, which only its own QK reads.
static constexpr int O_BOX_STRIDE = O_IN_Q ? Q_BOX_BYTES : WG_ROWS * BOX_COLS * 2;
static constexpr int O_CONSUMER_OFFSET = O_IN_Q ? WG_ROWS * BOX_COLS * 2 : WG_ROWS * V_TILE_COLS * 2;

// The CTA starts with 65536 / NUM_THREADS registers per thread rounded down to 8 (168 at 384
// threads, 128 at 512: ptxas's budget under __launch_bounds__(NUM_THREADS, 1)); the consumers can
// only take what the producer gives back.
static_assert(128 * PRODUCER_REGS + CONSUMERS * 128 * CONSUMER_REGS <= 65536, "register file overcommitted");
static_assert(SMEM_BYTES <= 227 * 1024, "more shared memory than one block may have on sm_90");
static_assert(BLOCK_N % 16 == 0 && BLOCK_N <= 256 && BLOCK_M <= 256, "k-steps of 16 keys; a TMA box has at most 256 rows");
static_assert(!O_IN_Q || (Q_STAGES == 1 && V_BOXES <= BOXES), "O staged in the one Q buffer, within its rows");
static_assert(EPILOGUE_BAR + CONSUMERS <= 16, "sixteen named barriers");
static_assert(HEAD_DIM == D, "HeadDimTile<D> is the tile of head dim D");

using bf16 = __nv_bfloat16;

// ---------------------------------------------------------------------------------------------
// Shared memory. The tiles (224 KB at head dim 128) and the mbarriers after them. The 128-byte
// swizzle needs every box (and every wgmma swizzle atom) to start at a multiple of 1024 bytes; all
// tile sizes are multiples of 1024. Computed once by every thread; each role reads the addresses
// it needs.
struct SmemLayout {
    uint32_t q_tiles;      // + qb * Q_TILE_BYTES: BLOCK_M rows, BOXES boxes of BLOCK_M x 64
    uint32_t k_tiles;      // + stage * K_TILE_BYTES
    uint32_t v_tiles;      // + stage * V_TILE_BYTES
    uint32_t o_tile;       // + consumer * O_CONSUMER_OFFSET: V_BOXES boxes of 64 x 64 (O_IN_Q: the Q buffer)
    uint32_t q_full;       // q_full + 8 * qb: Q of buffer qb has landed
    uint32_t q_empty;      // q_empty + 8 * qb: every consumer warp is done with qb (O_IN_Q: its staging too)
    uint32_t k_full;       // k_full + 8 * b: K of buffer b has landed
    uint32_t k_empty;      // k_empty + 8 * b: every consumer warp's QK on b has retired
    uint32_t v_full;       // v_full + 8 * b: V of buffer b has landed
    uint32_t v_empty;      // v_empty + 8 * b: every consumer warp's PV on b has retired
    uint32_t sched_full;   // sched_full + 8 * i: slot i holds the next tile id
    uint32_t sched_empty;  // sched_empty + 8 * i: every consumer thread has read slot i
    uint32_t tile_ids;     // + 4 * i: slot i (an output tile, or -1: no more)
};

static __device__ __forceinline__ SmemLayout smem_layout(uint32_t base) {
    SmemLayout sm;
    sm.q_tiles = base;
    sm.k_tiles = sm.q_tiles + Q_STAGES * Q_TILE_BYTES;
    sm.v_tiles = sm.k_tiles + KV_STAGES * K_TILE_BYTES;
    sm.o_tile = O_IN_Q ? sm.q_tiles : sm.v_tiles + KV_STAGES * V_TILE_BYTES;
    sm.q_full = O_IN_Q ? sm.v_tiles + KV_STAGES * V_TILE_BYTES : sm.o_tile + O_TILE_BYTES;
    sm.q_empty = sm.q_full + 8 * Q_STAGES;
    sm.k_full = sm.q_empty + 8 * Q_STAGES;
    sm.k_empty = sm.k_full + 8 * KV_STAGES;
    sm.v_full = sm.k_empty + 8 * KV_STAGES;
    sm.v_empty = sm.v_full + 8 * KV_STAGES;
    sm.sched_full = sm.v_empty + 8 * KV_STAGES;
    sm.sched_empty = sm.sched_full + 8 * SCHED_STAGES;
    sm.tile_ids = sm.sched_empty + 8 * SCHED_STAGES;
    return sm;
}

// Thread 0, before the kernel's one __syncthreads: every mbarrier with its arrival count.
static __device__ __forceinline__ void init_barriers(const SmemLayout& sm) {
    if (sm.q_tiles % 1024) __trap();  // the swizzle and the descriptors would not hold
    #pragma unroll
    for (int qb = 0; qb < Q_STAGES; ++qb) {
        mbarrier_init(sm.q_full + 8 * qb, 1);                // the producer's arrive.expect_tx (+ Q's bytes)
        // One arrival per consumer warp, after its tile; O_IN_Q: per consumer, once its store has read its staging.
        mbarrier_init(sm.q_empty + 8 * qb, O_IN_Q ? CONSUMERS : CONSUMER_WARPS);
    }
    #pragma unroll
    for (int b = 0; b < KV_STAGES; ++b) {
        mbarrier_init(sm.k_full + 8 * b, 1);                // the producer's arrive.expect_tx (+ the bytes)
        mbarrier_init(sm.k_empty + 8 * b, CONSUMER_WARPS);  // one arrival per consumer warp
        mbarrier_init(sm.v_full + 8 * b, 1);
        mbarrier_init(sm.v_empty + 8 * b, CONSUMER_WARPS);
    }
    #pragma unroll
    for (int i = 0; i < SCHED_STAGES; ++i) {
        mbarrier_init(sm.sched_full + 8 * i, 1);                // the producer's arrival after writing the id
        mbarrier_init(sm.sched_empty + 8 * i, CONSUMERS * 128);  // one arrival per consumer thread once it has read it
    }
    fence_proxy_async_shared();  // the copy engine must see the initialised barriers
}

// ---------------------------------------------------------------------------------------------
// The tile scheduler.

// What finding a tile's coordinates divides by, fixed for the launch: prepared by the host.
struct TileOrder {
    FastDivmod q_blocks;     // q-blocks per head
    FastDivmod heads;        // query heads per batch
    FastDivmod group;        // query heads per K/V head
    FastDivmod group_tiles;  // output tiles per group of heads (the causal order)
    FastDivmod head_group;   // (batch, head) pairs per group of heads
    FastDivmod last_group;   // pairs in the last group: fewer when head_group does not divide them all
};

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
static __device__ __forceinline__ OutTile describe_tile(int out_tile, const TileOrder& order, const AttnParams& p) {
    OutTile t;
    int bh;
    if constexpr (COMPUTED_ORDER) {  // no mask, every tile costs the same: stage 17's order, head by head
        int q_block;
        fast_divmod(out_tile, order.q_blocks, bh, q_block);
        t.m0 = q_block * BLOCK_M;
    } else {
        // Heads whose K and V fit in HEAD_GROUP_BYTES together (the host's head_group); a K/V head
        // serves `group` query heads. The last group may be smaller.
        const int head_group = int(order.head_group.divisor);
        int g, r, back, within;
        fast_divmod(out_tile, order.group_tiles, g, r);
        const int first_bh = g * head_group;
        const bool last = first_bh + head_group > p.batch * p.heads;
        fast_divmod(r, last ? order.last_group : order.head_group, back, within);
        bh = first_bh + within;
        t.m0 = (int(order.q_blocks.divisor) - 1 - back) * BLOCK_M;
    }
    fast_divmod(bh, order.heads, t.batch, t.head);
    t.kv_head = fast_div(t.head, order.group);
    // Causal: row i sees keys j <= i + len_k - len_q. The block's last row sees the most keys and
    // its first row the fewest; keys past len_k do not exist.
    const int offset = p.len_k - p.len_q;
    const int seen = p.causal ? min(p.len_k, t.m0 + BLOCK_M + offset) : p.len_k;
    const int seen_by_all = p.causal ? min(p.len_k, t.m0 + 1 + offset) : p.len_k;
    t.kv_tiles = (max(seen, 0) + BLOCK_N - 1) / BLOCK_N;
    t.mask_from = max(seen_by_all, 0) / BLOCK_N;
    return t;
}

// Which output tiles a CTA computes, and in what order. Tiles are numbered in describe_tile's
// order; CTA j starts with tile j. COMPUTED_ORDER (launches without a mask): CTA j takes tiles j,
// j + gridDim.x, ..., and the consumers compute the same ids, no ring. Otherwise (causal, tiles of
// unequal cost) the producer claims each next tile from the launch's global counter (gridDim.x +
// the counter's old value) and hands the ids to the consumers through the tile-id ring.
template <bool COMPUTED_ORDER>
struct TileScheduler : TraceRefs {
    int num_out_tiles;  // tile ids at or past it: no tile, the loops end
    int* tile_counter;  // causal: the launch's counter, zeroed by the host
    uint32_t sched_full, sched_empty, tile_ids;  // the ring (SmemLayout)

    // Producer: the CTA's first tile, and the tile after `out_tile`. next() claims it from the
    // counter: called before the current tile's loads, the atomic's round trip hides behind them.
    __device__ __forceinline__ int first() const { return blockIdx.x; }
    __device__ __forceinline__ int next(int out_tile) const {
        return COMPUTED_ORDER ? out_tile + int(gridDim.x) : int(gridDim.x) + atomicAdd(tile_counter, 1);
    }

    // Producer, causal only: the CTA's n-th tile (or -1: none left) into slot n % 2, once the
    // consumers have read what that slot held two tiles ago. The mbarrier arrival releases the
    // st.shared to the consumers' waits. `local` only labels the trace point. (out_tile by
    // reference: compared with num_out_tiles as a by-value argument, the comparison is turned
    // around, setp.gt for stage 22's setp.lt, and the code around it is placed differently.)
    __device__ __forceinline__ void publish(int n, const int& out_tile, int local) const {
        const int slot = n % SCHED_STAGES;
        TRACE_BEGIN(wait_empty);
        if (n >= SCHED_STAGES) mbarrier_wait(sched_empty + 8 * slot, (n / SCHED_STAGES - 1) & 1);
        TRACE_END(wait_empty, local, -1);
        st_shared_b32(tile_ids + 4 * slot, out_tile < num_out_tiles ? out_tile : -1);
        mbarrier_arrive(sched_full + 8 * slot);
    }

    // Consumers: the CTA's n-th tile, or -1 when there is none. Computed (stage 17's order, no
    // ring), or from the producer's ring.
    __device__ __forceinline__ int receive(int n) const {
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
        return out_tile;
    }
};

// ---------------------------------------------------------------------------------------------
// The mainloop's load side: the producer, one thread of warp 0.

// One thread starts the copy of ROWS tile rows of NBOXES boxes (row `row0` on of head `head` of batch
// `batch`): one TMA per 64-column box, all completing on `bar`, which the caller has told to expect
// the tile's bytes (rows past the head's length, and columns past its head dim, come as zeros and
// count too).
template <int ROWS, int NBOXES>
static __device__ __forceinline__ void load_tile(uint32_t tile, const CUtensorMap* map, int row0, int head, int batch,
                                                 uint32_t bar) {
    #pragma unroll
    for (int box = 0; box < NBOXES; ++box)
        tma_load_4d(tile + box * ROWS * BOX_COLS * 2, map, box * BOX_COLS, row0, head, batch, bar);
}

// What the producer carries from tile to tile. Bit b of a phase: parity of the next completion of
// k_empty[b] (v_empty[b], q_empty[b]) to wait for. A buffer's first use needs no wait (it starts
// empty); its n-th refill waits for the n-th completion of its empty barrier (n = 0, 1, ...), i.e.
// parity n % 2, then flips the bit. None is reset between output tiles: the rings run on across
// them.
// (v before k: the order that keeps stage 22's register numbering, see Softmax.)
struct ProducerState {
    uint32_t v_empty_phase = 0, k_empty_phase = 0, q_empty_phase = 0;
    int it = 0;  // this CTA's K/V tiles so far: K(it) goes into buffer it % KV_STAGES of its ring
    // The V tile not issued yet (v_row < 0: none), one behind K: issued after K(it + 1).
    int v_row = -1, v_head = 0, v_batch = 0;
    int local = 0;  // output tiles with work this CTA has started: Q buffer local % Q_STAGES
};

struct Producer : TraceRefs {
    const CUtensorMap* q_map;
    const CUtensorMap* k_map;
    const CUtensorMap* v_map;
    SmemLayout sm;

    // One tile of K or V (NBOXES boxes wide) into its ring: buffer n % KV_STAGES for the CTA's n-th
    // tile of that ring.
    template <int NBOXES>
    __device__ __forceinline__ void load_kv(const CUtensorMap* map, uint32_t tiles, uint32_t full, uint32_t empty,
                                            uint32_t& empty_phase, int n, int row, int head, int batch) const {
        constexpr int TILE_BYTES = NBOXES * BLOCK_N * BOX_COLS * 2;
        const int b = n % KV_STAGES;
        if (n >= KV_STAGES) {
            TRACE_BEGIN(wait_empty);
            mbarrier_wait(empty + 8 * b, (empty_phase >> b) & 1);
            TRACE_END(wait_empty, -1, n);
            empty_phase ^= 1u << b;
        }
        mbarrier_arrive_expect_tx(full + 8 * b, TILE_BYTES);
        load_tile<BLOCK_N, NBOXES>(tiles + b * TILE_BYTES, map, row, head, batch, full + 8 * b);
    }

    // V(it - 1), the tile held back one behind K.
    __device__ __forceinline__ void load_held_v(ProducerState& st) const {
        load_kv<V_BOXES>(v_map, sm.v_tiles, sm.v_full, sm.v_empty, st.v_empty_phase, st.it - 1, st.v_row, st.v_head,
                         st.v_batch);
    }

    // Q of tile t: its buffer last held the Q of tile local - Q_STAGES, released by all the consumer
    // warps once that tile's last wgmma had retired (O_IN_Q: by every consumer once its TMA store
    // had read the O it staged there).
    __device__ __forceinline__ void load_q(ProducerState& st, const OutTile& t) const {
        const int qb = st.local % Q_STAGES;
        if (st.local >= Q_STAGES) {
            TRACE_BEGIN(wait_empty);
            mbarrier_wait(sm.q_empty + 8 * qb, (st.q_empty_phase >> qb) & 1);
            TRACE_END(wait_empty, st.local, -1);
            st.q_empty_phase ^= 1u << qb;
        }
        ++st.local;
        mbarrier_arrive_expect_tx(sm.q_full + 8 * qb, Q_TILE_BYTES);
        load_tile<BLOCK_M, BOXES>(sm.q_tiles + qb * Q_TILE_BYTES, q_map, t.m0, t.head, t.batch, sm.q_full + 8 * qb);
        TRACE_MARK(load_q, st.local - 1, -1);
    }

    // The K/V tiles of tile t. K(it) waits for QK of it - KV_STAGES (retired in the middle of its
    // iteration), V(it - 1) for PV of it - 1 - KV_STAGES (retired at the top of iteration
    // it + 1 - KV_STAGES): in this order neither wait holds up a load whose buffer is already free.
    // The last V stays held back.
    __device__ __forceinline__ void load_kv_tiles(ProducerState& st, const OutTile& t) const {
        for (int tile = 0; tile < t.kv_tiles; ++tile, ++st.it) {
            load_kv<BOXES>(k_map, sm.k_tiles, sm.k_full, sm.k_empty, st.k_empty_phase, st.it, tile * BLOCK_N, t.kv_head,
                           t.batch);
            TRACE_MARK(load_k, st.local - 1, tile);
            if (st.v_row >= 0) {
                load_held_v(st);
                TRACE_MARK(load_v, st.local - 1, tile - 1);
            }
            st.v_row = tile * BLOCK_N, st.v_head = t.kv_head, st.v_batch = t.batch;
        }
    }

    // The producer's loop over the CTA's output tiles.
    template <bool COMPUTED_ORDER>
    __device__ __forceinline__ void run(const TileScheduler<COMPUTED_ORDER>& sched, const TileOrder& order,
                                        const AttnParams& p) const {
        ProducerState st;
        for (int n = 0, out_tile = sched.first();; ++n) {
            // (A computed order needs no ring: the consumers compute the same ids.)
            if constexpr (!COMPUTED_ORDER) {
                // First the V still held back: the consumers cannot finish the last tile, and so
                // cannot read the ids that free this slot, without it. (Held back across the ids
                // of two empty tiles, it deadlocked: see stage 18's notes.md.) Every wait of the
                // producer is then for consumer work whose loads have all been issued.
                if (st.v_row >= 0) {
                    load_held_v(st);
                    TRACE_MARK(load_v, st.local - 1, st.v_row / BLOCK_N);
                    st.v_row = -1;
                }
                sched.publish(n, out_tile, st.local);
            }
            if (out_tile >= sched.num_out_tiles) break;
            const int next_tile = sched.next(out_tile);
            const OutTile t = describe_tile<COMPUTED_ORDER>(out_tile, order, p);
            out_tile = next_tile;
            if (t.kv_tiles == 0) continue;  // no row of it sees a key: the consumers write zeros
            if constexpr (Q_STAGES == 1) {
                // One Q buffer: load_q waits for the consumers to finish the tile before, whose last
                // PV needs the V still held back (the causal order has issued it above already).
                // Without this the order without a mask deadlocks (research/stage24/protocol.py).
                if (st.v_row >= 0) {
                    load_held_v(st);
                    TRACE_MARK(load_v, st.local - 1, st.v_row / BLOCK_N);
                    st.v_row = -1;
                }
            }
            load_q(st, t);
            load_kv_tiles(st, t);
        }
        if (st.v_row >= 0) {
            load_held_v(st);
            TRACE_MARK(load_v, st.local - 1, st.v_row / BLOCK_N);
        }
    }
};

// ---------------------------------------------------------------------------------------------
// The softmax: a consumer thread's share of its two rows (group and group + 8 of its warp's 16),
// on the accumulator layout, in place: s[4j + 2 half + c] is row group + 8 half, column
// 8j + 2 quad + c. Starts afresh for every output tile. scale_log2 (the consumer's, fixed for the
// launch) comes in as an argument: held as a member, it ends up the second operand of every FMUL
// it feeds, where stage 22 has it first.
//
// The members are declared in the reverse of the order stage 22 declared them as locals: the
// compiler numbers a struct's members (once it has split it into scalars) in the reverse order of
// their declaration, and ptxas assigns registers following that numbering. In stage 22's order the
// kernel's instructions are the same but their registers differ (see notes.md). The same holds for
// ProducerState and ConsumerPipeline.
struct Softmax {
    bool rescale_o = false;
    float correction[2];    // O's rescale from the last softmax, applied once its PV has retired
    float row_sum[2] = {};  // this thread's share; the quad is summed in the epilogue
    float row_max[2] = {-INFINITY, -INFINITY};  // unscaled scores

    // The online softmax. The running max only moves (and O and the sums are only rescaled) when
    // some row's max grew by more than 2^8 in exp2 units; otherwise P is computed against the
    // stale max, stays below 2^8 and the final division cancels the difference exactly. This runs
    // while the previous tile's PV is in flight: it must not touch O (the rescale is recorded in
    // `correction` and applied after the PV has retired) nor P's registers (it leaves the
    // probabilities in S, in fp32). On the tiles from t.mask_from on, the scores a row must not
    // see (columns at or past limit[half], keys of K/V tile `tile`) become -inf first: their
    // exponentials are 0 and they move no maximum. `masked` is a compile-time constant
    // (std::true_type or std::false_type): with a run-time test, ptxas if-converts the mask into
    // 130 compares and selects that every tile then executes.
    template <class Masked>
    __device__ __forceinline__ void online(float (&s)[S_REGS], float scale_log2, int tile, const int (&limit)[2],
                                           int quad, Masked masked) {
        if constexpr (Masked::value) {
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
    }

    // An unmasked tile after the first: every exponential against the row's reference, unseen
    // scores and all (the first tile saw every row's keys, so the reference is finite), and the
    // sums; the caller then checks them (large(), lost()).
    __device__ __forceinline__ void exponentiate(float (&s)[S_REGS], float scale_log2) {
        #pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float max_scaled = row_max[half] * scale_log2;
            #pragma unroll
            for (int j = 0; j < BLOCK_N / 8; ++j) {
                s[4 * j + 2 * half] = exp2_approx(fmaf(s[4 * j + 2 * half], scale_log2, -max_scaled));
                s[4 * j + 2 * half + 1] = exp2_approx(fmaf(s[4 * j + 2 * half + 1], scale_log2, -max_scaled));
                row_sum[half] += s[4 * j + 2 * half] + s[4 * j + 2 * half + 1];
            }
        }
        rescale_o = false;
    }
    // NaN compares false: it counts as large, and then as overflowed.
    __device__ __forceinline__ bool large() const { return !(row_sum[0] <= SUM_LIMIT && row_sum[1] <= SUM_LIMIT); }
    __device__ __forceinline__ bool lost() const {
        return !(row_sum[0] < OVERFLOW_LIMIT && row_sum[1] < OVERFLOW_LIMIT);
    }

    // Rebase each row on its largest per-thread sum M: P, the sum and (at the next top) O scale by
    // 2^-k = 1 / M, the reference moves up by k = log2 M. Every sum is below 2^64 here, so 2^-k is a
    // normal float (ex2.approx flushes results below 2^-126 to zero, which would erase the row), and
    // afterwards no per-thread sum is above 1.
    __device__ __forceinline__ void rebase(float (&s)[S_REGS], float scale_log2) {
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

    // After the previous PV has retired: O rescaled if the last softmax moved the max.
    __device__ __forceinline__ void rescale(float (&o_acc)[O_REGS]) const {
        if (rescale_o) {
            #pragma unroll
            for (int half = 0; half < 2; ++half) {
                #pragma unroll
                for (int j = 0; j < O_COLS / 8; ++j) {
                    o_acc[4 * j + 2 * half] *= correction[half];
                    o_acc[4 * j + 2 * half + 1] *= correction[half];
                }
            }
        }
    }
};

// The tile's probabilities rounded into P, the A operand of its PV: p_frag[2j + half] = the pair
// s[4j + 2 half], s[4j + 2 half + 1] (row group + 8 half, columns 8j + 2 quad, +1), so k-step k of
// PV (keys 16k..16k+15) reads p_frag[4k..4k+3] = {row group, row group + 8} x {columns 2 quad,
// 8 + 2 quad}: wgmma's A fragment layout.
static __device__ __forceinline__ void convert_to_p(const float (&s)[S_REGS], uint32_t (&p_frag)[P_REGS]) {
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
        #pragma unroll
        for (int j = 0; j < BLOCK_N / 8; ++j)
            p_frag[2 * j + half] = pack_bf16x2(s[4 * j + 2 * half], s[4 * j + 2 * half + 1]);
    }
}

// ---------------------------------------------------------------------------------------------
// The mainloop's mma side: a consumer warpgroup, its 64 query rows of the CTA's BLOCK_M.

// What a consumer carries from tile to tile. Bit b of a phase: parity of the next completion of
// k_full[b] (v_full[b]) to wait for; q_phase: of q_full[qb]. All run on across output tiles, as
// the producer's rings do. The K/V tile `tile` of the current output tile is the CTA's K/V tile
// kv_base + tile, in buffer (kv_base + tile) % KV_STAGES of both rings.
// (Members in the order that keeps stage 22's register numbering, see Softmax: here the reverse of
// stage 23's order. Nested in the class template, this struct's scalars came out numbered the other
// way round — kv_base and q_phase, local and a phase exchanged in the normalised PTX — and so did
// the registers of the whole kernel; Softmax's and ProducerState's numbering did not change.)
struct ConsumerPipeline {
    int kv_base = 0;
    uint32_t v_phase = 0, k_phase = 0;
    int local = 0;  // output tiles with work so far: Q buffer local % Q_STAGES (the producer's count)
    uint32_t q_phase = 0;
};

// This consumer's rows of an output tile: the first of its 64, the two this thread holds in the
// accumulators (rows group and group + 8 of its warp's 16), and the keys each of those may see:
// columns < limit[h] (all rows past len_q see as many as the last).
struct TileRows {
    int o_row;
    int my_row[2];
    int limit[2];
};

static __device__ __forceinline__ TileRows tile_rows(const OutTile& t, int consumer, int warp, int group, int offset,
                                                     const AttnParams& p) {
    TileRows rows;
    rows.o_row = t.m0 + consumer * WG_ROWS;
    rows.my_row[0] = rows.o_row + (warp % 4) * 16 + group;
    rows.my_row[1] = rows.o_row + (warp % 4) * 16 + group + 8;
    #pragma unroll
    for (int h = 0; h < 2; ++h) rows.limit[h] = p.causal ? min(p.len_k, rows.my_row[h] + offset + 1) : p.len_k;
    return rows;
}

// The tile's Q buffer: its address (for the recompute's ldmatrix) and the low word of the
// descriptor of this consumer's rows, 64 c rows (8 swizzle atoms, 8 KB) into the tile's first box.
struct QTile {
    uint32_t addr;
    uint32_t desc;
};

struct ConsumerMainloop : TraceRefs {
    SmemLayout sm;
    int consumer, warp, lane, quad;
    // exp(scale * (s - m)) = 2^(s * scale_log2 - m * scale_log2): one FFMA feeds each EX2.
    float scale_log2;
    // Pingpong, as in stage 13: one turn per iteration, QK of tile t and PV of tile t - 1 issued
    // together. Consumer c syncs on barrier PINGPONG_BAR + c before its turn and, once the turn's
    // wgmmas are issued, arrives on the next consumer's barrier (c + 1, or 0 after the last): with
    // two consumers the other's, with three a ring in which each waits for the one before it.
    uint32_t my_turn, next_turn;

    __device__ __forceinline__ int stage_of(const ConsumerPipeline& pipe, int tile) const {
        return (pipe.kv_base + tile) % KV_STAGES;
    }
    __device__ __forceinline__ void wait_full(uint32_t full, uint32_t& phase, int b) const {
        mbarrier_wait(full + 8 * b, (phase >> b) & 1);
        phase ^= 1u << b;
    }
    __device__ __forceinline__ void wait_k(ConsumerPipeline& pipe, int tile) const {
        wait_full(sm.k_full, pipe.k_phase, stage_of(pipe, tile));
    }
    __device__ __forceinline__ void wait_v(ConsumerPipeline& pipe, int tile) const {
        wait_full(sm.v_full, pipe.v_phase, stage_of(pipe, tile));
    }
    // Retires this warp's QK of `tile` (the caller has waited for its wgmma group): K's buffer is
    // free, one arrival of the CONSUMER_WARPS, lane 0 speaking for the warp.
    __device__ __forceinline__ void release_k(const ConsumerPipeline& pipe, int tile) const {
        if (lane == 0) mbarrier_arrive(sm.k_empty + 8 * stage_of(pipe, tile));
    }

    // S = Q Kᵀ (64 x BLOCK_N per warpgroup): K_STEPS k-steps of 16 head-dim columns, one wgmma group
    // (of N = BLOCK_N: wgmma_shapes.cuh picks the instruction by the size of S). Q (A) and K (B = Kᵀ)
    // are both K-major: a 16-column step is 32 bytes into each 128-byte swizzled row, in box kk / 4.
    // Every consumer reads the same K; consumer c's 64 rows of Q start 64 c rows (8 swizzle atoms,
    // 8 KB) into each BLOCK_M-row box of Q (q.desc). Each step's descriptors are the tiles' base
    // descriptors plus the step's constant offset.
    __device__ __forceinline__ void issue_qk(const ConsumerPipeline& pipe, float (&s)[S_REGS], const QTile& q,
                                             int tile) const {
        const uint32_t k_desc = desc_lo(sm.k_tiles + stage_of(pipe, tile) * K_TILE_BYTES, 16);
        uint32_t q_desc = q.desc;
        if constexpr (Q_DESC_PER_TURN) asm volatile("" : "+r"(q_desc));  // recomputed from here, every turn
        #pragma unroll
        for (int kk = 0; kk < K_STEPS; ++kk) {
            const uint32_t in_row = (kk * 16 % BOX_COLS) * 2;  // bytes into the 128-byte box row
            const uint64_t desc_q = desc_at(q_desc, (kk * 16 / BOX_COLS) * (BLOCK_M * BOX_COLS * 2) + in_row);
            const uint64_t desc_k = desc_at(k_desc, (kk * 16 / BOX_COLS) * (BLOCK_N * BOX_COLS * 2) + in_row);
            wgmma_ss<0>(s, desc_q, desc_k, kk > 0);  // the first step overwrites S
        }
        wgmma_commit();
    }

    // O += P V (64 x O_COLS per warpgroup, all reading the same V): PV_STEPS k-steps of 16 keys,
    // one wgmma group (of N = O_COLS, picked by the size of O; at head dim 96 it reads the first 96
    // of the two boxes' 128 columns, the rest being the zeros the copy engine filled in). P (A) comes from registers, four
    // per thread and step. V (B) is MN-major — row k of B is row k of V, head-dim contiguous — so the
    // transpose bit is set; a step is 16 V rows = two 1024-byte atoms apart by SBO, and the 64-column
    // boxes of V are LBO = one box apart.
    __device__ __forceinline__ void issue_pv(const ConsumerPipeline& pipe, float (&o_acc)[O_REGS],
                                             const uint32_t (&p_frag)[P_REGS], int tile) const {
        const uint32_t v_desc = desc_lo(sm.v_tiles + stage_of(pipe, tile) * V_TILE_BYTES, BLOCK_N * BOX_COLS * 2);
        #pragma unroll
        for (int j = 0; j < PV_STEPS; ++j) {
            const uint64_t desc_v = desc_at(v_desc, j * 16 * 128);
            wgmma_rs<1>(o_acc, p_frag[4 * j], p_frag[4 * j + 1], p_frag[4 * j + 2], p_frag[4 * j + 3], desc_v, 1);
        }
        wgmma_commit();
    }

    // Retires this warp's PV of `tile` (wait_group 0): O is final for it, and its reads of P's
    // registers and of V are over, so lane 0 frees the buffer for the whole warp (one arrival of
    // the CONSUMER_WARPS; wait_group is warp-synchronous). tile < 0: no PV was in flight. `n` labels the
    // trace point.
    __device__ __forceinline__ void retire_pv(const ConsumerPipeline& pipe, float (&o_acc)[O_REGS],
                                              uint32_t (&p_frag)[P_REGS], int tile, int n) const {
        TRACE_BEGIN(wait_pv);
        wgmma_wait<0>();
        TRACE_END(wait_pv, n, tile);
        wgmma_fence_operands(o_acc);
        wgmma_fence_operands(p_frag);  // P stays allocated up to here
        if (tile >= 0 && lane == 0) mbarrier_arrive(sm.v_empty + 8 * stage_of(pipe, tile));
    }

    // After the previous PV has retired: rescale O if the softmax moved the max, and round this
    // tile's probabilities into P.
    __device__ __forceinline__ void rescale_and_pack(const Softmax& softmax, float (&o_acc)[O_REGS],
                                                     const float (&s)[S_REGS], uint32_t (&p_frag)[P_REGS]) const {
        softmax.rescale(o_acc);
        convert_to_p(s, p_frag);
        wgmma_fence_operands(p_frag);  // P is computed before the next turn's fence, not sunk past it
    }

    // The overflow path's scores, recomputed by this warp alone: a wgmma needs all four warps of
    // the warpgroup, and the overflow may be in one warp's rows only. S of its 16 rows for the
    // keys of `tile`, with mma.sync from the same swizzled Q and K tiles in shared memory (row r,
    // 16-byte chunk c of a 128-byte box row sits at chunk c ^ (r % 8)). The m16n8k16 accumulator
    // of each 8-key block holds rows group, group + 8 and columns 2 quad, +1: S's layout.
    __device__ __forceinline__ void recompute_scores(const ConsumerPipeline& pipe, float (&s)[S_REGS],
                                                     const QTile& q, int tile) const {
        const uint32_t k_tile = sm.k_tiles + stage_of(pipe, tile) * K_TILE_BYTES;
        const int q_row = consumer * WG_ROWS + (warp % 4) * 16 + lane % 16;  // of the tile's 128
        #pragma unroll
        for (int i = 0; i < S_REGS; ++i) s[i] = 0.f;
        #pragma unroll 1
        for (int kk = 0; kk < K_STEPS; ++kk) {
            // A: rows q_row, head-dim columns 16 kk (lanes 0-15) and 16 kk + 8 (lanes 16-31).
            const int q_col = kk * 16 + (lane / 16) * 8;
            uint32_t a[4];
            ldmatrix_x4(a, q.addr + (q_col / BOX_COLS) * (BLOCK_M * BOX_COLS * 2) + q_row * 128 +
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
    }

    // The softmax of an unmasked tile after the first: the exponentials straight away, then the
    // row sums tell whether any came out large (a rebase) or overflowed (the exact path, on the
    // scores recomputed from Q and K, from the sums before the tile). K is released only after
    // that check: the recompute reads it.
    __device__ __forceinline__ void softmax_unmasked(const ConsumerPipeline& pipe, Softmax& softmax,
                                                     float (&s)[S_REGS], const QTile& q, const TileRows& rows,
                                                     int tile) const {
        const float sum_before[2] = {softmax.row_sum[0], softmax.row_sum[1]};
        softmax.exponentiate(s, scale_log2);
        if (__any_sync(0xffffffffu, softmax.large())) {
            if (__any_sync(0xffffffffu, softmax.lost())) {
                // Some exponential overflowed, or came so close that no rebase could bring it back
                // in range exactly: recompute the tile's scores (K is still held) and take the exact
                // path from the sums before it.
                softmax.row_sum[0] = sum_before[0];
                softmax.row_sum[1] = sum_before[1];
                recompute_scores(pipe, s, q, tile);
                softmax.online(s, scale_log2, tile, rows.limit, quad, std::false_type{});
            } else {
                softmax.rebase(s, scale_log2);
            }
        }
        release_k(pipe, tile);
        wgmma_fence_operands(s);
        wgmma_fence_operands(softmax.row_sum);
    }

    // Tile t: one turn issues QK of t (group 1) and then PV of t - 1 (group 2). wait_group 1 returns
    // once all but the newest group have retired — QK of t — and the softmax of t runs while PV of
    // t - 1 is still on the tensor cores. That PV is retired at the top of the next iteration, not
    // right after the softmax: ptxas places a wait_group wherever it likes among the independent
    // instructions of its basic block, and hoists it above the exponentials (which then wait for
    // the PV and overlap nothing); the loop's back edge keeps it after them.
    template <class Masked>
    __device__ __forceinline__ void iteration(ConsumerPipeline& pipe, Softmax& softmax, float (&o_acc)[O_REGS],
                                              float (&s)[S_REGS], uint32_t (&p_frag)[P_REGS], const QTile& q,
                                              const TileRows& rows, int tile, int n, Masked masked) const {
        retire_pv(pipe, o_acc, p_frag, tile - 2, n);
        TRACE_BEGIN(rescale);
        rescale_and_pack(softmax, o_acc, s, p_frag);  // P of t - 1, and O rescaled for it
        TRACE_END(rescale, n, tile - 1);
        TRACE_BEGIN(wait_k);
        wait_k(pipe, tile);
        TRACE_END(wait_k, n, tile);
        TRACE_BEGIN(wait_v);
        wait_v(pipe, tile - 1);
        TRACE_END(wait_v, n, tile - 1);
        TRACE_BEGIN(wait_turn);
        named_barrier_sync<PINGPONG_THREADS>(my_turn);  // the consumer before has issued its turn
        TRACE_END(wait_turn, n, tile);
        TRACE_BEGIN(qk);
        wgmma_fence();  // O was rescaled, P written and S read by ordinary instructions
        issue_qk(pipe, s, q, tile);
        TRACE_END(qk, n, tile);
        TRACE_BEGIN(pv);
        issue_pv(pipe, o_acc, p_frag, tile - 1);
        TRACE_END(pv, n, tile - 1);
        named_barrier_arrive<PINGPONG_THREADS>(next_turn);  // turn over: the next consumer's turn
        TRACE_BEGIN(wait_qk);
        wgmma_wait<1>();  // QK of t has retired; PV of t - 1 may still run
        wgmma_fence_operands(s);
        TRACE_END(wait_qk, n, tile);
        TRACE_BEGIN(softmax);
        if constexpr (Masked::value) {
            release_k(pipe, tile);
            softmax.online(s, scale_log2, tile, rows.limit, quad, masked);
        } else {
            softmax_unmasked(pipe, softmax, s, q, rows, tile);  // releases K once it knows the scores are not needed again
        }
        TRACE_END(softmax, n, tile);
    }

    // The K/V loop of one output tile with at least one K/V tile (its Q buffer qb): O accumulated
    // in o_acc, the rows' state in softmax. Per thread: 64 fp32 registers of O and 64 of S (its
    // warpgroup's 64 x 128 and 64 x 128 tiles spread over 128 threads), then 32 bf16x2 registers of
    // P; Q, K and V never pass through registers. P outlives an iteration: P of tile t - 1 is read
    // by the PV wgmma that runs during the softmax of tile t, so S (tile t, in fp32) and P (tile
    // t - 1, in bf16) are live together.
    __device__ __forceinline__ void mma(ConsumerPipeline& pipe, Softmax& softmax, float (&o_acc)[O_REGS],
                                        float (&s)[S_REGS], uint32_t (&p_frag)[P_REGS], const OutTile& t,
                                        const TileRows& rows, int qb, const QTile& q, int n) const {
        const int num_tiles = t.kv_tiles;
        TRACE_BEGIN(wait_q);
        mbarrier_wait(sm.q_full + 8 * qb, (pipe.q_phase >> qb) & 1);  // this tile's Q has landed
        TRACE_END(wait_q, n, -1);
        pipe.q_phase ^= 1u << qb;

        // Tile 0: its QK alone in the first turn, then its softmax (no PV to overlap yet).
        TRACE_BEGIN(wait_k);
        wait_k(pipe, 0);
        TRACE_END(wait_k, n, 0);
        TRACE_BEGIN(wait_turn);
        named_barrier_sync<PINGPONG_THREADS>(my_turn);
        TRACE_END(wait_turn, n, 0);
        TRACE_BEGIN(qk);
        wgmma_fence();  // S and O were last written by ordinary instructions
        issue_qk(pipe, s, q, 0);
        TRACE_END(qk, n, 0);
        named_barrier_arrive<PINGPONG_THREADS>(next_turn);  // turn over: the next consumer's turn
        TRACE_BEGIN(wait_qk);
        wgmma_wait<0>();
        wgmma_fence_operands(s);
        TRACE_END(wait_qk, n, 0);
        release_k(pipe, 0);
        TRACE_BEGIN(softmax);
        if (t.mask_from == 0) softmax.online(s, scale_log2, 0, rows.limit, quad, std::true_type{});
        else softmax.online(s, scale_log2, 0, rows.limit, quad, std::false_type{});
        TRACE_END(softmax, n, 0);

        // Two loops: the tiles every row sees whole, without a mask, then the tiles the diagonal
        // (or the end of the keys) crosses, with one.
        const int unmasked_end = max(1, min(t.mask_from, num_tiles));
        for (int tile = 1; tile < unmasked_end; ++tile)
            iteration(pipe, softmax, o_acc, s, p_frag, q, rows, tile, n, std::false_type{});
        for (int tile = unmasked_end; tile < num_tiles; ++tile)
            iteration(pipe, softmax, o_acc, s, p_frag, q, rows, tile, n, std::true_type{});

        // The last PV alone in the last turn of the tile. The turns go on into the next output tile
        // (whose first turn, QK of its tile 0, consumer 0 takes after this one of the last consumer's),
        // except after the last consumer's last turn of its last tile, which it does not hand over.
        retire_pv(pipe, o_acc, p_frag, num_tiles - 2, n);
        TRACE_BEGIN(rescale);
        rescale_and_pack(softmax, o_acc, s, p_frag);
        TRACE_END(rescale, n, num_tiles - 1);
        TRACE_BEGIN(wait_v);
        wait_v(pipe, num_tiles - 1);
        TRACE_END(wait_v, n, num_tiles - 1);
        TRACE_BEGIN(wait_turn);
        named_barrier_sync<PINGPONG_THREADS>(my_turn);
        TRACE_END(wait_turn, n, num_tiles);
        TRACE_BEGIN(pv);
        wgmma_fence();  // O was rescaled and P written by ordinary instructions
        issue_pv(pipe, o_acc, p_frag, num_tiles - 1);
        TRACE_END(pv, n, num_tiles - 1);
        named_barrier_arrive<PINGPONG_THREADS>(next_turn);
        retire_pv(pipe, o_acc, p_frag, num_tiles - 1, n);
        // Every wgmma of this tile has retired, the last QK (the last reader of Q) among them: lane 0
        // frees the Q buffer for its warp. The producer refills it with the Q of the tile Q_STAGES on.
        // (O_IN_Q: the buffer is freed once the epilogue's store has read the O staged in it.)
        if (!O_IN_Q && lane == 0) mbarrier_arrive(sm.q_empty + 8 * qb);
    }
};

// ---------------------------------------------------------------------------------------------
// The epilogue: a consumer's 64 rows of O, through its part of the staging buffer, out by TMA.
struct Epilogue : TraceRefs {
    const CUtensorMap* o_map;
    // The O staging of this consumer: its 64 rows as V_BOXES 64 x 64 boxes (8 KB each, O_BOX_STRIDE
    // apart), 128-byte swizzled as the O map says. Thread 0 of the warpgroup issues the TMA stores, and so it is also
    // the only thread that can wait for them (bulk groups are per thread).
    uint32_t o_stage;
    bool store_thread;
    uint32_t epilogue_bar;  // the consumer's own named barrier, its 128 threads
    int warp, group, quad;
    float scale_log2;

    // Finish the row sums across the quad, divide, round to bf16 into the staging buffer, store. A
    // row that saw no key has a sum of 0 and an output of 0 (not 0 / 0). q_empty: the barrier of
    // the tile's Q buffer, which the staging is when O_IN_Q.
    __device__ __forceinline__ void store(const float (&o_acc)[O_REGS], const Softmax& softmax, const AttnParams& p,
                                          const OutTile& t, const TileRows& rows, int n, uint32_t q_empty) const {
        TRACE_BEGIN(epilogue);
        // The log-sum-exp, ln(sum_j e^(scale s_j)) = ln 2 (scale_log2 max + log2(sum)), from lane 0 of
        // each quad for its two rows: -inf for a row that saw no key (sum 0, max -inf).
        float inv_sum[2];
        #pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float sum = quad_sum(softmax.row_sum[half]);
            inv_sum[half] = sum > 0.f ? 1.f / sum : 0.f;
            if (p.lse != nullptr && quad == 0 && rows.my_row[half] < p.len_q) {
                const float lse = sum > 0.f
                                      ? (softmax.row_max[half] * scale_log2 + __log2f(sum)) * 0.6931471805599453f
                                      : -INFINITY;
                p.lse[(int64_t(t.batch) * p.heads + t.head) * p.len_q + rows.my_row[half]] = lse;
            }
        }
        if constexpr (O_IN_Q) {
            if (t.kv_tiles == 0) {  // no Q buffer of its own to stage in (see store_zeros)
                store_zeros(p, t, rows);
                TRACE_END(epilogue, n, -1);
                return;
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
        for (int j = 0; j < O_COLS / 8; ++j) {  // (96: box 1's last 32 columns are left as they are; the
            #pragma unroll                         // store reads them, and the copy engine drops what is past 96)
            for (int half = 0; half < 2; ++half) {
                const int r = (warp % 4) * 16 + group + 8 * half;
                const uint32_t addr = o_stage + (j / 8) * O_BOX_STRIDE + r * 128 +
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
            for (int box = 0; box < V_BOXES; ++box)
                tma_store_4d(o_map, o_stage + box * O_BOX_STRIDE, box * BOX_COLS, rows.o_row, t.head, t.batch);
            bulk_commit_group();  // the store runs on while this consumer starts the next tile
            TRACE_MARK(store, n, -1);
            if constexpr (O_IN_Q) {
                // The staging is this consumer's rows of the Q buffer, which the producer refills with
                // the Q of the next tile once every consumer has said so: once the copy engine has
                // read them (the store's writes to global memory may still be on their way).
                bulk_wait_group_read<0>();
                mbarrier_arrive(q_empty);
            }
        }
    }

    // O_IN_Q, a tile whose rows see no key: the producer loads no Q for it, and may be loading the
    // next tile's Q into the buffer now, so its zeros go straight to global memory (rows past len_q
    // are not written), a 4-byte store per pair of columns.
    __device__ __forceinline__ void store_zeros(const AttnParams& p, const OutTile& t, const TileRows& rows) const {
        #pragma unroll
        for (int half = 0; half < 2; ++half) {
            if (rows.my_row[half] >= p.len_q) continue;
            bf16* row = static_cast<bf16*>(p.o) + t.batch * p.o_stride[0] + t.head * p.o_stride[1] +
                        rows.my_row[half] * p.o_stride[2];
            #pragma unroll
            for (int j = 0; j < HEAD_DIM_V / 8; ++j) *reinterpret_cast<uint32_t*>(row + 8 * j + 2 * quad) = 0u;
        }
    }

    // The last stores must have finished with shared memory (and their writes with global memory)
    // before the CTA exits and its shared memory goes to the next kernel.
    __device__ __forceinline__ void finish() const {
        if (store_thread) bulk_wait_group<0>();
    }
};

// ---------------------------------------------------------------------------------------------
// The kernel: the setup, then each role's loop over the CTA's output tiles.
//
// One CTA per SM: setmaxnreg needs the register count at entry to be known (the launch bounds fix
// it at 65536 / NUM_THREADS), and the consumers' registers leave no room for a second CTA. The grid
// is the SM count (at most the number of output tiles): each CTA loops over output tiles.
// COMPUTED_ORDER: CTA j takes tiles j, j + gridDim.x, ... in stage 17's order (no counter; launches
// without a mask); otherwise tiles are claimed from the counter in the grouped longest-first order.
// The consumer whose turn follows consumer c's: c + 1, and 0 after the last. (For two, 1 - c: the
// same number, written as stage 23 wrote it, which keeps its machine code; (c + 1) % 2 is compiled
// to other instructions and changes the registers of the whole kernel.)
static __device__ __forceinline__ int next_consumer(int c) { return CONSUMERS == 2 ? 1 - c : (c + 1) % CONSUMERS; }

// (The kernel's body, which attention_kernel<D, COMPUTED_ORDER> at the end of the file calls; the
// tensor maps by reference: their addresses are the kernel parameters'.)
template <bool COMPUTED_ORDER>
static __device__ __forceinline__ void kernel_main(const CUtensorMap& q_map, const CUtensorMap& k_map,
                                                   const CUtensorMap& v_map, const CUtensorMap& o_map,
                                                   const AttnParams& p, const TileOrder& order, int* tile_counter) {
    const int warp = threadIdx.x / 32;  // warps 0-3 produce, 4-7, 8-11 (and 12-15) are the consumers
    const int lane = threadIdx.x % 32;
    const int wg = threadIdx.x / 128;   // 0: producer; 1, 2 (, 3): consumer wg - 1, CTA rows 64 (wg - 1) ..
    const int group = lane / 4;  // accumulator row within the warp's 8-row half
    const int quad = lane % 4;   // accumulator column pair
    TRACE_INIT();

    const int q_blocks = (p.len_q + BLOCK_M - 1) / BLOCK_M;  // the last one may run past len_q
    const int num_out_tiles = p.batch * p.heads * q_blocks;

    extern __shared__ __align__(1024) unsigned char smem[];
    const SmemLayout sm = smem_layout(smem_addr(smem));
    if (threadIdx.x == 0) init_barriers(sm);
    __syncthreads();  // the last CTA-wide barrier: from here on the roles meet only on mbarriers

    const TileScheduler<COMPUTED_ORDER> sched{TRACE_REFS, num_out_tiles, tile_counter, sm.sched_full, sm.sched_empty,
                                              sm.tile_ids};

    if (wg == 0) {
        // Producer. The whole warpgroup gives up its registers (setmaxnreg is warpgroup-wide), then
        // one thread of warp 0 issues every copy; the other 127 threads have nothing left to do.
        setmaxnreg_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            const Producer producer{TRACE_REFS, &q_map, &k_map, &v_map, sm};
            producer.run(sched, order, p);
        }
        return;  // the producer's branch ends here: no code below runs in both roles
    }

    // Consumer warpgroup wg - 1 (the rest of the kernel): stage 13's loop on its 64 query rows, once
    // per output tile.
    setmaxnreg_inc<CONSUMER_REGS>();
    const int consumer = wg - 1;  // rows 64 consumer .. 64 consumer + 63 of the CTA's BLOCK_M
    const float scale_log2 = p.scale * 1.4426950408889634f;

    // The turns run on across output tiles (all consumers walk the same tiles, so their turn
    // counts match): the last consumer's arrival here, once per CTA, lets consumer 0 go first. The
    // last consumer also arrives after its very last turn — whether a tile is its last is known
    // only once the next id is read — and consumer 0 takes that arrival with one sync after the
    // loop: every phase of every barrier completes.
    const ConsumerMainloop mainloop{TRACE_REFS, sm, consumer, warp, lane, quad, scale_log2,
                                    uint32_t(PINGPONG_BAR + consumer), uint32_t(PINGPONG_BAR + next_consumer(consumer))};
    ConsumerPipeline pipe;
    const Epilogue epilogue{TRACE_REFS, &o_map, sm.o_tile + consumer * O_CONSUMER_OFFSET,
                            threadIdx.x % 128 == 0, uint32_t(EPILOGUE_BAR + consumer), warp, group, quad, scale_log2};
    const int offset = p.len_k - p.len_q;  // causal: row i sees keys j <= i + offset
    if (consumer == CONSUMERS - 1) named_barrier_arrive<PINGPONG_THREADS>(mainloop.next_turn);
    for (int n = 0;; ++n) {
        const int out_tile = sched.receive(n);
        if (out_tile < 0) break;
        const OutTile t = describe_tile<COMPUTED_ORDER>(out_tile, order, p);
        const TileRows rows = tile_rows(t, consumer, warp, group, offset, p);
        const int qb = pipe.local % Q_STAGES;
        if (t.kv_tiles > 0) ++pipe.local;  // the producer loads no Q for a tile whose rows see no key
        const uint32_t q_tile = sm.q_tiles + qb * Q_TILE_BYTES;
        const QTile q{q_tile, desc_lo(q_tile + consumer * (WG_ROWS * BOX_COLS * 2), 16)};

        // The accumulators of O and S, and P: declared here, where stage 22 declared them, and lent
        // to the mainloop (declared inside it, they come first in the compiler's numbering).
        float o_acc[O_REGS] = {};
        float s[S_REGS];
        uint32_t p_frag[P_REGS];
        Softmax softmax;
        // A tile whose rows see no key skips all of this: its O stays 0 and so does its row sum, and
        // the epilogue stores zeros. (Branching around the work on a uniform condition keeps the
        // loop's descriptor arithmetic in uniform registers; a per-thread test on the rows here
        // would not.)
        if (t.kv_tiles > 0) mainloop.mma(pipe, softmax, o_acc, s, p_frag, t, rows, qb, q, n);
        epilogue.store(o_acc, softmax, p, t, rows, n, sm.q_empty + 8 * qb);
        pipe.kv_base += t.kv_tiles;
    }
    // The last consumer's arrival after its last turn (or its first one, in a CTA that had no turn).
    if (consumer == 0) named_barrier_sync<PINGPONG_THREADS>(mainloop.my_turn);
    epilogue.finish();
}

// The host side for head dim D (hopattn_launch, at the end, picks D).
static int launch(const AttnParams* p, cudaStream_t stream, char* err, int errlen) {
    if (p->len_q <= 0 || p->len_k <= 0 || p->batch <= 0 || p->heads <= 0) {
        snprintf(err, errlen, "stage needs positive batch, heads, len_q and len_k");
        return 1;
    }
    if (p->kv_heads <= 0 || p->heads % p->kv_heads) {
        snprintf(err, errlen, "stage needs heads (%d) to be a multiple of kv_heads (%d)", p->heads, p->kv_heads);
        return 1;
    }
    // Q, K and V are read and O written through 4-D maps [batch, heads, len, head dim] with the
    // caller's strides (BHSD, BSHD or any other with a dense head-dim axis and 16-byte multiples): a
    // box that runs past a head's length (or head dim) reads zeros and writes nothing. Q and O boxes
    // are one consumer's or the CTA's rows, K and V boxes one K/V tile; all are 64 columns (128
    // bytes) wide.
    CUtensorMap q_map, k_map, v_map, o_map;
    if (make_tma_4d_bf16(&q_map, p->q, p->batch, p->heads, p->len_q, HEAD_DIM, p->q_stride, BLOCK_M, BOX_COLS, "q",
                         err, errlen) ||
        make_tma_4d_bf16(&k_map, p->k, p->batch, p->kv_heads, p->len_k, HEAD_DIM, p->k_stride, BLOCK_N, BOX_COLS, "k",
                         err, errlen) ||
        make_tma_4d_bf16(&v_map, p->v, p->batch, p->kv_heads, p->len_k, HEAD_DIM_V, p->v_stride, BLOCK_N, BOX_COLS,
                         "v", err, errlen) ||
        make_tma_4d_bf16(&o_map, p->o, p->batch, p->heads, p->len_q, HEAD_DIM_V, p->o_stride, WG_ROWS, BOX_COLS,
                         "out", err, errlen))
        return 1;
    // Causal tiles differ in cost: claimed longest first. Without a mask: stage 17's computed order.
    const auto kernel = p->causal ? attention_kernel<D, false> : attention_kernel<D, true>;
    HOPATTN_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES), err, errlen);
    // Persistent grid: one CTA per SM (the kernel fits no second one), never more CTAs than tiles.
    const int64_t num_out_tiles = int64_t(p->batch) * p->heads * ((p->len_q + BLOCK_M - 1) / BLOCK_M);
    if (num_out_tiles >= (int64_t(1) << 31)) {
        snprintf(err, errlen, "stage needs batch * heads * ceil(len_q / %d) < 2^31", BLOCK_M);
        return 1;
    }
    // The divisors of describe_tile, and the size of a group of heads (as stage 18 chose it: the
    // heads whose K and V fit in HEAD_GROUP_BYTES, the query heads of a K/V head counted once).
    const int q_blocks = (p->len_q + BLOCK_M - 1) / BLOCK_M;
    const int pairs = p->batch * p->heads;
    const int group = p->heads / p->kv_heads;
    const int head_group =
        std::max(1, std::min(pairs, int(HEAD_GROUP_BYTES / (int64_t(p->len_k) * (HEAD_DIM + HEAD_DIM_V) * 2) * group)));
    const int groups = (pairs + head_group - 1) / head_group;
    const TileOrder order{make_fast_divmod(q_blocks),
                          make_fast_divmod(p->heads),
                          make_fast_divmod(group),
                          make_fast_divmod(head_group * q_blocks),
                          make_fast_divmod(head_group),
                          make_fast_divmod(pairs - (groups - 1) * head_group)};
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
    kernel<<<grid, NUM_THREADS, SMEM_BYTES, stream>>>(q_map, k_map, v_map, o_map, *p, order, tile_counter);
    const cudaError_t launched = cudaGetLastError();
    if (tile_counter) HOPATTN_CHECK(cudaFreeAsync(tile_counter, stream), err, errlen);
    HOPATTN_CHECK(launched, err, errlen);
    return 0;
}

static int describe(KernelInfo* info, char* err, int errlen) {
    return describe_kernel(attention_kernel<D, false>, NUM_THREADS, SMEM_BYTES, BLOCK_M, BLOCK_N, info, err, errlen);
}
};  // struct Attention

template <int D, bool COMPUTED_ORDER>
__global__ void __launch_bounds__(Attention<D>::NUM_THREADS, 1) attention_kernel(
    const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
    const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap o_map, const AttnParams p,
    const typename Attention<D>::TileOrder order, int* tile_counter) {
    Attention<D>::template kernel_main<COMPUTED_ORDER>(q_map, k_map, v_map, o_map, p, order, tile_counter);
}

// The head dims of HeadDimTile (192: with V and O of 128). Python's contract refuses any other
// before it gets here (hopattn.contract); this says so again for a caller of the library itself.
HOPATTN_EXPORT int hopattn_launch(const AttnParams* p, cudaStream_t stream, char* err, int errlen) {
    switch (p->head_dim) {
        case 64: return Attention<64>::launch(p, stream, err, errlen);
        case 96: return Attention<96>::launch(p, stream, err, errlen);
        case 128: return Attention<128>::launch(p, stream, err, errlen);
        case 192: return Attention<192>::launch(p, stream, err, errlen);
        case 256: return Attention<256>::launch(p, stream, err, errlen);
    }
    snprintf(err, errlen, "stage serves head_dim 64, 96, 128, 192 (with v's 128) and 256, got %d", p->head_dim);
    return 1;
}

// What the compiled kernel of head dim 128 needs (the tile the stage's figures draw).
HOPATTN_EXPORT int hopattn_describe(KernelInfo* info, char* err, int errlen) {
    return Attention<128>::describe(info, err, errlen);
}
