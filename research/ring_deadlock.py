"""The producer/consumer protocol of stages 18 and 19 on one CTA, emulated on the CPU.

Stage 18 hands tile ids from the producer to the consumers through a two-slot ring (sched_full /
sched_empty), beside the Q ring (two buffers) and the K and V rings (two buffers each). This script
runs both roles as coroutines over a sequence of output tiles (each with its number of K/V tiles,
0 for a tile whose rows see no key) and reports whether every tile completes or both roles end up
waiting on each other.

It reproduces the deadlock found on the H200 (causal, len_q > len_k, many tiles): the producer
issued the V of a tile's last K/V step only after the first K of the next tile *with work*, and on
the way there it had to publish the ids of the empty tiles in between; with two or more of them,
the ring was full of ids the consumers had not read, because the consumers were still waiting for
that V. Issuing the V it holds back before each wait on the ring (`--fixed`, the stages' code now)
breaks the cycle: every wait of the producer is then for a step of the consumers whose inputs have
all been issued. (Launches without a mask have no ring: both roles compute the tile ids, and the V
stays one step behind K across tiles, as before.)

    python research/ring_deadlock.py            # the old order: finds deadlocks
    python research/ring_deadlock.py --fixed    # today's order: none in any of the sequences

Stage 18's and 19's notes ("The deadlock, and why the fix holds") rely on it; tests/test_research_scripts.py runs both.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterator

SCHED_STAGES = 2
Q_STAGES = 2
KV_STAGES = 2


class Ring:
    """A ring of `stages` buffers: `full` counts loads the consumer may take, `free` buffers the
    producer may fill. In-order use on both sides, so two counters are the whole state."""

    def __init__(self, stages: int):
        self.free = stages
        self.full = 0
        self.moves = 0  # how often either counter changed: progress, even when the counts come back


def producer(tiles: list[int], rings: dict[str, Ring], fixed: bool) -> Iterator[str]:
    """Yields the name of what it waits for whenever it must wait; returns when done."""

    def acquire(name: str) -> Iterator[str]:
        while rings[name].free == 0:
            yield f"producer: {name} free"
        rings[name].free -= 1
        rings[name].moves += 1

    def publish(name: str) -> None:
        rings[name].full += 1
        rings[name].moves += 1

    pending_v = False  # a V issued one step behind its K
    for tile in tiles + [-1]:
        if fixed and pending_v:  # the V held back, before the wait on the ring
            yield from acquire("v")
            publish("v")
            pending_v = False
        yield from acquire("sched")
        publish("sched")
        if tile < 0:
            break
        if tile == 0:
            continue  # no row sees a key: nothing to load
        yield from acquire("q")
        publish("q")
        for _ in range(tile):
            yield from acquire("k")
            publish("k")
            if pending_v:
                yield from acquire("v")
                publish("v")
            pending_v = True
    if pending_v:
        yield from acquire("v")
        publish("v")


def consumers(tiles: list[int], rings: dict[str, Ring]) -> Iterator[str]:
    """Both consumer warpgroups as one: they walk the same tiles, one turn each per step."""

    def take(name: str) -> Iterator[str]:
        while rings[name].full == 0:
            yield f"consumers: {name} full"
        rings[name].full -= 1
        rings[name].moves += 1

    def release(name: str) -> None:
        rings[name].free += 1
        rings[name].moves += 1

    while True:
        yield from take("sched")
        n = tiles[0] if tiles else -1
        tiles = tiles[1:]
        release("sched")  # every consumer thread arrives on sched_empty right after reading
        if n < 0:
            return
        if n == 0:
            continue  # zeros stored; no turn
        yield from take("q")
        yield from take("k")  # tile 0: QK alone
        release("k")  # K free once QK has retired (mid iteration)
        for t in range(1, n):
            if t >= 2:
                release("v")  # top of iteration t: PV of t - 2 retires
            yield from take("k")
            yield from take("v")  # V of t - 1 for this turn's PV
            release("k")
        if n >= 2:
            release("v")  # PV of n - 2
        yield from take("v")  # V of n - 1: the last PV, alone
        release("v")
        release("q")  # every wgmma of the tile has retired


def run(tiles: list[int], fixed: bool) -> str | None:
    """None if both roles finish; otherwise what each was waiting for when neither could move."""
    rings = {"sched": Ring(SCHED_STAGES), "q": Ring(Q_STAGES), "k": Ring(KV_STAGES), "v": Ring(KV_STAGES)}
    roles = {"producer": producer(tiles, rings, fixed), "consumers": consumers(list(tiles), rings)}
    waiting: dict[str, str] = {}
    while roles:
        before = sum(r.moves for r in rings.values())
        finished = False
        for name in list(roles):  # each role runs until it must wait (or is done)
            try:
                waiting[name] = next(roles[name])
            except StopIteration:
                del roles[name]
                waiting.pop(name, None)
                finished = True
        if not finished and sum(r.moves for r in rings.values()) == before:  # a whole round in which nothing moved: a cycle
            return "; ".join(waiting.values())
    return None


def sequences(count: int, seed: int) -> Iterator[list[int]]:
    """Tile sequences one CTA can draw: K/V counts with empty tiles mixed in, runs of them at the end
    (longest-first causal with len_q > len_k), all empty, exactly one with work."""
    yield [0]
    yield [0, 0, 0]
    yield [1]
    yield [0, 0, 3, 0, 0]
    yield [2, 0, 0]
    yield [5, 4, 0, 0, 0, 0]
    rng = random.Random(seed)
    for _ in range(count):
        work = [rng.randint(1, 6) for _ in range(rng.randint(0, 6))]
        empty = [0] * rng.randint(0, 6)
        mixed = work + empty
        if rng.random() < 0.3:
            rng.shuffle(mixed)
        yield mixed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="today's order: each tile's last V before leaving it")
    parser.add_argument("--count", type=int, default=2000, help="random tile sequences to try")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    hung = 0
    first = None
    for tiles in sequences(args.count, args.seed):
        stuck = run(tiles, args.fixed)
        if stuck:
            hung += 1
            first = first or (tiles, stuck)
    order = "fixed order" if args.fixed else "old order"
    print(f"{order}: {hung} of {args.count + 6} tile sequences deadlock")
    if first:
        print(f"first: K/V tiles per output tile {first[0]} -> {first[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
