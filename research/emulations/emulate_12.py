"""CPU checks of stage 12 (pingpong; no GPU). Stage 13 reuses the model (emulate_13.py).

The producer, the ring and the per-warpgroup math are stage 11's (emulate_11.py checks them). New
are two named barriers of 256 threads that order the consumers' GEMM issues. This is a randomized
interleaving model of the whole protocol: the producer thread, the TMA copies (landing at random
later moments), and the eight consumer warps, *each warp its own actor* — the four warps of a
warpgroup are not in lockstep (bar.sync, wgmma and wait_group are .sync.aligned over a warp, not
over the warpgroup), so a warp may run ahead of its siblings up to the next barrier that stops it.

Named barriers are modelled as the PTX ISA describes them: a barrier counts arriving warps (32
threads each) in its current phase; bar.sync arrives and blocks the warp until the phase
completes, bar.arrive arrives and goes on; when the count reaches 256 threads the phase completes,
every warp blocked on it is released and the barrier starts the next phase from zero.

Checked, over random schedules for 1-16 tiles and rings of 2 and 3:
  - every phase of barrier PINGPONG_BAR + c is made of exactly the four warps of consumer c
    (bar.sync) and the four warps of the other consumer (bar.arrive), each once;
  - the GEMM slots are issued in the pingpong order: a warp of consumer 0 issues its slot k only
    after every warp of consumer 1 has issued slot k - 1, and a warp of consumer 1 its slot k only
    after every warp of consumer 0 has issued slot k;
  - at the end no barrier holds a partial phase (no arrival is left without its bar.sync);
  - the ring: every warp reads tile t only after all of its bytes landed, no copy lands in a
    buffer that a warp still reads, nothing deadlocks.
Deliberate bugs must be caught: no initial arrival, consumer 1 arriving after its last GEMM too,
both consumers making the initial arrival, arriving before the GEMM instead of after it (issue
order violated), a consumer syncing on the other's barrier.

    python3 emulate_12.py
"""
import random

import emulate_11 as e11

CONSUMERS, WARPS_PER_WG = 2, 4
CONSUMER_WARPS = CONSUMERS * WARPS_PER_WG
PINGPONG_BAR, PINGPONG_THREADS = 1, 256


class ProtocolError(AssertionError):
    pass


class NamedBarrier:
    def __init__(self, bar_id, threads=PINGPONG_THREADS):
        self.id, self.threads = bar_id, threads
        self.members = []       # (warp, "sync" | "arrive") of the current phase
        self.completed = []     # the members of each completed phase
        self.generation = 0     # completed phases

    def _arrive(self, warp, kind):
        self.members.append((warp, kind))
        if 32 * len(self.members) == self.threads:
            self.completed.append(tuple(self.members))
            self.members = []
            self.generation += 1

    def arrive(self, warp):
        self._arrive(warp, "arrive")

    def sync(self, warp):
        """Arrive; returns the generation to wait past (the phase this warp belongs to)."""
        gen = self.generation
        self._arrive(warp, "sync")
        return gen


def program_12(c, num_tiles, last_arrive_skipped=True, initial_by=(1,), arrive_before_issue=False,
               swap_ids=False):
    """The consumer loop of stage 12 as a list of steps for one warp of consumer c.

    Steps: ("arrive", bar), ("sync", bar), ("wait_full", tile), ("issue", slot, reads), where
    reads names the buffers' tiles the GEMM reads, ("compute",) for softmax and wait_group time,
    ("end_reads", tile) where wait_group 0 has retired the last wgmma reading the tile, ("release",
    tile) for lane 0's arrival on the tile's empty barrier."""
    mine = PINGPONG_BAR + (1 - c if swap_ids else c)
    other = PINGPONG_BAR + (c if swap_ids else 1 - c)
    steps = []
    if c in initial_by and num_tiles > 0:
        steps.append(("arrive", other))
    slot = 0

    def gemm(tile_reads, last):
        nonlocal slot
        steps.append(("sync", mine))
        if arrive_before_issue and not (last and c == 1 and last_arrive_skipped):
            steps.append(("arrive", other))
        steps.append(("issue", slot, tile_reads))
        if not arrive_before_issue and not (last and c == 1 and last_arrive_skipped):
            steps.append(("arrive", other))
        slot += 1

    for tile in range(num_tiles):
        steps.append(("wait_full", tile))
        gemm((tile,), last=False)                  # QK
        steps.append(("compute",))                 # wait_group 0, softmax
        gemm((tile,), last=tile + 1 == num_tiles)  # PV
        steps.append(("compute",))                 # wait_group 0
        steps.append(("end_reads", tile))
        steps.append(("release", tile))
    return steps


