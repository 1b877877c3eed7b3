"""Stage 24's producer/consumer protocol on one CTA, emulated on the CPU, for each head dim's tile.

Stage 24 runs stage 23's protocol with other numbers: three consumer warpgroups at head dim 64 (the
turns go round a ring of three named barriers), four K/V buffers there, and at head dims 192 and
256 one Q buffer in which each consumer stages its O, so that the Q buffer is free only once both
consumers' TMA stores have read it. This script runs the producer and each consumer as coroutines
over sequences of output tiles (each with its number of K/V tiles, 0 for a tile whose rows see no
key), in both orders (the computed one without a mask, the tile-id ring of the causal launches),
with the rings, the mbarrier arrival counts and the named barriers of the pingpong as the kernel has
them, and reports whether every tile completes, or what each role waits for when none can move.
A named barrier that gets a second arrival before its waiter's sync is an error too (it would
complete a phase without the waiter: common/named_barrier.cuh).

It finds the deadlock that one Q buffer brings to the order without a mask, where the producer
holds the V of a tile's last K/V step back until the next tile's first K: its wait for the Q buffer
is a wait for the consumers to finish the tile before, whose last PV needs that V. `--unfixed`
leaves out the kernel's fix (the V it holds back issued before load_q when Q_STAGES is 1).

    python research/stage24/protocol.py              # every head dim of stage 24: no deadlock
    python research/stage24/protocol.py --unfixed    # without the fix: head dims 192 and 256 hang

The tiles' numbers (CONSUMERS, Q_STAGES, KV_STAGES, O_BUFFERS) are read from stage 24's kernel.cu
(kernels/attention/24_head-dims, or research/stage24/24_head-dims while it waits there).
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
SCHED_STAGES = 2


class Stuck(Exception):
    """A protocol error that is not a wait: a named barrier's phase completed without its waiter."""


@dataclass(frozen=True)
class Tile:
    head_dim: int
    consumers: int
    q_stages: int
    kv_stages: int
    o_in_q: bool


class State:
    """What the barriers count. A "full" barrier completes once per load (loads[ring][buffer]); an
    "empty" one once every consumer has released the buffer's use (released[ring][consumer][buffer]);
    the tile-id ring's slot n % 2 holds id n once published; turn[c]: arrivals pending on consumer
    c's named barrier (0 or 1)."""

    def __init__(self, t: Tile, tiles: list[int]):
        self.t = t
        stages = {"q": t.q_stages, "k": t.kv_stages, "v": t.kv_stages}
        self.loads = {r: [0] * n for r, n in stages.items()}
        self.released = {r: [[0] * n for _ in range(t.consumers)] for r, n in stages.items()}
        self.published = 0  # tile ids written into the ring
        self.read = [0] * t.consumers  # tile ids each consumer has read (and arrived on sched_empty for)
        self.turn = [0] * t.consumers
        self.moves = 0
        self.tiles = tiles


def producer(s: State, ring: bool, fixed: bool) -> Iterator[str]:
    """Producer::run: yields what it waits for whenever it must wait."""
    t = s.t
    held_v = None  # the V tile held back one behind K (its K/V counter), or None
    it = 0  # K/V tiles so far
    local = 0  # output tiles with work so far

    def load(name: str, n: int) -> Iterator[str]:
        stages = len(s.loads[name])
        b = n % stages
        uses = n // stages  # this buffer's earlier uses, each released by every consumer first
        while min(s.released[name][c][b] for c in range(t.consumers)) < uses:
            yield f"producer: {name}_empty[{b}] (use {uses})"
        s.loads[name][b] += 1
        s.moves += 1

    def issue_held_v() -> Iterator[str]:
        nonlocal held_v
        if held_v is not None:
            yield from load("v", held_v)
            held_v = None

    for n, kv_tiles in enumerate(s.tiles + [-1]):
        if ring:
            yield from issue_held_v()
            while n >= SCHED_STAGES and min(s.read) < n - SCHED_STAGES + 1:
                yield f"producer: sched_empty (slot {n % SCHED_STAGES})"
            s.published += 1
            s.moves += 1
        if kv_tiles < 0:
            break
        if kv_tiles == 0:
            continue  # no row of it sees a key: no loads
        if fixed and t.q_stages == 1:
            yield from issue_held_v()
        yield from load("q", local)
        local += 1
        for _ in range(kv_tiles):
            yield from load("k", it)
            yield from issue_held_v()
            held_v = it
            it += 1
    yield from issue_held_v()


