"""CPU check of the K/V protocol of `research/variants/18_cluster.cu` (written by research/variants/make_cluster.py) (no GPU): two CTAs of a
cluster that multicast K and V to each other.

Transcribed from the kernel, per CTA r of the pair (both walk the same K/V tiles):

    producer:  per K/V tile g (counting on across output tiles): K(g), then V(g - 1) (one behind)
               load(ring, g): if g >= 2: wait empty[g % 2] (parity bit, then flip)
                              arrive.expect_tx(full[g % 2], whole tile)
                              multicast box r of tile g into buffer g % 2 of both CTAs; each
                              copy completes tx (half a tile) on that CTA's full[g % 2]
               after the last tile: V(last); then the tail: wait every buffer's next empty phase
    consumer:  (two per CTA; each stands for its four warps' arrivals)
               t = 0: wait k_full, QK(g) reads K, retired: release K
               t > 0: retire PV(g - 2): release V; wait k_full(g), v_full(g - 1);
                      QK(g) and PV(g - 1) read; QK retired: release K
               end:   retire PV; wait v_full(last); PV(last) reads; retired: release V
               release(ring, g) = 4 arrivals on its own CTA's empty[g % 2] and 4 on the partner's
    mbarrier:  phase bit, pending arrivals (reset to the init count when a phase completes), tx
               count (a phase completes when both are 0; tx may go negative first)

Checked over many random interleavings: no deadlock; a consumer reads a buffer only when both
halves of the tile it expects have landed in its own CTA; no copy lands in a buffer that a consumer
of that CTA is still reading; no copy and no remote arrival reaches a CTA that has exited. Planted
bugs must be caught: no tail, empty barriers counting only their own CTA's consumers, releases
not sent to the partner.

    python3 emulate_cluster.py
"""
import random

TILE, HALF, STAGES, CONSUMERS, WARPS = 2, 1, 2, 2, 4  # bytes in halves: a tile is 2 halves


class Violation(Exception):
    pass


class Barrier:
    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase ^= 1
            self.pending = self.count

    def arrive(self, tx=0):
        if self.pending == 0:  # hardware would count it toward the next phase: a protocol error
            raise Violation("arrival on a barrier whose phase already has all its arrivals")
        self.tx += tx
        self.pending -= 1
        self._maybe_complete()

    def complete_tx(self, n):
        self.tx -= n
        self._maybe_complete()

    def done(self, parity):  # try_wait.parity: the phase with this parity has completed
        return self.phase != parity


def run(tiles_per_unit, units, seed, bug=None):
    rng = random.Random(seed)
    empty_count = CONSUMERS * WARPS * (1 if bug == "local_count" else 2)
    cta = []
    for _ in range(2):
        cta.append({
            "full": {ring: [Barrier(1) for _ in range(STAGES)] for ring in "KV"},
            "empty": {ring: [Barrier(empty_count) for _ in range(STAGES)] for ring in "KV"},
            "data": {ring: [[None, None] for _ in range(STAGES)] for ring in "KV"},  # version per half
            "reading": {ring: [0] * STAGES for ring in "KV"},
            "exited": False, "alive": 1 + CONSUMERS,
        })
    copies = []  # (target cta, ring, buffer, half, version)
    total = tiles_per_unit * units

    def release(r, ring, g):
        for target in (r, 1 - r):
            if target != r and bug == "no_remote":
                continue
            if cta[target]["exited"]:
                raise Violation(f"remote arrival to exited CTA {target}")
            for _ in range(WARPS):
                cta[target]["empty"][ring][g % STAGES].arrive()

    def producer(r):
        phase = {"K": 0, "V": 0}

        def load(ring, g):
            b = g % STAGES
            if g >= STAGES:
                while not cta[r]["empty"][ring][b].done((phase[ring] >> b) & 1):
                    yield
                phase[ring] ^= 1 << b
            cta[r]["full"][ring][b].arrive(tx=TILE)
            for target in (0, 1):
                copies.append((target, ring, b, r, g))
        for g in range(total):
            yield from load("K", g)
            if g > 0:
                yield from load("V", g - 1)
        yield from load("V", total - 1)
        if bug != "no_tail":
            for b in range(min(total, STAGES)):
                for ring in "KV":
                    while not cta[r]["empty"][ring][b].done((phase[ring] >> b) & 1):
                        yield

    def consumer(r):
        parity = {"K": 0, "V": 0}

        def wait_full(ring, g):
            b = g % STAGES
            while not cta[r]["full"][ring][b].done((parity[ring] >> b) & 1):
                yield
            parity[ring] ^= 1 << b
            if cta[r]["data"][ring][b] != [g, g]:
                raise Violation(f"CTA {r} reads {ring}({g}) but buffer {b} holds {cta[r]['data'][ring][b]}")

        def read(ring, g, on):
            cta[r]["reading"][ring][g % STAGES] += 1 if on else -1
        for g in range(total):
            t = g % tiles_per_unit
            if t > 0 and g >= 2 and (g - 2) // tiles_per_unit == g // tiles_per_unit:
                read("V", g - 2, False)
                release(r, "V", g - 2)
            yield from wait_full("K", g)
            if t > 0:
                yield from wait_full("V", g - 1)
                read("V", g - 1, True)
            read("K", g, True)
            yield  # the wgmmas run
            read("K", g, False)
            release(r, "K", g)
            yield  # the softmax
            if t == tiles_per_unit - 1:  # the tile's last PVs: retire PV(g - 1), then PV(g) alone
                if t > 0:
                    read("V", g - 1, False)
                    release(r, "V", g - 1)
                yield from wait_full("V", g)
                read("V", g, True)
                yield
                read("V", g, False)
                release(r, "V", g)

    actors = []
    for r in range(2):
        actors.append((r, producer(r)))
        for _ in range(CONSUMERS):
            actors.append((r, consumer(r)))
    live = list(actors)
    while live or copies:
        choices = [("actor", a) for a in live] + [("copy", i) for i in range(len(copies))]
        kind, what = rng.choice(choices)
        if kind == "copy":
            target, ring, b, half, g = copies.pop(what)
            c = cta[target]
            if c["exited"]:
                raise Violation(f"copy into exited CTA {target}")
            if c["reading"][ring][b]:
                raise Violation(f"copy of {ring}({g}) lands in CTA {target}'s buffer {b} while it is read")
            c["data"][ring][b][half] = g
            c["full"][ring][b].complete_tx(HALF)
            continue
        r, gen = what
        try:
            next(gen)
        except StopIteration:
            live.remove(what)
            cta[r]["alive"] -= 1
            if cta[r]["alive"] == 0:
                cta[r]["exited"] = True
            continue
        run.steps = getattr(run, "steps", 0) + 1
        if run.steps > 200000:
            raise Violation("deadlock (no progress)")
    return True


def check(bug=None, trials=300):
    caught = 0
    for seed in range(trials):
        run.steps = 0
        shape = [(1, 1), (1, 3), (2, 2), (3, 2), (5, 3)][seed % 5]
        try:
            run(*shape, seed, bug)
        except Violation as v:
            if bug is None:
                raise AssertionError(f"seed {seed}, shape {shape}: {v}") from v
            caught += 1
    return caught


if __name__ == "__main__":
    check()
    print("protocol: 300 random interleavings, no violation")
    for bug in ("no_tail", "local_count", "no_remote"):
        caught = check(bug)
        print(f"planted bug {bug!r}: caught in {caught} of 300 runs")
        assert caught > 0, bug
