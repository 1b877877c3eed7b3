"""Concepts of the whole-kernel stages: persistent tile scheduling, the TMA-store epilogue, the K/V
tile shape, the causal block map and longest-first scheduling. Example sizes are stated in the
pictures; block sizes come from the stage."""

from __future__ import annotations

import math

from .. import facts
from ..svg import fmt_bytes, num, text_width
from .common import box, canvas, done
from .sass_counts import TILE_BOUNDARY

SM_EXAMPLE = 8  # SMs drawn (the H200 has 132); enough to show the pattern at page width


def persistent_tiles(stage, stages):
    tiles = 20
    c = canvas("persistent-tiles", 280, "Persistent kernel: tiles assigned to SMs by a static scheduler",
               f"Grid = number of SMs. With {SM_EXAMPLE} SMs (132 on the H200) and {tiles} output tiles, SM i "
               f"processes tiles i, i + {SM_EXAMPLE}, i + {2 * SM_EXAMPLE}, …; its CTA stays resident.")
    for sm in range(SM_EXAMPLE):
        y = 50 + sm * 26
        c.text(12, y + 16, f"SM {sm}", size=12)
        for j, tile in enumerate(range(sm, tiles, SM_EXAMPLE)):
            box(c, 70 + j * 130, y, 122, 22, f"tile {tile}", fill="q", stroke="q", opacity=0.15 + 0.12 * j, size=12)
    c.text(470, 80, "tile = blockIdx.x + k · gridDim.x", size=12, mono=True)
    c.lines(470, 110, ["no launch gap between tiles;", "the epilogue of one tile can overlap",
                       "the loads of the next;", "setup (tensor maps, barriers) once per SM"], size=12, leading=1.5)
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
                      "meanwhile the producer already loads the next tile's K/V."], size=12, leading=1.5)
    return done(c, stage, "The store is asynchronous: the epilogue no longer stalls the next tile's main loop.")


SMEM_BYTES_PER_CLK = 128  # an SM's shared memory: 32 banks x 4 bytes per clock
WGMMA_FLOP_PER_CLK = 4096  # dense bf16 wgmma per SM: 2,048 multiply-adds per clock
WGMMA_M, WGMMA_K = 64, 16  # one wgmma k-step on bf16: m64nNk16


def wgmma_smem_bytes_per_clk(n: int, a_in_smem: bool = True) -> float:
    """Shared-memory bytes one wgmma m64nNk16 (bf16) reads per tensor-core clock.

    SS reads A (64 x 16) and B (N x 16); RS reads B alone. The k-step takes 2 * 64 * N * 16 FLOP at
    WGMMA_FLOP_PER_CLK, i.e. N / 2 clocks."""
    a = WGMMA_M * WGMMA_K * facts.ELEM if a_in_smem else 0
    b = n * WGMMA_K * facts.ELEM
    clocks = 2 * WGMMA_M * n * WGMMA_K / WGMMA_FLOP_PER_CLK
    return (a + b) / clocks


BAR_OPACITY, WORK_OPACITY, FIX_OPACITY = 0.45, 0.22, 0.8


def _swatches(c, x, y, items, size=12, gap=16):
    """Canvas.legend with the fill opacity the swatch stands for."""
    for key, label, opacity in items:
        c.rect(x, y - size + 1, size, size, fill=key, stroke=key, opacity=opacity, rx=2)
        c.text(x + size + 4, y, label, size=size, fill="muted")
        x += size + 4 + text_width(label, size) + gap


def _previous(stage, stages):
    return next((s for s in stages if s.number == stage.number - 1), None)


