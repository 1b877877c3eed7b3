"""Concepts of the whole-kernel stages: persistent tile scheduling, the TMA-store epilogue, cluster
multicast, the causal block map and longest-first scheduling. Example sizes are stated in the
pictures; block sizes come from the stage."""

from __future__ import annotations

from .. import facts
from ..svg import fmt_bytes
from .common import box, canvas, done

SM_EXAMPLE = 8  # SMs drawn (the H200 has 132); enough to show the pattern at page width


def persistent_tiles(stage, stages):
    tiles = 20
    c = canvas("persistent-tiles", 280, "Persistent kernel: tiles assigned to SMs by a static scheduler",
               f"Grid = number of SMs. With {SM_EXAMPLE} SMs (132 on the H200) and {tiles} output tiles, SM i "
               f"processes tiles i, i + {SM_EXAMPLE}, i + {2 * SM_EXAMPLE}, …; its CTA stays resident.")
    cols = ("q", "k", "v", "s", "o", "p", "warp", "accent")
    for sm in range(SM_EXAMPLE):
        y = 50 + sm * 26
        c.text(12, y + 16, f"SM {sm}", size=11)
        for j, tile in enumerate(range(sm, tiles, SM_EXAMPLE)):
            box(c, 70 + j * 130, y, 122, 22, f"tile {tile}", fill=cols[sm], stroke=cols[sm], opacity=0.3, size=10.5)
    c.text(470, 80, "tile = blockIdx.x + k · gridDim.x", size=12, mono=True)
    c.lines(470, 110, ["no launch gap between tiles;", "the epilogue of one tile can overlap",
                       "the loads of the next;", "setup (tensor maps, barriers) once per SM"], size=11.5, leading=1.5)
    return done(c, stage, "A static round-robin scheduler; tiles of equal cost keep all SMs equally busy.")


def tma_store(stage, stages):
    t = facts.Tiles.of(stage)
    c = canvas("tma-store", 250, "TMA-store epilogue",
               "O leaves the accumulators through shared memory: rescale and convert to bf16, stmatrix into "
               "a swizzled buffer, fence, one thread issues a TMA store; the warps go on to the next tile.")
    steps = [("O accumulators", "fp32 registers", "o"), ("× 1/l, cvt bf16", "registers", "o"),
             ("stmatrix", f"smem O · {fmt_bytes(t.o)}", "o"), ("TMA store", "async, bulk", "o"),
             ("global O", f"{stage.block_m}×{stage.head_dim}", "o")]
    for i, (a, b, col) in enumerate(steps):
        box(c, 20 + i * 166, 60, 150, 50, a, fill=col, stroke=col, opacity=0.12 + 0.08 * i, sub=b)
        if i:
            c.line(20 + i * 166 - 14, 85, 20 + i * 166 - 2, 85, stroke=col, arrow=True)
    c.lines(20, 150, ["fence.proxy.async.shared::cta between the generic-proxy stores and the TMA (async proxy) read;",
                      "cp.async.bulk.wait_group.read before the O buffer is written again;",
                      "meanwhile the producer already loads the next tile's K/V."], size=11.5, leading=1.5)
    return done(c, stage, "The store is asynchronous: the epilogue no longer stalls the next tile's main loop.")


