"""CPU checks of stage 13 (intra-warpgroup overlap; no GPU), on emulate_12.py's model.

The consumer loop is now a software pipeline: one pingpong turn per iteration issues QK of tile t
and PV of tile t - 1 (two wgmma groups); wait_group 1 retires the QK, the softmax of t runs while
the PV is in flight, and wait_group 0 (at the top of the next iteration) retires the PV and frees
tile t - 1's buffer. A tile is therefore read from its QK in one iteration to its PV's retirement
in the next: the model's warps hold up to three buffers at once (t - 2 until the top of the
iteration, t - 1 and t). Each consumer takes n + 1 turns (QK of tile 0 alone, n - 1 turns of
QK + PV, the last PV alone); consumer 1 makes the initial arrival and skips the arrival after its
last turn, as in stage 12.

Checked with emulate_12's machinery (named barriers counted a warp at a time, mbarriers with
phases and transaction bytes, eight consumer warps as separate actors, copies landing at random
moments): every phase of each pingpong barrier is 4 syncs of its owner + 4 arrivals of the other,
turns are issued in the pingpong order, no half phase is left, no warp reads a tile that is not
(fully) in its buffer, no copy lands in a buffer a warp still reads, no deadlock — over random
schedules of 1-16 tiles and rings of 2, 3 and 4 (the kernel's). The same deliberate bugs must be
caught, plus two of this stage: freeing tile t - 1's buffer after the QK's wait_group 1 (the PV
still reads V) and issuing PV of t - 1 from a buffer already freed one iteration earlier.

First, the arithmetic in the kernel's new order (pipeline_math): the softmax of tile t records O's
correction while PV of t - 1 runs on the unrescaled O, and the rescale is applied after that PV
retires; compared with a float64 reference on shapes that force the rescale mid-loop, and the
wrong order (O rescaled while the PV is in flight) must fail.

    python3 emulate_13.py
"""
import numpy as np

import emulate_09 as e9
import emulate_12 as e12

BLOCK_N, HEAD_DIM, RESCALE_THRESHOLD = 64, 128, 8.0


def pipeline_math(q, k, v, scale, rescale_at_issue=False):
    """The consumer loop's arithmetic in the kernel's order, on whole rows (the fragment layouts are
    stage 09/10's, checked there): softmax of tile t with PV of t - 1 in flight (O untouched, the
    correction recorded), O rescaled and P rounded after that PV retires, PV of t - 1 accumulating
    onto the O it saw at issue. The any-row test is per warp (16 rows), as __any_sync."""
    rows = q.shape[0]
    n = k.shape[0] // BLOCK_N
    sl = np.float32(scale * 1.4426950408889634)
    o = np.zeros((rows, HEAD_DIM), np.float32)
    row_max = np.full(rows, -np.inf, np.float32)
    row_sum = np.zeros(rows, np.float32)
    state = {}

    def qk(t):
        return (q.astype(np.float32) @ k[t * BLOCK_N:(t + 1) * BLOCK_N].astype(np.float32).T).astype(np.float32)

    def softmax(sc):
        nonlocal row_max, row_sum
        tile_max = sc.max(1)
        grew = (tile_max - row_max) * sl > RESCALE_THRESHOLD
        warp_any = grew.reshape(-1, 16).any(1).repeat(16)
        new_max = np.where(warp_any, np.maximum(row_max, tile_max), row_max)
        corr = np.where(warp_any, np.exp2((row_max - new_max) * sl), np.float32(1)).astype(np.float32)
        row_max = new_max
        row_sum = row_sum * corr
        e = np.exp2(sc * sl - (row_max * sl)[:, None]).astype(np.float32)
        row_sum = row_sum + e.sum(1)
        state.update(exps=e, corr=corr, rescale=warp_any)

    def rescale_and_pack():
        nonlocal o
        o = np.where(state["rescale"][:, None], o * state["corr"][:, None], o).astype(np.float32)
        state["p"] = e9.bf16(state["exps"])

    def pv(t, o_in):
        return (o_in + state["p_issued"] @ v[t * BLOCK_N:(t + 1) * BLOCK_N].astype(np.float32)).astype(np.float32)

    softmax(qk(0))                          # prologue: turn { QK(0) }, wait 0, softmax(0)
    pending = None
    for t in range(1, n):
        if pending is not None:
            o = pending                     # retire_pv(t - 2)
        rescale_and_pack()                  # P(t - 1), O rescaled for it
        s_t = qk(t)                         # turn { QK(t) ; PV(t - 1) }
        state["p_issued"] = state["p"]
        if rescale_at_issue:                # BUG: the softmax rescales O while PV(t - 1) is in flight
            softmax(s_t)
            o = np.where(state["rescale"][:, None], o * state["corr"][:, None], o).astype(np.float32)
            state["rescale"] = np.zeros_like(state["rescale"])
        pending = pv(t - 1, o)              # PV(t - 1) reads O as it is now, P(t - 1), V(t - 1)
        if not rescale_at_issue:
            softmax(s_t)                    # wait 1; softmax(t) while the PV runs (O untouched)
    if pending is not None:
        o = pending                         # retire_pv(n - 2)
    rescale_and_pack()
    state["p_issued"] = state["p"]
    o = pv(n - 1, o)                        # turn { PV(n - 1) }, retire_pv(n - 1)
    return o / row_sum[:, None]