def tile_shape(stage, stages):
    n_now = stage.block_n
    prev = _previous(stage, stages)
    n_before = prev.block_n if prev is not None and prev.block_n != n_now else None
    widths = sorted({64, 128, 256} | {n for n in (n_now, n_before) if n and n % 8 == 0 and 8 <= n <= 256})
    a_bytes = WGMMA_M * WGMMA_K * facts.ELEM
    ss = [(n, wgmma_smem_bytes_per_clk(n)) for n in widths]
    rs = wgmma_smem_bytes_per_clk(stage.head_dim, a_in_smem=False)
    c = canvas("tile-shape", 440, "Tile shape: a wider K/V tile reads less shared memory per clock",
               "A QKᵀ wgmma m64nNk16 with both operands in shared memory reads 64×16 bf16 of Q and N×16 of K "
               "per k-step, which takes N/2 tensor-core clocks: "
               + ", ".join(f"N = {n}: {num(v)} B/clk" for n, v in ss)
               + f", against the SM's {SMEM_BYTES_PER_CLK} B/clk of shared memory. The PV wgmma takes P from "
               f"registers and reads only V: {num(rs)} B/clk. Per-iteration fixed costs are paid per K/V tile.")

    # Bar chart: stacked Q (A) on K (B) for SS, V alone for RS, under the shared-memory line.
    x0, x1, top, bottom = 70, 530, 74, 254
    vmax = 1.125 * SMEM_BYTES_PER_CLK
    def y(v):
        return bottom - (bottom - top) * v / vmax
    c.text(12, 52, "shared-memory bytes read per tensor-core clock (one SM)", size=12, weight="600")
    for tick in range(0, SMEM_BYTES_PER_CLK + 1, 32):
        c.line(x0, y(tick), x1, y(tick), stroke="grid", sw=0.8)
        c.text(x0 - 6, y(tick) + 4, str(tick), size=12, anchor="end", fill="muted")
    slot = (x1 - x0) / (len(ss) + 1)
    bw = min(56, slot - 24)
    for i, (n, v) in enumerate(ss + [(None, rs)]):
        cx = x0 + slot * (i + 0.5)
        if n is None:
            c.rect(cx - bw / 2, y(rs), bw, bottom - y(rs), fill="v", stroke="v", opacity=BAR_OPACITY, rx=0)
            rows = ["PV · RS", f"m64n{stage.head_dim}k16"]
        else:
            b_part = wgmma_smem_bytes_per_clk(n, a_in_smem=False)  # K's share; Q's is the rest
            c.rect(cx - bw / 2, y(b_part), bw, bottom - y(b_part), fill="k", stroke="k", opacity=BAR_OPACITY, rx=0)
            c.rect(cx - bw / 2, y(v), bw, y(b_part) - y(v), fill="q", stroke="q", opacity=BAR_OPACITY, rx=0)
            rows = [f"N = {n}", f"m64n{n}k16"]
            if n == n_now:
                rows.append("this stage")
            elif n == n_before:
                rows.append(f"stage {prev.number}")
        c.text(cx, y(v) - 6, f"{num(v)} B/clk", size=12, anchor="middle", weight="600")
        c.text(cx, bottom + 16, rows[0], size=12, anchor="middle", weight="600")
        c.text(cx, bottom + 30, rows[1], size=12, anchor="middle", fill="muted", mono=True)
        if len(rows) > 2:
            c.text(cx, bottom + 44, rows[2], size=12, anchor="middle", weight="600" if n == n_now else None,
                   fill="fg" if n == n_now else "muted")
    c.line(x0, bottom, x1, bottom, stroke="stroke")
    c.line(x0, y(SMEM_BYTES_PER_CLK), x1, y(SMEM_BYTES_PER_CLK), stroke="bar", sw=1.6, dash="6 4")
    c.text(x1, y(SMEM_BYTES_PER_CLK) - 6, f"shared memory: {SMEM_BYTES_PER_CLK} B/clk per SM", size=12,
           anchor="end", fill="bar", weight="600")

    # The arithmetic, next to the chart.
    tx = 560
    c.text(tx, 74, "QKᵀ, SS: per k-step of m64nNk16", size=12, weight="600")
    c.lines(tx, 94, [f"A = Q: 64×16 bf16 = {fmt_bytes(a_bytes)}",
                     f"B = K: N×16 bf16 = {WGMMA_K * facts.ELEM}·N bytes",
                     f"2·64·N·16 FLOP at {WGMMA_FLOP_PER_CLK}/clk = N/2 clk",
                     f"B/clk = ({a_bytes} + {WGMMA_K * facts.ELEM}·N) / (N/2)",
                     "\u00a0" * 6 + f"= {2 * a_bytes}/N + {2 * WGMMA_K * facts.ELEM}"], size=12, leading=1.5, mono=True)
    c.text(tx, 190, "PV, RS: P comes from registers,", size=12, weight="600")
    c.text(tx, 208, f"only V is read: {num(rs)} B/clk for any N", size=12)
    _swatches(c, tx, 234, [("q", "Q (A)", BAR_OPACITY), ("k", "K (B)", BAR_OPACITY), ("v", "V (B)", BAR_OPACITY)])
    c.lines(tx, 258, [f"Q's {fmt_bytes(a_bytes)} is read once per k-step whatever N:",
                      f"its share, {2 * a_bytes}/N B/clk, falls as N grows;",
                      f"K's stays at {2 * WGMMA_K * facts.ELEM} B/clk."], size=12, leading=1.4, fill="muted")

    # Fixed costs per K/V tile, over the same keys at both tile widths.
    other = n_before or (64 if n_now != 64 else 128)
    narrow, wide = sorted((other, n_now))
    keys = math.lcm(narrow, wide)
    keys = keys * max(1, 4 * narrow // keys) if keys // narrow <= 8 else 4 * wide  # at least 4 narrow tiles
    yy = 342
    c.text(12, yy - 16, f"Per-iteration fixed costs (barrier waits, named barriers, wait_group, row-max shuffles) "
                        f"are paid once per K/V tile; over {keys} keys:", size=12, weight="600")
    sx0, sx1, fix = 150, 600, 10
    for row, n in enumerate((narrow, wide)):
        ry = yy + row * 30
        tiles = -(-keys // n)
        label = f"N = {n}" + (" (this stage)" if n == n_now else f" (stage {prev.number})" if n == n_before else "")
        c.text(12, ry + 14, label, size=12, weight="600" if n == n_now else None)
        for t in range(tiles):
            tx0 = sx0 + (sx1 - sx0) * t * n / keys
            tx1 = sx0 + (sx1 - sx0) * min((t + 1) * n, keys) / keys
            c.rect(tx0, ry, tx1 - tx0 - 2, 20, fill="tensor", stroke=None, opacity=WORK_OPACITY, rx=0)
            c.rect(tx0, ry, fix, 20, fill="bar", stroke=None, opacity=FIX_OPACITY, rx=0)
        c.text(sx1 + 14, ry + 14, f"{tiles} × fixed costs, 1/{n} per key", size=12)
    _swatches(c, sx0, yy + 76, [("bar", "fixed costs of one iteration", FIX_OPACITY),
                                ("tensor", "work on the tile's keys", WORK_OPACITY)], size=12)
    return done(c, stage, f"Bytes per clock computed from (2 KB + 32·N B) / (N/2 clk) at {WGMMA_FLOP_PER_CLK} "
                          f"FLOP/clk per SM; the fixed costs per key go from 1/{narrow} to 1/{wide} of an iteration's.")


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
    c.text(x0, y0 - 10, f"key blocks of {bn} →", size=12, fill="muted")
    c.text(x0 - 8, y0 + 14, "query", size=12, anchor="end", fill="muted")
    c.text(x0 - 8, y0 + 30, "blocks", size=12, anchor="end", fill="muted")
    c.text(x0 - 8, y0 + 46, f"of {bm} ↓", size=12, anchor="end", fill="muted")
    counts = {k: sum(1 for v in blocks.values() if v == k) for k in ("full", "mask", "skip")}
    tx = x0 + nj * cell + 40
    c.legend(tx, y0 + 12, [("ok", f"full: {counts['full']}")], size=12)
    c.legend(tx, y0 + 34, [("mask", f"masked (diagonal): {counts['mask']}")], size=12)
    c.legend(tx, y0 + 56, [("skip", f"skipped: {counts['skip']}")], size=12)
    c.lines(tx, y0 + 92, [f"L = {length}, block_m = {bm}, block_n = {bn}",
                          f"computed: {counts['full'] + counts['mask']} of {len(blocks)} blocks",
                          "masks cost work only on the diagonal"], size=12, leading=1.5)
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
    plans = (("in launch order", lpt(costs, sms)),
             ("longest first", lpt(sorted(costs, key=lambda x: -x[1]), sms)))
    worst = max(e for _, plan in plans for _, _, e, _ in plan)
    x0 = 70
    unit = (860 - x0 - 30) / worst
    c = canvas("longest-first", 110 + 2 * (sms * 28 + 44) + 80, "Longest-first scheduling of causal tiles",
               f"{n} causal query tiles (tile i costs i + 1 KV iterations) on {sms} persistent CTAs: in launch "
               "order the longest tiles start last and one SM finishes late; longest first, claimed from a "
               "counter at run time, keeps the finish times even.")
    y = 50
    for label, plan in plans:
        span = max(e for _, _, e, _ in plan)
        c.text(12, y + 12, f"{label}: the last SM finishes at {span} iterations", size=12, weight="600")
        y += 22
        for m in range(sms):
            c.text(12, y + 17, f"SM {m}", size=12)
            for mm, s, e, job in plan:
                if mm == m:
                    box(c, x0 + s * unit, y, (e - s) * unit - 2, 24, f"q{job} · {job + 1}", fill="q", stroke="q",
                        opacity=0.15 + 0.08 * job, size=12)
            y += 28
        c.line(x0 + span * unit, y - 3 * 28 - 4, x0 + span * unit, y, stroke="bar", sw=1.5, dash="4 3")
        y += 22
    c.text(12, y + 4, "A box: query tile q and the KV iterations it costs (the diagonal makes later tiles longer).",
           size=12, fill="muted")
    c.text(12, y + 24, "Stage 18: tiles numbered longest first within groups of heads whose K and V fit in L2;",
           size=12, fill="muted")
    c.text(12, y + 42, "the producer claims the next with an atomic counter and hands its id to the consumers.",
           size=12, fill="muted")
    return done(c, stage, "Greedy list scheduling of the example costs, computed, not drawn by hand.")


# One signed 32-bit division with its remainder by a divisor known only at run time (describe_tile's
# `/` and `%` in stage 21), and the same through common/fast_divmod.cuh (stage 22): the arithmetic
# nvcc 13.0 compiles them to for sm_90a, in order. tests/test_fast_divmod.py compiles both and checks
# these against the SASS.
RUNTIME_DIVISION = ("IABS", "I2F.RP", "MUFU.RCP", "IADD3", "F2I.FTZ.U32.TRUNC.NTZ", "IMAD.MOV.U32", "IADD3", "IMAD",
                    "IMAD.HI.U32", "IABS", "LOP3.LUT", "IMAD.HI.U32", "ISETP.GE.AND", "IADD3", "IMAD",
                    "ISETP.GT.U32.AND", "IADD3", "IMAD.IADD", "ISETP.NE.AND", "ISETP.GE.U32.AND", "VIADD", "IADD3",
                    "LOP3.LUT", "IMAD.MOV", "IMAD")
FAST_DIVISION = ("IMAD.WIDE.U32", "SHF.R.U64", "IADD3", "IMAD")


def _chain_text(ops, shown=10) -> str:
    names = [op.split(".")[0] if op.count(".") > 1 else op for op in ops]
    text = " → ".join(names[:shown])
    return text + (f" → … ({len(ops)} in all)" if len(ops) > shown else "")


def tile_coordinates(stage, stages):
    """Stage 22: the chain of divisions from an output tile's id to its coordinates (the causal
    order's: group of heads, place in the group, batch and head, K/V head); the consumers' whole
    stretch from the tile id to the wait for Q as the SASS counts it, before and after the host's
    multipliers (sass_counts.py); and one division as nvcc compiles it alone, with its remainder."""
    steps = (("÷ tiles per group", "group, r"), ("÷ heads in the group", "q-block, pair"),
             ("÷ heads", "batch, head"), ("÷ heads per K/V head", "K/V head"))
    prev_id = f"{stage.number - 1:02d}"
    before, after = TILE_BOUNDARY.get(prev_id, TILE_BOUNDARY["21"]), TILE_BOUNDARY.get(stage.id, TILE_BOUNDARY["22"])
    per_slow, per_fast = len(RUNTIME_DIVISION), len(FAST_DIVISION)
    x0, x1 = 150, 846
    c = canvas("tile-coordinates", 470, "An output tile's coordinates: divisions by numbers the compiler cannot see",
               f"From the tile id to its batch, head, K/V head and first row: {len(steps)} divisions, each needing "
               f"the one before. In stage {stage.number - 1}'s causal kernel the consumers' stretch from the tile id "
               f"to the wait for Q is {before['instructions']} instructions, with {before['rcp']} reciprocals and "
               f"a call to a 64-bit division; this stage divides with a multiplier and a shift that the host "
               f"prepared: {after['instructions']} instructions. One division with its remainder, compiled alone: "
               f"{per_slow} instructions, and {per_fast}.")
    # The chain itself.
    y = 56
    c.text(12, y + 22, "tile id", size=12, weight="600")
    bw = (x1 - x0 - 3 * 14) / len(steps)
    for i, (op, result) in enumerate(steps):
        x = x0 + i * (bw + 14)
        box(c, x, y, bw, 40, op, fill="accent", stroke="accent", opacity=0.15, size=12, sub=f"→ {result}")
        if i:
            c.line(x - 14, y + 20, x - 1, y + 20, stroke="stroke", arrow=True)
    c.line(x0 - 44, y + 20, x0 - 1, y + 20, stroke="stroke", arrow=True)

    # The whole stretch, counted in the SASS: one scale for both stages.
    unit = (x1 - x0) / max(before["instructions"], after["instructions"])

    def stretch(y, label, counts, fill, what):
        n, zero = counts["instructions"], counts["cs2r"]
        c.text(12, y + 16, label, size=12, weight="600")
        c.text(12, y + 32, "causal kernel", size=11, fill="muted")
        rest = n - zero
        box(c, x0, y, rest * unit, 38, f"{rest}: {what}", fill=fill, stroke=fill, opacity=0.22, size=12)
        box(c, x0 + rest * unit, y, zero * unit, 38, f"{zero} CS2R", fill="stroke", stroke="stroke", opacity=0.2,
            size=11)
        return x0 + n * unit

    y = 130
    c.text(x0, y - 8, "A consumer, from the SHFL of the tile id to the SYNCS wait for Q (the SASS, counted):",
           size=12, weight="600")
    calls = ", a CALL" if before["call"] else ""
    end = stretch(y, f"stage {stage.number - 1}", before, "bar",
                  f"the divisions ({before['rcp']} MUFU.RCP{calls}) and the tile's place")
    c.text(end, y + 54, f"{before['instructions']} instructions", size=12, weight="600", anchor="end")
    y = 198
    end = stretch(y, f"stage {stage.number}", after, "ok", "the same, no division")
    c.text(end + 8, y + 24, f"{after['instructions']} instructions", size=12, weight="600", fill="ok")
    c.text(x0, y + 56, "CS2R: zeroing registers, two each (O's accumulators take 32), in both; the rest is what the "
                       "multipliers shortened.", size=11, fill="muted")

    # One division, compiled alone (tests/test_fast_divmod.py checks these against nvcc's SASS).
    y = 292
    c.text(12, y + 14, "one ÷ alone", size=12, weight="600")
    c.text(12, y + 30, "with its remainder", size=11, fill="muted")
    small = (x1 - x0) / (per_slow + 2) / 2

    def ops_row(x, y, ops, fill):
        for k, _op in enumerate(ops):
            c.rect(x + k * small, y, small - 1.5, 16, fill=fill, stroke=fill, opacity=0.22 if k else 0.5, rx=2)
        return x + len(ops) * small

    end = ops_row(x0, y, RUNTIME_DIVISION, "bar")
    c.text(end + 8, y + 13, f"{per_slow}: " + _chain_text(RUNTIME_DIVISION, shown=4), size=11, fill="muted", mono=True)
    end = ops_row(x0, y + 22, FAST_DIVISION, "ok")
    c.text(end + 8, y + 35, f"{per_fast}: " + " → ".join(FAST_DIVISION), size=11, fill="muted", mono=True)
    y = 352
    box(c, x0, y, x1 - x0, 44, "the host, once per launch: for each divisor d, m = ⌈2³¹⁺ˡ / d⌉ and s = 31 + l, "
        "l = ⌈log₂ d⌉", fill="panel", stroke="stroke", size=12,
        sub="exact for every n < 2³¹ (common/fast_divmod.cuh proves it); the group's size is computed there too")
    c.text(12, y + 26, "host", size=12, weight="600")
    c.text(x0, y + 70, "Every output tile pays the stretch at its start, with both consumers at the boundary and the "
                       "tensor cores idle.", size=12, fill="muted")
    return done(c, stage, "The chain is the causal order's (stage 18); without the mask the order is computed and "
                          "the chain is three divisions long. The counts are the SASS's (nvcc 13.0): the stretch in "
                          "each stage's causal kernel, one division in a kernel of its own.")