def cluster_multicast(stage, stages):
    n = max(2, facts.cluster(stage))
    t = facts.Tiles.of(stage)
    c = canvas("cluster-multicast", 280, f"Cluster of {n} CTAs multicasting K/V",
               f"Two CTAs of one cluster work on different query tiles of the same head and need the same K/V "
               f"tile; each loads 1/{n} of it with TMA .multicast::cluster and both receive the whole tile.")
    box(c, 330, 50, 200, 44, "L2: K tile", fill="k", stroke="k", opacity=0.25, sub=fmt_bytes(t.k))
    for i in range(n):
        x = 60 + i * (760 // n)
        box(c, x, 170, 300, 50, f"CTA {i} shared memory", fill="q", stroke="q", opacity=0.2,
            sub=f"receives all {fmt_bytes(t.k)}")
        c.line(430, 96, x + 150, 168, stroke="k", sw=1.8, arrow=True)
        c.text((430 + x + 150) / 2 + (-14 if i == 0 else 14), 128, f"issues 1/{n}: {fmt_bytes(t.k // n)}",
               size=10.5, fill="muted", anchor="end" if i == 0 else "start")
    c.text(20, 250, f"L2 reads per CTA and tile: {fmt_bytes(t.k // n)} instead of {fmt_bytes(t.k)}; "
                    f"KV tile {stage.block_n}×{stage.head_dim}.", size=11.5)
    return done(c, stage, "Multicast turns two L2 reads of the same tile into one, halving L2 traffic per CTA.")


def causal_blocks(bm: int, bn: int, length: int):
    """(state per (i, j)) for a causal mask: 'skip' above the diagonal, 'mask' crossing it, 'full' below."""
    out = {}
    for i in range(length // bm):
        r0, r1 = i * bm, (i + 1) * bm - 1
        for j in range((length + bn - 1) // bn):
            c0, c1 = j * bn, min((j + 1) * bn, length) - 1
            out[(i, j)] = "skip" if c0 > r1 else ("full" if c1 <= r0 else "mask")
    return out


def causal_map(stage, stages):
    bm, bn = stage.block_m, stage.block_n
    length = bm * 8
    blocks = causal_blocks(bm, bn, length)
    ni, nj = length // bm, (length + bn - 1) // bn
    cell = min(40, 520 // max(ni, nj))
    c = canvas("causal-block-map", 120 + ni * cell, "The causal block map: skipped, masked, full",
               f"For sequence length {length}, query blocks of {bm} rows against key blocks of {bn}: blocks "
               "entirely above the diagonal are skipped, blocks crossing it are computed with a mask, the "
               "rest are computed without one.")
    x0, y0 = 60, 60
    colour = {"skip": "skip", "mask": "mask", "full": "ok"}
    for (i, j), s in blocks.items():
        w = cell * (min((j + 1) * bn, length) - j * bn) / bn
        c.rect(x0 + j * cell, y0 + i * cell, w, cell, fill=colour[s], stroke="bg", opacity=0.7, rx=0)
    c.line(x0, y0, x0 + length / bn * cell, y0 + ni * cell, stroke="bar", sw=1.5, dash="5 3")
    c.text(x0, y0 - 10, f"key blocks of {bn} →", size=11, fill="muted")
    c.text(x0 - 8, y0 + 14, "query", size=10, anchor="end", fill="muted")
    c.text(x0 - 8, y0 + 27, "blocks", size=10, anchor="end", fill="muted")
    c.text(x0 - 8, y0 + 40, f"of {bm} ↓", size=10, anchor="end", fill="muted")
    counts = {k: sum(1 for v in blocks.values() if v == k) for k in ("full", "mask", "skip")}
    tx = x0 + nj * cell + 40
    c.legend(tx, y0 + 12, [("ok", f"full: {counts['full']}")], size=12)
    c.legend(tx, y0 + 34, [("mask", f"masked (diagonal): {counts['mask']}")], size=12)
    c.legend(tx, y0 + 56, [("skip", f"skipped: {counts['skip']}")], size=12)
    c.lines(tx, y0 + 92, [f"L = {length}, block_m = {bm}, block_n = {bn}",
                          f"computed: {counts['full'] + counts['mask']} of {len(blocks)} blocks",
                          "masks cost work only on the diagonal"], size=11.5, leading=1.5)
    return done(c, stage, "Block classification from block_m and block_n of the stage (example length 8 · block_m).")


def lpt(costs, machines):
    """List-schedule jobs in the given order onto the least-loaded machine; returns [(m, start, end, job)]."""
    load = [0] * machines
    out = []
    for job, cost in costs:
        m = min(range(machines), key=lambda k: (load[k], k))
        out.append((m, load[m], load[m] + cost, job))
        load[m] += cost
    return out


def longest_first(stage, stages):
    n, sms = 8, 3
    costs = [(i, i + 1) for i in range(n)]  # causal: query tile i visits i + 1 key tiles
    plans = (("in order", lpt(costs, sms)),
             ("longest first", lpt(sorted(costs, key=lambda x: -x[1]), sms)))
    unit = 24
    c = canvas("longest-first", 110 + 2 * (sms * 24 + 40), "Longest-first scheduling of causal tiles",
               f"{n} causal query tiles (tile i costs i + 1 KV iterations) on {sms} SMs: in launch order the "
               "longest tiles start last and one SM finishes late; longest-first keeps the finish times even.")
    y = 50
    for label, plan in plans:
        span = max(e for _, _, e, _ in plan)
        c.text(12, y + 12, f"{label}: finishes at {span}", size=12, weight="600")
        y += 20
        for m in range(sms):
            c.text(12, y + 16, f"SM {m}", size=11)
            for mm, s, e, job in plan:
                if mm == m:
                    box(c, 70 + s * unit, y, (e - s) * unit - 2, 20, f"q{job}", fill="q", stroke="q",
                        opacity=0.15 + 0.08 * job, size=10)
            y += 24
        y += 20
    c.text(500, 80, "dynamic: an atomic counter hands out the next tile", size=11.5)
    c.text(500, 100, "L2-aware: tiles of one head run close in time", size=11.5)
    return done(c, stage, "Greedy list scheduling of the example costs, computed, not drawn by hand.")
