"""Concepts of the sm_80 stages: online softmax, mma.sync fragments, shared tiles, ldmatrix,
swizzle, cp.async double buffering, exp2/FFMA softmax arithmetic."""

from __future__ import annotations

from .. import facts
from ..svg import fmt_bytes
from .common import box, canvas, done


def online_softmax(stage, stages):
    n = 4
    c = canvas("online-softmax", 330, "Online softmax over KV tiles",
               f"Each of {n} KV tiles of {stage.block_n} keys updates a running row maximum m, row sum l and "
               "output O; the tiles never need to be in memory together.")
    tw, gap, x0, y = 170, 40, 20, 60
    for j in range(n):
        x = x0 + j * (tw + gap)
        box(c, x, y, tw, 44, f"S{j} = Q K{j}ᵀ", fill="s", stroke="s", opacity=0.22,
            sub=f"{stage.block_m}×{stage.block_n} scores")
        c.lines(x + 4, y + 70, [f"m{j} = max(m{j - 1 if j else '₋'}, rowmax S{j})" if j else "m0 = rowmax S0",
                                f"P{j} = exp(S{j} − m{j})",
                                f"l{j} = l{j - 1}·e^(m{j - 1}−m{j}) + Σ P{j}" if j else "l0 = Σ P0",
                                f"O{j} = O{j - 1}·e^(m{j - 1}−m{j}) + P{j} V{j}" if j else "O0 = P0 V0"],
                size=11, leading=1.45, mono=True)
        if j:
            c.line(x - gap + 4, y + 22, x - 4, y + 22, stroke="o", sw=1.6, arrow=True)
            c.text(x - gap / 2, y + 14, "m, l, O", size=9.5, anchor="middle", fill="muted")
    c.rect(20, 200, 820, 52, fill="o", stroke="o", opacity=0.15, rx=6)
    c.text(30, 222, f"After the last tile: O = O{n - 1} / l{n - 1}   (one division per row, in the epilogue)",
           size=12.5, weight="600")
    c.text(30, 242, "Rescaling by e^(m_old − m_new) keeps every exponent ≤ 0, so nothing overflows, and the "
                    "result equals softmax over all keys.", size=11, fill="muted")
    c.text(20, 290, f"Registers per warp hold m and l for its rows, the S/P tile ({stage.block_n} keys) and O "
                    f"({stage.head_dim} columns); memory traffic is independent of sequence length squared.",
           size=11, fill="muted")
    return done(c, stage, "The loop invariant of every stage: after tile j, O and l hold the un-normalised "
                          "softmax-weighted sum over the keys seen so far, relative to the running max m.")


def _lane_a(r, k):
    return (r % 8) * 4 + (k % 8) // 2


def _lane_b(k, n):
    return n * 4 + (k % 8) // 2


def _lane_c(r, n):
    return (r % 8) * 4 + n // 2


def mma_fragments(stage, stages):
    cell = 19
    c = canvas("mma-fragments", 440, "mma.sync m16n8k16: which lane owns which element",
               "The A (16×16), B (16×8) and C (16×8) fragments of one mma.sync.m16n8k16 with the owning lane "
               "number in every element; colours are the fragment registers a0–a3, b0–b1, c0–c3.")
    regs = ("q", "k", "v", "s")

    def grid(x0, y0, rows, cols, lane, reg, label):
        c.text(x0, y0 - 8, label, size=12, weight="600")
        for r in range(rows):
            for k in range(cols):
                x, y = x0 + k * cell, y0 + r * cell
                col = regs[reg(r, k)]
                c.rect(x, y, cell, cell, fill=col, stroke="bg", opacity=0.35, rx=0, sw=0.5)
                c.text(x + cell / 2, y + 13, str(lane(r, k)), size=8.5, anchor="middle")

    y0 = 58
    grid(20, y0, 16, 16, _lane_a, lambda r, k: (r >= 8) + 2 * (k >= 8), "A = Q fragment (16 rows × 16 k), 4 regs")
    grid(360, y0, 16, 8, _lane_b, lambda k, n: int(k >= 8), "B = Kᵀ (16 k × 8 cols), 2 regs")
    grid(560, y0, 16, 8, _lane_c, lambda r, n: 2 * (r >= 8) + 0, "C = S (16 × 8), fp32")
    y = y0 + 16 * cell + 26
    c.legend(20, y, [("q", "a0 / b0 / c0-c1"), ("k", "a1 / b1"), ("v", "a2 / c2-c3"), ("s", "a3")], size=11)
    c.text(20, y + 24, "Lane = 4 × group + quad: group (lane / 4) picks the row (or B column), quad (lane % 4) a pair "
                       "of adjacent elements; each register holds two bf16.", size=11, fill="muted")
    c.text(20, y + 42, f"Stage {stage.id}: {stage.head_dim // 16} k-steps per S tile, {stage.block_n // 8} n8 tiles "
                       "per row block; S accumulators of n-tiles 2j, 2j+1 are exactly the A fragment of PV step j.",
           size=11, fill="muted")
    return done(c, stage, "Fragment ownership of mma.sync.m16n8k16 (bf16 in, fp32 out): the C layout of QKᵀ "
                          "matches the A layout of PV, which is why P never leaves registers.")


