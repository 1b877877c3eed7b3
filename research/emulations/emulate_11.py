"""CPU checks of stage 11 (no GPU).

1. Layouts. The consumers run stage 10's per-warpgroup math unchanged (emulate_10.py checks it
   numerically); what moves is the indexing: consumer c = wg - 1 (threads 128 (c + 1) ..), its Q
   descriptors offset by c * 64 rows, its epilogue rows q_row0 = (warp - 4) * 16. Checked: every
   descriptor names the right 64 rows of Q, and the 256 consumer threads' epilogue rows cover the
   CTA's 128 rows exactly once per (row, column pair).
2. The full/empty ring. A randomized interleaving model of the kernel's protocol with mbarriers
   modelled as the PTX ISA describes them (pending arrivals and transaction bytes per phase; a
   phase completes when both reach zero, then the barrier re-arms; try_wait.parity(P) succeeds
   once the phase of parity P has completed, i.e. while the current phase's parity differs from P).
   Actors: the producer thread (its loop transcribed), eight consumer warps (their loop
   transcribed: wait full, read the buffer from the first wgmma to wait_group, arrive on empty),
   and the TMA copies, each landing its bytes at a random later moment. Checked, over thousands of
   random schedules: every warp reads tile t from buffer t % KV_STAGES only after all of its bytes
   have landed and sees tile t there; no copy writes a buffer while any warp is still reading it;
   nothing deadlocks. Then deliberate bugs (empty count 4, a wrong initial parity, no wait on
   empty) must be caught, so the model is known to be able to fail.
3. The register budget: producer + 2 consumers fit the 168 x 384 registers the CTA starts with.

    python3 emulate_11.py
"""
import random

import numpy as np

import emulate_09 as e9

HEAD_DIM, WG_ROWS, CONSUMERS, BLOCK_N, BOX_COLS, KV_STAGES = 128, 64, 2, 64, 64, 3
BLOCK_M = CONSUMERS * WG_ROWS
NUM_THREADS = (1 + CONSUMERS) * 128
CONSUMER_WARPS = CONSUMERS * 4
PRODUCER_REGS, CONSUMER_REGS = 24, 240
Q_TILE_BYTES = BLOCK_M * HEAD_DIM * 2
KV_TILE_BYTES = BLOCK_N * HEAD_DIM * 2
NUM_BARRIERS = 1 + 2 * KV_STAGES
SMEM_BYTES = Q_TILE_BYTES + KV_STAGES * 2 * KV_TILE_BYTES + NUM_BARRIERS * 8