def simulate(program, num_tiles, seed, stages=e11.KV_STAGES, **bug):
    rnd = random.Random(seed)
    full = [e11.Barrier(1) for _ in range(stages)]
    empty = [e11.Barrier(CONSUMER_WARPS) for _ in range(stages)]
    named = {PINGPONG_BAR + c: NamedBarrier(PINGPONG_BAR + c) for c in range(CONSUMERS)}
    content = [None] * stages
    landed = [0] * stages
    readers = [set() for _ in range(stages)]
    copies = []
    issued = [[0] * WARPS_PER_WG for _ in range(CONSUMERS)]  # slots issued per warp
    chunks = 4

    def producer():
        empty_phase = 0
        for tile in range(num_tiles):
            b = tile % stages
            if tile >= stages:
                while not empty[b].try_wait((empty_phase >> b) & 1):
                    yield "blocked"
                empty_phase ^= 1 << b
            full[b].arrive(expect_tx=2 * e11.KV_TILE_BYTES)
            landed[b] = 0
            for _ in range(chunks):
                copies.append((b, tile))
            yield "ran"

    def consumer(w):
        c, lane_warp = w // WARPS_PER_WG, w % WARPS_PER_WG
        full_phase = 0
        holding = {}  # tile -> buffer, from the first GEMM that reads it to its release
        for step in program(c, num_tiles, **bug):
            op = step[0]
            if op == "arrive":
                named[step[1]].arrive(w)
            elif op == "sync":
                gen = named[step[1]].sync(w)
                while named[step[1]].generation <= gen:
                    yield "blocked"
            elif op == "wait_full":
                b = step[1] % stages
                while not full[b].try_wait((full_phase >> b) & 1):
                    yield "blocked"
                full_phase ^= 1 << b
            elif op == "issue":
                k = step[1]
                other = 1 - c
                need = k if c == 0 else k + 1  # slots the other consumer's warps must have issued
                if min(issued[other]) < need:
                    raise ProtocolError(f"consumer {c} warp {lane_warp} issues slot {k} before every warp of "
                                        f"consumer {other} issued slot {need - 1}")
                for tile in step[2]:
                    b = tile % stages
                    if content[b] != tile:
                        raise e11.RaceError(f"warp {w} reads tile {tile} from buffer {b}, which holds {content[b]}")
                    holding[tile] = b
                    readers[b].add(w)
                issued[c][lane_warp] += 1
            elif op == "compute":
                for _ in range(rnd.randint(0, 3)):
                    yield "ran"
                    for tile, b in holding.items():
                        if content[b] != tile:
                            raise e11.RaceError(f"buffer {b} overwritten while warp {w} reads tile {tile}")
            elif op == "end_reads":  # wait_group has retired the last wgmma that reads the tile
                b = holding.pop(step[1])
                readers[b].discard(w)
            elif op == "release":  # lane 0's arrival on the tile's empty barrier
                empty[step[1] % stages].arrive()
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
                raise e11.RaceError(f"copy of tile {tile} lands in buffer {b} while warps {sorted(readers[b])} read it")
            landed[b] += 1
            content[b] = tile if landed[b] == chunks else ("partial", tile)
            full[b].complete_tx(2 * e11.KV_TILE_BYTES // chunks)
            stalls = 0
            continue
        try:
            status = next(actors[pick])
        except StopIteration:
            done.add(pick)
            status = "ran"
        stalls = stalls + 1 if status == "blocked" else 0
        if stalls > 5000:
            raise ProtocolError("deadlock: " + ", ".join(a for a in actors if a not in done))
    for bar_id, bar in named.items():
        owner = bar_id - PINGPONG_BAR
        if bar.members:
            raise ProtocolError(f"barrier {bar_id} ends with a partial phase: {bar.members}")
        for members in bar.completed:
            want = sorted([(owner * WARPS_PER_WG + i, "sync") for i in range(WARPS_PER_WG)] +
                          [((1 - owner) * WARPS_PER_WG + i, "arrive") for i in range(WARPS_PER_WG)])
            if sorted(members) != want:
                raise ProtocolError(f"barrier {bar_id}: a phase made of {sorted(members)}")
    return True


def check(program, bugs, tiles=(1, 2, 3, 4, 5, 7, 10, 16), seeds=60):
    trials = 0
    for stages in (2, 3):
        for num_tiles in tiles:
            for seed in range(seeds):
                simulate(program, num_tiles, seed * 1000 + num_tiles, stages=stages)
                trials += 1
    for name, kw in bugs.items():
        caught = 0
        for seed in range(200):
            try:
                simulate(program, 6, seed, **kw)
            except (ProtocolError, e11.RaceError, AssertionError):
                caught += 1
        assert caught > 0, f"the model missed a deliberate bug: {name}"
        print(f"  deliberate bug caught in {caught}/200 schedules: {name}")
    return trials


BUGS = {
    "no initial arrival (consumer 0 never gets its first turn)": dict(initial_by=()),
    "consumer 1 also arrives after its last GEMM (a dangling half phase)": dict(last_arrive_skipped=False),
    "both consumers make the initial arrival": dict(initial_by=(0, 1)),
    "arrive before issuing the GEMM instead of after": dict(arrive_before_issue=True),
    "each consumer syncs on the other's barrier": dict(swap_ids=True),
}


if __name__ == "__main__":
    n = check(program_12, BUGS)
    print(f"stage 12: {n} random schedules: pingpong order kept, every barrier phase = 4 syncs + 4 arrivals, "
          f"no race, no deadlock")
    print("ok")
