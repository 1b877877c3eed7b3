"""Concepts of the sm_80 stages: online softmax, mma.sync fragments, shared tiles, ldmatrix,
the bank map before and after the XOR swizzle, cp.async double buffering, exp2/FFMA softmax
arithmetic."""

from __future__ import annotations

import math

from .. import facts
from ..svg import fmt_bytes, text_width
from .common import box, canvas, done

# One query row's scores over four KV tiles of four keys (an example; the figure computes the rest).
EXAMPLE_SCORES = ((1.0, 2.5, 0.5, 1.5), (0.8, 1.2, 2.0, 0.3), (3.4, 1.0, 2.2, 0.6), (1.1, 0.4, 2.9, 1.8))


def online_steps(scores=EXAMPLE_SCORES) -> list[dict]:
    """The recurrence of docs/introduction.md on one row: m, α, ℓ after each tile (value rows v_j = 1,
    so õ / ℓ must come out 1 and ℓ must equal Σ e^(s − m) over every key seen)."""
    m, ell, out = -math.inf, 0.0, []
    for tile in scores:
        m_new = max(m, max(tile))
        alpha = math.exp(m - m_new) if m > -math.inf else 0.0
        ell = alpha * ell + sum(math.exp(s - m_new) for s in tile)
        out.append({"m": m_new, "alpha": alpha, "l": ell, "grew": m_new > m})
        m = m_new
    return out


def online_softmax(stage, stages):
    steps = online_steps()
    n_keys = len(EXAMPLE_SCORES[0])
    c = canvas("online-softmax", 430, "Online softmax: one pass over the KV tiles, a running max and a rescale",
               f"One query row against {len(EXAMPLE_SCORES)} KV tiles of {n_keys} keys (example scores). After each "
               "tile the row keeps its running maximum m, the sum ℓ of e^(s − m) and the unnormalised output; when m "
               "grows, the old ℓ and output are multiplied by α = e^(m_old − m_new). After the last tile, O = õ / ℓ.")
    x0, tw, gap = 60, 170, 26
    base, unit = 176, 30  # score bars: baseline y and pixels per unit
    c.text(12, 50, "scores s of one row, tile by tile; the dashed line is the running maximum m", size=12,
           fill="muted")
    prev_m = None
    for t, (tile, st) in enumerate(zip(EXAMPLE_SCORES, steps)):
        x = x0 + t * (tw + gap)
        c.rect(x - 6, 60, tw + 12, base - 60 + 26, fill="panel", stroke="grid", rx=5)
        c.text(x + tw / 2, base + 20, f"tile {t}: keys {t * n_keys}–{t * n_keys + n_keys - 1}", size=12,
               anchor="middle", fill="muted")
        bw = tw / n_keys
        for j, s in enumerate(tile):
            h = s * unit
            top = s == max(tile)
            c.rect(x + j * bw + 6, base - h, bw - 12, h, fill="s", stroke="s", opacity=0.6 if top else 0.3, rx=2)
        y_m = base - st["m"] * unit
        c.line(x - 4, y_m, x + tw + 4, y_m, stroke="bar", sw=1.6, dash="6 3")
        c.text(x + tw, y_m - 5, f"m = {st['m']:.1f}", size=12, anchor="end", fill="bar", weight="600")
        if prev_m is not None:
            c.line(x - gap + 4, base - prev_m * unit, x - 4, y_m, stroke="bar", sw=1.2, dash="6 3")
        prev_m = st["m"]
    # The state after each tile.
    y = base + 48
    c.text(12, y, "after the tile", size=12, weight="600")
    for t, st in enumerate(steps):
        x = x0 + t * (tw + gap)
        hot = st["grew"] and t > 0
        c.rect(x - 6, y + 10, tw + 12, 96, fill="hl" if hot else "panel2", stroke="stroke", opacity=0.5 if hot else None,
               rx=5)
        alpha = "α = 0 (first tile)" if t == 0 else f"α = e^(m_old − m) = {st['alpha']:.2f}"
        rows = [alpha, f"ℓ = α·ℓ + Σ e^(s − m) = {st['l']:.2f}", "õ = α·õ + Σ e^(s − m)·v",
                "m grew: rescale" if hot else ("α = 1: no rescale" if t else "start")]
        for k, line in enumerate(rows):
            c.text(x, y + 30 + k * 20, line, size=12 if text_width(line, 12) <= tw + 8 else 11,
                   weight="600" if k == 3 else None, fill="fg" if k < 3 else ("bar" if hot else "muted"))
        if t:
            c.line(x - gap + 2, y + 58, x - 8, y + 58, stroke="o", sw=1.6, arrow=True)
    y += 128
    every = [s for tile in EXAMPLE_SCORES for s in tile]
    m = max(every)
    direct = sum(math.exp(s - m) for s in every)
    c.text(12, y, f"After the last tile: O = õ / ℓ, one division per row. Here ℓ = {steps[-1]['l']:.2f} = Σ over all "
                  f"{len(every)} keys of e^(s − {m:.1f}) = {direct:.2f}: the same softmax, in one pass.", size=12)
    c.text(12, y + 20, "Every exponent is ≤ 0, so nothing overflows; the tiles never need to be in memory together.",
           size=12, fill="muted")
    return done(c, stage, "The loop invariant of every stage, computed on an example row: after tile t, ℓ and õ are "
                          "the sums over the keys seen so far, relative to the running maximum.")