def check_layouts():
    rng = np.random.default_rng(3)
    q = e9.bf16(rng.standard_normal((BLOCK_M, HEAD_DIM)))
    smem = e9.Smem(0)
    q_tile = 1024 * 7
    for box in range(HEAD_DIM // BOX_COLS):
        smem.tma_box(q_tile + box * BLOCK_M * BOX_COLS * 2, q[:, box * BOX_COLS:(box + 1) * BOX_COLS])
    for wg in (1, 2):
        consumer = wg - 1
        for kk in range(HEAD_DIM // 16):
            desc_q = e9.make_desc(q_tile + (kk * 16 // BOX_COLS) * (BLOCK_M * BOX_COLS * 2) +
                                  consumer * (WG_ROWS * BOX_COLS * 2) + (kk * 16 % BOX_COLS) * 2, 16, 1024)
            assert np.array_equal(e9.operand(smem, desc_q, 64, True),
                                  q[64 * consumer:64 * consumer + 64, kk * 16:kk * 16 + 16])
    written = {}
    for tid in range(128, NUM_THREADS):
        warp, lane = tid // 32, tid % 32
        wg, group, quad = tid // 128, lane // 4, lane % 4
        q_row0 = (warp - 4) * 16
        for half in range(2):
            row = q_row0 + group + 8 * half
            # the accumulator row this thread holds, per the wgmma layout of its warpgroup
            m, _ = e9.frag_coord(tid - 128 * wg, 2 * half)
            assert row == 64 * (wg - 1) + m
            for j in range(HEAD_DIM // 8):
                key = (row, j * 8 + quad * 2)
                assert key not in written
                written[key] = tid
    assert len(written) == BLOCK_M * HEAD_DIM // 2


class Barrier:
    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0  # phase: completions so far

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self, expect_tx=0):
        assert self.pending > 0, "arrival on a barrier with no pending arrivals"
        self.tx += expect_tx
        self.pending -= 1
        self._maybe_complete()

    def complete_tx(self, nbytes):
        self.tx -= nbytes
        assert self.tx >= 0, "bytes landed before they were expected"
        self._maybe_complete()

    def try_wait(self, parity):
        return self.phase % 2 != parity  # the phase of parity `parity` has completed


class RaceError(AssertionError):
    pass


def simulate(num_tiles, seed, stages=KV_STAGES, empty_count=CONSUMER_WARPS, producer_waits=True,
             first_empty_parity=0, chunks=4):
    rnd = random.Random(seed)
    full = [Barrier(1) for _ in range(stages)]
    empty = [Barrier(empty_count) for _ in range(stages)]
    content = [None] * stages          # tile id whose bytes fully landed in the buffer
    landed = [0] * stages              # chunks of the current fill landed
    readers = [set() for _ in range(stages)]
    copies = []                        # in-flight chunks: (buffer, tile)

    def producer():
        empty_phase = first_empty_parity * ((1 << stages) - 1)
        for tile in range(num_tiles):
            b = tile % stages
            if tile >= stages and producer_waits:
                while not empty[b].try_wait((empty_phase >> b) & 1):
                    yield "blocked"
                empty_phase ^= 1 << b
            full[b].arrive(expect_tx=2 * KV_TILE_BYTES)
            landed[b] = 0
            for _ in range(chunks):  # K box 0, K box 1, V box 0, V box 1
                copies.append((b, tile))
            yield "ran"

    def consumer(w):
        full_phase = 0
        for tile in range(num_tiles):
            b = tile % stages
            while not full[b].try_wait((full_phase >> b) & 1):
                yield "blocked"
            full_phase ^= 1 << b
            if content[b] != tile:
                raise RaceError(f"warp {w} reads tile {tile} from buffer {b} but it holds {content[b]}")
            readers[b].add(w)  # first wgmma issued .. wait_group retired
            for _ in range(rnd.randint(1, 4)):
                yield "ran"
                if content[b] != tile:
                    raise RaceError(f"buffer {b} overwritten while warp {w} reads tile {tile}")
            readers[b].discard(w)
            empty[b].arrive()  # lane 0, after wgmma_wait<0>
            yield "ran"

    actors = {"producer": producer()}
    actors.update({f"warp{w}": consumer(w) for w in range(CONSUMER_WARPS)})
    done = set()
    stalls = 0
    while len(done) < len(actors) or copies:
        choices = [a for a in actors if a not in done]
        if copies:
            choices.append("tma")
        pick = rnd.choice(choices)
        if pick == "tma":
            b, tile = copies.pop(rnd.randrange(len(copies)))
            if readers[b]:
                raise RaceError(f"copy of tile {tile} lands in buffer {b} while warps {sorted(readers[b])} read it")
            landed[b] += 1
            if landed[b] == chunks:
                content[b] = tile
            else:
                content[b] = ("partial", tile)
            full[b].complete_tx(2 * KV_TILE_BYTES // chunks)
            stalls = 0
            continue
        try:
            status = next(actors[pick])
        except StopIteration:
            done.add(pick)
            status = "ran"
        stalls = stalls + 1 if status == "blocked" else 0
        if stalls > 5000:
            raise RaceError("deadlock: " + ", ".join(a for a in actors if a not in done))
    return True


def check_ring():
    trials = 0
    for stages in (2, 3):
        for num_tiles in (1, 2, 3, 4, 5, 7, 10, 16):
            for seed in range(60):
                simulate(num_tiles, seed * 1000 + num_tiles, stages=stages)
                trials += 1
    bugs = {
        "empty barrier counts 4 arrivals (one warpgroup) instead of 8": dict(empty_count=4),
        "producer waits on the wrong parity first": dict(first_empty_parity=1),
        "producer never waits on empty": dict(producer_waits=False),
    }
    for name, kw in bugs.items():
        caught = 0
        for seed in range(200):
            try:
                simulate(10, seed, **kw)
            except (RaceError, AssertionError):
                caught += 1
        assert caught > 0, f"the model missed a deliberate bug: {name}"
        print(f"  deliberate bug caught in {caught}/200 schedules: {name}")
    return trials


def check_registers():
    entry = (65536 // NUM_THREADS) // 8 * 8  # ptxas's cap under __launch_bounds__(384, 1): 168
    assert entry == 168
    freed = 128 * (entry - PRODUCER_REGS)
    needed = CONSUMERS * 128 * (CONSUMER_REGS - entry)
    assert needed <= freed, (needed, freed)
    assert 128 * PRODUCER_REGS + CONSUMERS * 128 * CONSUMER_REGS <= 65536
    return entry, freed, needed


if __name__ == "__main__":
    assert SMEM_BYTES == 131128, SMEM_BYTES
    check_layouts()
    print("layouts: consumer descriptors and epilogue rows ok")
    n = check_ring()
    print(f"ring: {n} random schedules without a race or a deadlock")
    entry, freed, needed = check_registers()
    print(f"registers: entry {entry}, producer frees {freed}, consumers take {needed}")
    print("ok")