def shared_tiles(stage, stages):
    warps = facts.consumer_warps(stage) or stage.warps
    tile = facts.Tiles.of(stage).k
    c = canvas("shared-tiles", 300, "Shared-memory tiles shared by warps",
               f"One K tile of {stage.block_n}×{stage.head_dim} is copied once into shared memory and read by all "
               f"{warps} warps, instead of every warp loading it from global memory.")
    box(c, 20, 60, 200, 56, "global K tile", fill="k", stroke="k", opacity=0.2, sub=f"{stage.block_n}×{stage.head_dim} bf16")
    box(c, 320, 60, 220, 56, "shared memory K tile", fill="k", stroke="k", opacity=0.35, sub=fmt_bytes(tile))
    c.line(222, 88, 318, 88, stroke="k", sw=2, arrow=True)
    c.text(270, 80, "once", size=10.5, anchor="middle", fill="muted")
    ww = 820 / warps - 10
    for w in range(warps):
        x = 20 + w * (ww + 10)
        box(c, x, 190, ww, 48, f"warp {w}", fill="q", stroke="q", opacity=0.2,
            sub=f"query rows {w * stage.block_m // warps}–{(w + 1) * stage.block_m // warps - 1}")
        c.line(430, 118, x + ww / 2, 188, stroke="k", sw=1.2, arrow=True)
    c.text(20, 270, f"Global/L2 traffic per tile: {fmt_bytes(tile)} instead of {warps} × {fmt_bytes(tile)}; "
                    "16-byte vector loads, consecutive threads on consecutive addresses (coalesced).",
           size=11.5)
    return done(c, stage, "Warps of one CTA share a K/V tile through shared memory; a barrier separates "
                          "the copy from the reads.")