def _lane_a(r, k):
    return (r % 8) * 4 + (k % 8) // 2


def _lane_b(k, n):
    return n * 4 + (k % 8) // 2


def _lane_c(r, n):
    return (r % 8) * 4 + n // 2


def mma_fragments(stage, stages):
    cell = 22
    c = canvas("mma-fragments", 520, "mma.sync m16n8k16: which lane owns which element",
               "The A (16×16), B (16×8) and C (16×8) fragments of one mma.sync.m16n8k16 with the owning lane "
               "number in every element; shades are the fragment registers a0–a3, b0–b1, c0–c3.")
    regs = ("q", "k", "v", "s")

    def grid(x0, y0, rows, cols, lane, reg, label):
        c.text(x0, y0 - 10, label, size=12, weight="600")
        for r in range(rows):
            for k in range(cols):
                x, y = x0 + k * cell, y0 + r * cell
                col = regs[reg(r, k)]
                c.rect(x, y, cell, cell, fill=col, stroke="bg", opacity=0.35, rx=0, sw=0.5)
                c.text(x + cell / 2, y + 15, str(lane(r, k)), size=11, anchor="middle")

    y0 = 64
    grid(12, y0, 16, 16, _lane_a, lambda r, k: (r >= 8) + 2 * (k >= 8), "A = Q (16 rows × 16 k): a0–a3")
    grid(392, y0, 16, 8, _lane_b, lambda k, n: int(k >= 8), "B = Kᵀ (16 k × 8): b0, b1")
    grid(600, y0, 16, 8, _lane_c, lambda r, n: 2 * (r >= 8), "C = S (16 × 8, fp32): c0–c3")
    y = y0 + 16 * cell + 28
    c.legend(12, y, [("q", "a0, b0, c0–c1"), ("k", "a1, b1"), ("v", "a2, c2–c3"), ("s", "a3")], size=12)
    c.text(12, y + 24, "Lane = 4 × group + quad: the group (lane / 4) picks the row (of B: the column), the quad "
                       "(lane % 4) a pair of", size=12, fill="muted")
    c.text(12, y + 42, "adjacent elements; a register holds two bf16.", size=12, fill="muted")
    c.text(12, y + 64, f"Stage {stage.id}: {stage.head_dim // 16} k-steps per S tile, {stage.block_n // 8} n8 tiles "
                       "per row block; the S accumulators of n-tiles 2j, 2j+1 are the A fragment of PV step j.",
           size=12)
    return done(c, stage, "Fragment ownership of mma.sync.m16n8k16 (bf16 in, fp32 out): the C layout of QKᵀ matches "
                          "the A layout of PV, which is why P never leaves registers.")


def shared_tiles(stage, stages):
    warps = facts.consumer_warps(stage) or stage.warps
    tile = facts.Tiles.of(stage).k
    c = canvas("shared-tiles", 300, "Shared-memory tiles shared by warps",
               f"One K tile of {stage.block_n}×{stage.head_dim} is copied once into shared memory and read by all "
               f"{warps} warps, instead of every warp loading it from global memory.")
    box(c, 20, 60, 200, 56, "global K tile", fill="k", stroke="k", opacity=0.2, sub=f"{stage.block_n}×{stage.head_dim} bf16")
    box(c, 320, 60, 220, 56, "shared memory K tile", fill="k", stroke="k", opacity=0.35, sub=fmt_bytes(tile))
    c.line(222, 88, 318, 88, stroke="k", sw=2, arrow=True)
    c.text(270, 80, "once", size=12, anchor="middle", fill="muted")
    ww = 820 / warps - 10
    for w in range(warps):
        x = 20 + w * (ww + 10)
        box(c, x, 190, ww, 48, f"warp {w}", fill="q", stroke="q", opacity=0.2,
            sub=f"query rows {w * stage.block_m // warps}–{(w + 1) * stage.block_m // warps - 1}")
        c.line(430, 118, x + ww / 2, 188, stroke="k", sw=1.2, arrow=True)
    c.text(20, 270, f"Global/L2 traffic per tile: {fmt_bytes(tile)} instead of {warps} × {fmt_bytes(tile)}; "
                    "16-byte vector loads, consecutive threads on consecutive addresses.", size=12)
    return done(c, stage, "Warps of one CTA share a K/V tile through shared memory; a barrier separates "
                          "the copy from the reads.")