def consumer(s: State, c: int, ring: bool) -> Iterator[str]:
    """Consumer c's loop (kernel_main, ConsumerMainloop::mma, Epilogue::store): yields its waits."""
    t = s.t
    last = t.consumers - 1
    me, nxt = c, (c + 1) % t.consumers  # its named barrier, and the one it hands its turn to
    uses = {"q": 0, "k": 0, "v": 0}  # loads of each ring it has taken (its K/V counter, its Q count)

    def wait_full(name: str, n: int) -> Iterator[str]:
        stages = len(s.loads[name])
        while s.loads[name][n % stages] <= n // stages:
            yield f"consumer {c}: {name}_full[{n % stages}] (load {n})"

    def release(name: str, n: int) -> None:
        stages = len(s.loads[name])
        s.released[name][c][n % stages] += 1
        s.moves += 1

    def arrive(bar: int) -> None:
        if s.turn[bar]:
            raise Stuck(f"consumer {c} arrived twice on consumer {bar}'s turn barrier before its sync")
        s.turn[bar] = 1
        s.moves += 1

    def sync(bar: int) -> Iterator[str]:
        while not s.turn[bar]:
            yield f"consumer {c}: its turn (barrier {bar})"
        s.turn[bar] = 0
        s.moves += 1

    def turn() -> Iterator[str]:
        yield from sync(me)
        arrive(nxt)

    if c == last:
        arrive(0)  # consumer 0 goes first
    kv_base = 0
    for n in range(len(s.tiles) + 1):
        if ring:
            while s.published <= n:
                yield f"consumer {c}: sched_full (id {n})"
            s.read[c] += 1  # every thread arrives on sched_empty once it has read the id
            s.moves += 1
        if n == len(s.tiles):
            break
        kv_tiles = s.tiles[n]
        if kv_tiles == 0:
            continue  # zeros to global memory (O_IN_Q) or through its own staging: no turn, no Q
        qn = uses["q"]
        uses["q"] += 1
        yield from wait_full("q", qn)
        yield from wait_full("k", kv_base)
        yield from turn()  # QK of tile 0 alone
        release("k", kv_base)
        for tile in range(1, kv_tiles):
            if tile >= 2:
                release("v", kv_base + tile - 2)  # top of the iteration: PV of tile - 2 retires
            yield from wait_full("k", kv_base + tile)
            yield from wait_full("v", kv_base + tile - 1)
            yield from turn()  # QK of tile, PV of tile - 1
            release("k", kv_base + tile)  # once its softmax no longer needs the scores again
        if kv_tiles >= 2:
            release("v", kv_base + kv_tiles - 2)
        yield from wait_full("v", kv_base + kv_tiles - 1)
        yield from turn()  # the last PV alone
        release("v", kv_base + kv_tiles - 1)
        release("q", qn)  # last wgmma retired (!O_IN_Q) or its TMA store has read the staging (O_IN_Q):
        # in this emulation both come before the consumer's next wait, so one release stands for both
        kv_base += kv_tiles
    if c == 0:
        yield from sync(0)  # the last consumer's arrival after its last turn


def run(t: Tile, tiles: list[int], ring: bool, fixed: bool) -> str | None:
    """None if every role finishes; otherwise what each waits for when none can move."""
    s = State(t, tiles)
    roles = {"producer": producer(s, ring, fixed)}
    roles.update({f"consumer {c}": consumer(s, c, ring) for c in range(t.consumers)})
    waiting: dict[str, str] = {}
    try:
        while roles:
            before, finished = s.moves, False
            for name in list(roles):
                try:
                    waiting[name] = next(roles[name])
                except StopIteration:
                    del roles[name]
                    waiting.pop(name, None)
                    finished = True
            if not finished and s.moves == before:
                return "; ".join(waiting.values())
    except Stuck as err:
        return str(err)
    if any(s.turn):
        return f"turn arrivals left over: {s.turn}"
    return None


def sequences(count: int, seed: int) -> Iterator[list[int]]:
    """Tile sequences one CTA can draw (as research/ring_deadlock.py's): K/V counts with empty tiles
    mixed in, runs of them at the end (longest-first causal with len_q > len_k), all empty, one."""
    yield from ([0], [0, 0, 0], [1], [1, 1, 1], [0, 0, 3, 0, 0], [2, 0, 0], [5, 4, 0, 0, 0, 0], [9, 9, 9])
    rng = random.Random(seed)
    for _ in range(count):
        work = [rng.randint(1, 9) for _ in range(rng.randint(0, 6))]
        mixed = work + [0] * rng.randint(0, 6)
        if rng.random() < 0.3:
            rng.shuffle(mixed)
        yield mixed


def stage_24_tiles() -> list[Tile]:
    """Each head dim's tile, from stage 24's kernel.cu (in the lineage, or while it waits)."""
    sys.path.insert(0, str(ROOT / "kernels"))
    from hopattn import lineage

    found = sorted((ROOT / "kernels" / "attention").glob("24_*")) or sorted((ROOT / "research" / "stage24").glob("24_*"))
    stage = lineage.load_stage(found[0])
    out = []
    for d in stage.tile_head_dims():
        c = stage.constants(d)
        out.append(Tile(d, c["CONSUMERS"], c["Q_STAGES"], c["KV_STAGES"], c["O_BUFFERS"] == 0))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unfixed", action="store_true",
                        help="leave out the fix: the held-back V not issued before load_q with one Q buffer")
    parser.add_argument("--count", type=int, default=1000, help="random tile sequences per tile and order")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for t in stage_24_tiles():
        for ring in (False, True):
            total = hung = 0
            first = None
            for tiles in sequences(args.count, args.seed):
                if not ring and 0 in tiles:
                    continue  # without a mask every tile has work
                total += 1
                stuck = run(t, tiles, ring, not args.unfixed)
                if stuck:
                    hung += 1
                    first = first or (tiles, stuck)
            order = "tile-id ring" if ring else "computed order"
            print(f"head dim {t.head_dim} ({t.consumers} consumers, {t.q_stages} Q, {t.kv_stages} K/V buffers"
                  f"{', O in the Q buffer' if t.o_in_q else ''}), {order}: {hung} of {total} sequences deadlock"
                  + (f"; first: K/V tiles {first[0]} -> {first[1]}" if first else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