def check_pipeline_math(**bug):
    worst = 0.0
    for seed, len_k, amp in ((0, 64, 1), (1, 128, 4), (2, 640, 4), (3, 1024, 8), (4, 448, 12)):
        rng = np.random.default_rng(seed)
        q = e9.bf16(rng.standard_normal((64, HEAD_DIM)) * amp)
        k = e9.bf16(rng.standard_normal((len_k, HEAD_DIM)))
        # a late tile with much larger scores forces the rescale path in the middle of the loop
        k[len_k // 2:] *= np.float32(2)
        v = e9.bf16(rng.standard_normal((len_k, HEAD_DIM)))
        scale = 1 / np.sqrt(HEAD_DIM)
        out = pipeline_math(q, k, v, scale, **bug)
        s = (q.astype(np.float64) @ k.astype(np.float64).T) * scale
        p = np.exp(s - s.max(1, keepdims=True))
        ref = (p / p.sum(1, keepdims=True)) @ v.astype(np.float64)
        err = np.abs(out - ref).max()
        worst = max(worst, err)
        if not bug:
            assert err < 2e-2, (seed, len_k, err)
    return worst


def program_13(c, num_tiles, last_arrive_skipped=True, initial_by=(1,), arrive_before_issue=False,
               swap_ids=False, release_after_qk=False):
    mine = e12.PINGPONG_BAR + (1 - c if swap_ids else c)
    other = e12.PINGPONG_BAR + (c if swap_ids else 1 - c)
    steps = []
    if num_tiles == 0:
        return steps
    if c in initial_by:
        steps.append(("arrive", other))
    slot = 0

    def turn(reads, last):
        nonlocal slot
        steps.append(("sync", mine))
        skip = last and c == 1 and last_arrive_skipped
        if arrive_before_issue and not skip:
            steps.append(("arrive", other))
        steps.append(("issue", slot, reads))
        if not arrive_before_issue and not skip:
            steps.append(("arrive", other))
        slot += 1

    def retire_pv(tile):  # wait_group 0 retires PV of `tile`; then lane 0 frees its buffer
        steps.append(("compute",))
        if tile >= 0:
            steps.append(("end_reads", tile))
            if not release_after_qk:
                steps.append(("release", tile))

    # tile 0: QK alone, softmax
    steps.append(("wait_full", 0))
    turn((0,), last=False)
    steps.append(("compute",))
    for tile in range(1, num_tiles):
        retire_pv(tile - 2)
        steps.append(("compute",))  # rescale O, pack P of tile - 1
        steps.append(("wait_full", tile))
        turn((tile, tile - 1), last=False)
        steps.append(("compute",))  # wait_group 1: QK of tile retired
        if release_after_qk:
            steps.append(("release", tile - 1))  # BUG: PV of tile - 1 still reads V
        steps.append(("compute",))  # softmax of tile, PV of tile - 1 in flight
    retire_pv(num_tiles - 2)
    steps.append(("compute",))
    turn((num_tiles - 1,), last=True)
    if release_after_qk:
        steps.append(("release", num_tiles - 1))  # BUG: before the last PV has retired
    retire_pv(num_tiles - 1)
    return steps


def program_13_early_free(c, num_tiles, **kw):
    """BUG: each buffer freed one iteration early (right after its QK retires, before its PV)."""
    steps = []
    for step in program_13(c, num_tiles, **kw):
        if step[0] == "release":
            continue
        steps.append(step)
        if step[0] == "issue" and step[1] < num_tiles:
            # the turn issued QK of tile `slot` (reads[0]): free its buffer one iteration early,
            # as if the ring were stage 12's (freed after QK and PV of the same iteration)
            steps.append(("compute",))
            steps.append(("release", step[2][0]))
    return steps


BUGS = dict(e12.BUGS)
BUGS["free tile t - 1's buffer after the QK's wait_group 1 (its PV still reads V)"] = dict(release_after_qk=True)


def check_early_free():
    caught = 0
    for seed in range(200):
        try:
            e12.simulate(program_13_early_free, 6, seed)
        except (e12.ProtocolError, e12.e11.RaceError, AssertionError, KeyError):
            caught += 1
    assert caught > 0, "the model missed a deliberate bug: buffers freed before their PV"
    print(f"  deliberate bug caught in {caught}/200 schedules: each buffer freed before its PV is issued")


if __name__ == "__main__":
    print(f"pipeline arithmetic vs float64: max abs error {check_pipeline_math():.2e}")
    wrong = check_pipeline_math(rescale_at_issue=True)
    assert wrong > 0.1, wrong
    print(f"  deliberate bug caught (error {wrong:.2f}): O rescaled while the PV of the previous tile is in flight")
    n = 0
    for stages in (2, 3, 4):
        for num_tiles in (1, 2, 3, 4, 5, 7, 10, 16):
            for seed in range(60):
                e12.simulate(program_13, num_tiles, seed * 1000 + num_tiles, stages=stages)
                n += 1
    for name, kw in BUGS.items():
        caught = 0
        for seed in range(200):
            try:
                e12.simulate(program_13, 6, seed, stages=4, **kw)
            except (e12.ProtocolError, e12.e11.RaceError, AssertionError):
                caught += 1
        assert caught > 0, f"the model missed a deliberate bug: {name}"
        print(f"  deliberate bug caught in {caught}/200 schedules: {name}")
    check_early_free()
    print(f"stage 13: {n} random schedules: pingpong order kept, every barrier phase = 4 syncs + 4 arrivals, "
          f"no race, no deadlock")
    print("ok")