def ldmatrix_lanes(stage, stages):
    cell = 22
    c = canvas("ldmatrix", 480, "ldmatrix.x4: lanes give row addresses, every lane receives fragments",
               "ldmatrix.x4 loads four 8×8 bf16 matrices: lanes 0-7 give the row addresses of matrix 0, "
               "8-15 of matrix 1, 16-23 of matrix 2, 24-31 of matrix 3; afterwards lane t holds row t/4, "
               "columns 2(t%4) and 2(t%4)+1 of every matrix.")
    cols = ("q", "k", "v", "s")
    x0, y0 = 40, 60
    for mi in range(4):
        mx, my = x0 + (mi // 2) * (8 * cell + 8), y0 + (mi % 2) * (8 * cell + 8)
        for r in range(8):
            c.text(mx - 4, my + r * cell + 15, f"{mi * 8 + r}" if mi < 2 else "", size=8.5, anchor="end", fill="muted")
            for k in range(8):
                c.rect(mx + k * cell, my + r * cell, cell, cell, fill=cols[mi], stroke="bg", opacity=0.3, rx=0, sw=0.5)
                c.text(mx + k * cell + cell / 2, my + r * cell + 15, str(r * 4 + k // 2), size=8.5, anchor="middle")
        if mi >= 2:
            for r in range(8):
                c.text(mx + 8 * cell + 4, my + r * cell + 15, f"{mi * 8 + r}", size=8.5, fill="muted")
    c.text(x0, y0 - 10, "16×16 tile in shared memory; numbers = receiving lane", size=11.5, weight="600")
    tx = 460
    c.lines(tx, 80, ["lanes 0–7   → row addresses of matrix 0 (r0)",
                     "lanes 8–15  → row addresses of matrix 1 (r1)",
                     "lanes 16–23 → row addresses of matrix 2 (r2)",
                     "lanes 24–31 → row addresses of matrix 3 (r3)"], size=11.5, leading=1.5, mono=True)
    c.lines(tx, 190, ["One instruction: 32 × 16-byte rows = 512 B,",
                      "four registers per lane, already in the",
                      "mma.sync A/B fragment layout.",
                      "",
                      ".trans transposes each 8×8 matrix on the way:",
                      "V (keys × dims) becomes the B operand of PV",
                      "without a shuffle."], size=11.5, leading=1.45)
    c.legend(40, 466, [("q", "matrix 0"), ("k", "matrix 1"), ("v", "matrix 2"), ("s", "matrix 3")], size=11)
    return done(c, stage, "ldmatrix replaces per-element shared-memory loads with one 16-byte row per lane.")


def swizzle_banks(stage, stages):
    cell_w, cell_h = 44, 24
    c = canvas("swizzle-banks", 380, "Shared-memory banks before and after the XOR swizzle",
               "Eight rows of a tile, each 128 bytes = 8 chunks of 16 bytes (4 banks each). Reading chunk 0 of "
               "8 rows hits the same banks 8 times in row-major order; with chunk' = chunk XOR (row mod 8) "
               "the 8 reads land in 8 different bank groups.")
    for side, (label, f) in enumerate((("row-major: 8-way bank conflict", lambda r, k: k),
                                       ("XOR swizzle: conflict-free", lambda r, k: k ^ (r % 8)))):
        x0, y0 = 30 + side * 420, 70
        c.text(x0, y0 - 12, label, size=12.5, weight="600")
        for b in range(8):
            c.text(x0 + b * cell_w + cell_w / 2, y0 + 8 * cell_h + 16, f"{4 * b}–{4 * b + 3}", size=9.5,
                   anchor="middle", fill="muted")
        c.text(x0 + 8 * cell_w + 6, y0 + 8 * cell_h + 16, "banks", size=9.5, fill="muted")
        for r in range(8):
            for k in range(8):
                pos = f(r, k)
                hot = k == 0
                c.rect(x0 + pos * cell_w, y0 + r * cell_h, cell_w, cell_h, fill="bar" if hot else "panel2",
                       stroke="grid", opacity=0.55 if hot else None, rx=0, sw=0.6)
                c.text(x0 + pos * cell_w + cell_w / 2, y0 + r * cell_h + 16, f"r{r}c{k}", size=9, anchor="middle")
    c.text(30, 320, "Highlighted: chunk 0 of rows 0–7, what one ldmatrix phase reads (8 lanes × 16 B).", size=11)
    layouts = sorted({b.layout for b in stage.smem})
    c.text(30, 340, f"Stage {stage.id} shared-memory layouts: {', '.join(layouts) or 'none'}.", size=11, fill="muted")
    return done(c, stage, "Row-major tiles whose rows are a multiple of 128 bytes put a column of chunks in one "
                          "bank group; XOR-ing the chunk index with the row spreads it over all 32 banks.")


def cp_async_double_buffer(stage, stages):
    nb = max(2, stage.kv_stages)
    n = 5
    c = canvas("cp-async-double-buffer", 250, "cp.async double buffer",
               f"With {nb} K/V buffers, the copy of tile j+1 into one buffer runs while the warps compute on "
               "tile j in the other; cp.async.wait_group and a barrier hand a buffer from copy to compute.")
    x0, w = 140, 136
    c.text(12, 82, "cp.async (copy)", size=11.5)
    c.text(12, 132, "mma + softmax", size=11.5)
    for j in range(n):
        b = j % nb
        col = ("k", "v", "s")[b % 3]
        box(c, x0 + j * w, 62, w - 8, 32, f"tile {j} → buf {b}", fill=col, stroke=col, opacity=0.3, size=11)
        box(c, x0 + (j + 1) * w, 112, w - 8, 32, f"compute tile {j} (buf {b})", fill=col, stroke=col,
            opacity=0.55, size=10.5) if j < n - 1 else None
        c.line(x0 + j * w + w - 12, 96, x0 + (j + 1) * w + 8, 110, stroke="bar", sw=1, arrow=True)
    c.text(12, 180, "Red arrows: cp.async.wait_group + __syncthreads — tile j has landed before compute reads it;",
           size=11)
    c.text(12, 198, f"a buffer is refilled only after the compute on it finished ({nb} buffers: "
                    f"{fmt_bytes(facts.Tiles.of(stage).k * nb)} for K).", size=11)
    return done(c, stage, "Double buffering with cp.async: copies bypass registers and overlap the math.")


def exp2_ffma(stage, stages):
    c = canvas("exp2-ffma", 300, "Softmax arithmetic: exp2 with the scale folded into one FFMA",
               "Before: multiply by the scale, subtract the max, call expf (which multiplies by log2 e and "
               "calls ex2). After: one FFMA computes s·(scale·log2 e) − m·(scale·log2 e), then ex2.approx on "
               "the MUFU; row sums stay per thread until the end; two floats convert to bf16x2 at once.")
    before = ["FMUL s·scale", "FADD − m", "expf: FMUL log2e", "range fix-up", "MUFU ex2"]
    after = ["FFMA s·c − m·c", "MUFU ex2"]
    for row, (label, ops, _col) in enumerate((("before (expf)", before, "muted"), ("after (exp2)", after, "ok"))):
        y = 60 + row * 70
        c.text(12, y + 22, label, size=12, weight="600")
        for i, op in enumerate(ops):
            box(c, 140 + i * 132, y, 124, 34, op, fill="p" if "MUFU" in op else "panel2", stroke="p",
                opacity=0.3 if "MUFU" in op else None, size=11)
    c.lines(12, 220, ["per score: 1 MUFU ex2 either way; FMA-pipe work drops from ~5 to ~1 instruction",
                      "row sum: per-thread partial sums, one quad shuffle reduction after the last tile",
                      "conversion: cvt.rn.bf16x2.f32 packs two probabilities into one register"], size=11.5,
            leading=1.5)
    return done(c, stage, "c = scale · log2 e is a compile-time constant times the runtime scale; "
                          "exp(x) = 2^(x · log2 e).")