def ldmatrix_lanes(stage, stages):
    cell = 24
    c = canvas("ldmatrix", 540, "ldmatrix.x4: lanes give row addresses, every lane receives fragments",
               "ldmatrix.x4 loads four 8×8 bf16 matrices: lanes 0-7 give the row addresses of matrix 0, "
               "8-15 of matrix 1, 16-23 of matrix 2, 24-31 of matrix 3; afterwards lane t holds row t/4, "
               "columns 2(t%4) and 2(t%4)+1 of every matrix.")
    cols = ("q", "k", "v", "s")
    x0, y0 = 44, 80
    for mi in range(4):
        mx, my = x0 + (mi // 2) * (8 * cell + 30), y0 + (mi % 2) * (8 * cell + 10)
        for r in range(8):
            if mi < 2:
                c.text(mx - 5, my + r * cell + 16, f"{mi * 8 + r}", size=11, anchor="end", fill="muted")
            else:
                c.text(mx + 8 * cell + 5, my + r * cell + 16, f"{mi * 8 + r}", size=11, fill="muted")
            for k in range(8):
                c.rect(mx + k * cell, my + r * cell, cell, cell, fill=cols[mi], stroke="bg", opacity=0.3, rx=0, sw=0.5)
                c.text(mx + k * cell + cell / 2, my + r * cell + 16, str(r * 4 + k // 2), size=11, anchor="middle")
    c.text(x0 - 30, y0 - 26, "16×16 tile in shared memory: numbers in cells = the lane that receives them;",
           size=12, weight="600")
    c.text(x0 - 30, y0 - 9, "numbers beside the rows = the lane that gives that row's address", size=12, fill="muted")
    tx = 490
    c.lines(tx, 100, ["lanes 0–7   → rows of matrix 0",
                      "lanes 8–15  → rows of matrix 1",
                      "lanes 16–23 → rows of matrix 2",
                      "lanes 24–31 → rows of matrix 3"], size=12, leading=1.5, mono=True)
    c.lines(tx, 210, ["One instruction: 32 rows × 16 B = 512 B,",
                      "four registers per lane, already in the",
                      "mma.sync A / B fragment layout.",
                      "",
                      ".trans transposes each 8×8 matrix on the",
                      "way: V (keys × dims) becomes the B",
                      "operand of PV without a shuffle."], size=12, leading=1.45)
    c.legend(x0 - 30, y0 + 16 * cell + 36, [("q", "matrix 0"), ("k", "matrix 1"), ("v", "matrix 2"),
                                            ("s", "matrix 3")], size=12)
    return done(c, stage, "ldmatrix replaces per-element shared-memory loads with one 16-byte row per lane.")


def swizzle_banks(stage, stages):
    cw, ch = 46, 26
    row_bytes = stage.head_dim * facts.ELEM
    c = canvas("swizzle-banks", 400, "The bank map before and after the 128-byte XOR swizzle",
               f"Shared memory has 32 banks of 4 bytes: 128 bytes per row of banks, 8 chunks of 16 bytes (4 banks "
               f"each). A tile row of {row_bytes} B starts at the same bank every time, so chunk 0 of rows 0-7 sits in "
               "banks 0-3 eight times: an 8-way conflict for the ldmatrix that reads it. Stored at chunk "
               "c XOR (row mod 8), the same 8 chunks fall in 8 different bank groups.")
    for side, (label, verdict, f) in enumerate((
            ("row-major", "chunk 0 of rows 0–7: banks 0–3, 8 times = 8-way conflict", lambda r, k: k),
            ("XOR swizzle: chunk c at c ⊕ (row mod 8)", "chunk 0 of rows 0–7: 8 bank groups = no conflict",
             lambda r, k: k ^ (r % 8)))):
        x0, y0 = 62 + side * 408, 92
        c.text(x0 - 50, 52, label, size=13, weight="700")
        c.text(x0 - 50, 70, verdict, size=12, fill="bar" if side == 0 else "ok")
        for b in range(8):
            c.text(x0 + b * cw + cw / 2, y0 - 6, f"{4 * b}–{4 * b + 3}", size=11, anchor="middle", fill="muted")
        for r in range(8):
            c.text(x0 - 6, y0 + r * ch + 17, f"row {r}", size=11, anchor="end", fill="muted")
            for k in range(8):
                pos = f(r, k)
                hot = k == 0
                c.rect(x0 + pos * cw, y0 + r * ch, cw, ch, fill="bar" if hot else "panel2", stroke="grid",
                       opacity=0.55 if hot else None, rx=0, sw=0.6)
                c.text(x0 + pos * cw + cw / 2, y0 + r * ch + 17, f"c{k}", size=12, anchor="middle",
                       weight="600" if hot else None)
        c.text(x0 + 4 * cw, y0 + 8 * ch + 18, "banks (4 per 16-byte chunk position)", size=11, anchor="middle",
               fill="muted")
    layouts = sorted({b.layout for b in stage.smem if b.layout != "mbarrier"})
    c.text(12, 350, "Cells: which 16-byte chunk c of the row is stored at that bank position. Red: what one ldmatrix "
                    "phase reads (8 lanes × 16 B).", size=12)
    c.text(12, 370, f"Stage {stage.id}: {', '.join(layouts) or 'no shared memory'}; TMA's SWIZZLE_128B applies the "
                    "same pattern in hardware from stage 07 on, and wgmma reads it natively.", size=12, fill="muted")
    return done(c, stage, "Rows whose length is a multiple of 128 bytes put a column of chunks in one bank group; "
                          "XOR-ing the chunk index with the row spreads it over all 32 banks.")


def cp_async_double_buffer(stage, stages):
    nb = max(2, stage.kv_stages)
    n = 5
    c = canvas("cp-async-double-buffer", 250, "cp.async double buffer",
               f"With {nb} K/V buffers, the copy of tile j+1 into one buffer runs while the warps compute on "
               "tile j in the other; cp.async.wait_group and a barrier hand a buffer from copy to compute.")
    x0, w = 140, 136
    c.text(12, 83, "cp.async (copy)", size=12)
    c.text(12, 133, "mma + softmax", size=12)
    for j in range(n):
        b = j % nb
        col = ("k", "v", "s")[b % 3]
        box(c, x0 + j * w, 62, w - 8, 32, f"tile {j} → buf {b}", fill=col, stroke=col, opacity=0.3, size=12)
        if j < n - 1:
            box(c, x0 + (j + 1) * w, 112, w - 8, 32, f"tile {j} (buf {b})", fill=col, stroke=col, opacity=0.55,
                size=12)
        c.line(x0 + j * w + w - 12, 96, x0 + (j + 1) * w + 8, 110, stroke="bar", sw=1, arrow=True)
    c.text(12, 180, "Red arrows: cp.async.wait_group + __syncthreads; tile j has landed before compute reads it.",
           size=12)
    c.text(12, 198, f"A buffer is refilled only after the compute on it finished ({nb} buffers: "
                    f"{fmt_bytes(facts.Tiles.of(stage).k * nb)} for K).", size=12)
    return done(c, stage, "Double buffering with cp.async: copies bypass registers and overlap the math.")


def exp2_ffma(stage, stages):
    c = canvas("exp2-ffma", 300, "Softmax arithmetic: exp2 with the scale folded into one FFMA",
               "Before: multiply by the scale, subtract the max, call expf (which multiplies by log2 e and "
               "calls ex2). After: one FFMA computes s·(scale·log2 e) − m·(scale·log2 e), then ex2.approx on "
               "the MUFU; row sums stay per thread until the end; two floats convert to bf16x2 at once.")
    before = ["FMUL s·scale", "FADD − m", "FMUL · log2 e", "range fix-up", "MUFU ex2"]
    after = ["FFMA s·c − m·c", "MUFU ex2"]
    for row, (label, ops) in enumerate((("before (expf)", before), ("after (exp2)", after))):
        y = 60 + row * 70
        c.text(12, y + 22, label, size=12, weight="600")
        for i, op in enumerate(ops):
            box(c, 140 + i * 136, y, 128, 34, op, fill="p" if "MUFU" in op else "panel2", stroke="p",
                opacity=0.3 if "MUFU" in op else None, size=12)
    c.lines(12, 220, ["per score: 1 MUFU ex2 either way; FMA-pipe work drops from about 5 to 1 instruction",
                      "row sum: per-thread partial sums, one quad shuffle reduction after the last tile",
                      "conversion: cvt.rn.bf16x2.f32 packs two probabilities into one register"], size=12,
            leading=1.5)
    return done(c, stage, "c = scale · log2 e is one runtime constant; exp(x) = 2^(x · log2 e).")
