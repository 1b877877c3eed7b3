"""Concepts of the Hopper stages: TMA boxes, wgmma descriptors, register-resident P, two consumer
warpgroups, the mbarrier ring, pingpong and intra-warpgroup overlap."""

from __future__ import annotations

from .. import facts, schedule
from ..svg import fmt_bytes, fmt_us
from ..timeline import KIND_COLOUR
from .common import box, canvas, done


def tma_box(stage, stages):
    inner = 64  # bf16 elements in one 128-byte swizzle atom row
    rows = 8
    cw, ch = 40, 22
    c = canvas("tma-box", 360, "A TMA box landing in 128-byte-swizzled shared memory",
               f"A TMA copy moves a box of {stage.block_n} rows × {inner} bf16 (128 bytes per row) from the "
               "global tensor into shared memory; with SWIZZLE_128B, 16-byte chunk k of row r lands at chunk "
               "k XOR (r mod 8). The mbarrier counts the bytes and completes the phase when all arrived.")
    c.text(20, 56, f"global K: {stage.block_n} × {stage.head_dim} tile = {stage.head_dim // inner} boxes of "
                   f"{stage.block_n} × {inner}", size=12, weight="600")
    for r in range(rows):
        for k in range(8):
            c.rect(20 + k * cw, 70 + r * ch, cw, ch, fill="k", stroke="bg", opacity=0.15 + 0.08 * k, rx=0, sw=0.5)
            c.text(20 + k * cw + cw / 2, 70 + r * ch + 15, f"c{k}", size=9, anchor="middle")
    c.line(350, 158, 440, 158, stroke="k", sw=2, arrow=True)
    c.text(395, 150, "TMA", size=11, anchor="middle", weight="600")
    c.text(460, 56, "shared memory, SWIZZLE_128B (first 8 rows)", size=12, weight="600")
    for r in range(rows):
        for k in range(8):
            pos = k ^ (r % 8)
            c.rect(460 + pos * cw, 70 + r * ch, cw, ch, fill="k", stroke="bg", opacity=0.15 + 0.08 * k, rx=0, sw=0.5)
            c.text(460 + pos * cw + cw / 2, 70 + r * ch + 15, f"c{k}", size=9, anchor="middle")
    box_bytes = stage.block_n * inner * 2
    c.lines(20, 270, [(f"One box: {stage.block_n} × 128 B = {fmt_bytes(box_bytes)}; the K tile needs "
                      f"{stage.head_dim // inner} boxes ({fmt_bytes(facts.Tiles.of(stage).k)})."),
                      "One thread issues cp.async.bulk.tensor with a tensor map (CUtensorMap) and an mbarrier;",
                      "mbarrier.arrive.expect_tx sets the byte count, the copy's completion decrements it."],
            size=11.5, leading=1.5)
    return done(c, stage, "TMA: address generation in hardware, swizzled placement for conflict-free reads, "
                          "completion tracked in bytes on an mbarrier.")


def wgmma_descriptors(stage, stages):
    c = canvas("wgmma-descriptors", 330, "wgmma: a warpgroup and its shared-memory operand descriptors",
               "wgmma.mma_async is issued by a warpgroup of 4 warps (128 threads) for a 64-row tile; the B "
               "operand (and A, for SS) is read from shared memory through a 64-bit matrix descriptor.")
    for w in range(4):
        box(c, 20, 46 + w * 44, 170, 40, f"warp {w}", fill="q", stroke="q", opacity=0.2,
            sub=f"rows {16 * w}–{16 * w + 15} of 64")
    c.text(20, 228, "warpgroup = 128 threads", size=11, fill="muted")
    box(c, 250, 80, 180, 90, "wgmma.mma_async", fill="tensor", stroke="tensor", opacity=0.2,
        sub=f"m64 n{stage.block_n} k16")
    c.line(192, 125, 248, 125, stroke="q", sw=1.6, arrow=True)
    box(c, 500, 60, 320, 40, "K tile in shared memory (B)", fill="k", stroke="k", opacity=0.25)
    c.line(498, 82, 432, 110, stroke="k", sw=1.6, arrow=True)
    fields = ((0, 14, "start addr >> 4"), (16, 30, "LBO >> 4"), (32, 46, "SBO >> 4"), (62, 64, "swizzle"))
    x0, y0, bw = 500, 150, 320 / 64
    c.text(x0, y0 - 8, "64-bit matrix descriptor", size=11.5, weight="600")
    c.rect(x0, y0, 320, 30, fill="panel2", stroke="stroke", rx=0)
    for lo, hi, name in fields:
        c.rect(x0 + lo * bw, y0, (hi - lo) * bw, 30, fill="k", stroke="stroke", opacity=0.35, rx=0)
        c.text(x0 + (lo + hi) / 2 * bw, y0 + 46, name, size=9.5, anchor="middle")
        c.text(x0 + lo * bw + 1, y0 + 12, str(lo), size=8, fill="muted")
    c.lines(20, 262, [(f"Accumulators stay in registers: each thread holds {64 * stage.block_n // 128} fp32 of "
                      f"the 64×{stage.block_n} S tile."),
                      ("wgmma.fence / commit_group / wait_group bracket the asynchronous MMAs; "
                      "LBO/SBO: byte strides between 8×8 core matrices.")], size=11.5, leading=1.5)
    return done(c, stage, "One wgmma replaces a warpgroup's worth of mma.sync and reads its shared-memory "
                          "operands directly, without ldmatrix.")


def descriptor_offsets(stage, stages):
    """The k-steps' descriptors as one base per tile plus constants, computed from the tile shape."""
    box_cols = 64  # bf16 in a 128-byte swizzled box row
    steps = stage.head_dim // 16  # QK k-steps over the head dim
    q_off = [(kk * 16 // box_cols) * stage.block_m * box_cols * 2 + (kk * 16 % box_cols) * 2 for kk in range(steps)]
    k_off = [(kk * 16 // box_cols) * stage.block_n * box_cols * 2 + (kk * 16 % box_cols) * 2 for kk in range(steps)]
    v_off = [j * 16 * 128 for j in range(stage.block_n // 16)]
    c = canvas("descriptor-offsets", 400, "A k-step's descriptor: the tile's base plus a constant",
               "The 64-bit wgmma descriptor: its high word (stride byte offset, swizzle) is the same for every "
               "operand, and from one k-step to the next only the start address in the low word moves, by a "
               "compile-time amount. So each wgmma's descriptor is one add on a per-tile base.")
    x0, y0, bw = 20, 62, 820 / 64
    c.rect(x0, y0, 820, 34, fill="panel2", stroke="stroke", rx=0)
    fields = ((0, 14, "start address >> 4", "tensor", 0.45), (16, 30, "leading byte offset >> 4", "tensor", 0.25),
              (32, 46, "stride byte offset >> 4", "skip", 0.6), (62, 64, "swz", "skip", 0.6))
    for lo, hi, name, fill, op in fields:
        c.rect(x0 + lo * bw, y0, (hi - lo) * bw, 34, fill=fill, stroke="stroke", opacity=op, rx=0)
        c.text(x0 + (lo + hi) / 2 * bw, y0 + 21, name, size=10.5, anchor="middle", weight="600")
        c.text(x0 + lo * bw + 2, y0 - 4, str(lo), size=8.5, fill="muted")
    c.line(x0 + 32 * bw, y0 - 14, x0 + 32 * bw, y0 + 48, stroke="fg", sw=1.5, dash="4,3")
    c.text(x0 + 16 * bw, y0 + 52, "low word: per tile, computed once; + a constant per k-step",
           size=11, anchor="middle", fill="tensor", weight="600")
    c.text(x0 + 48 * bw, y0 + 52, "high word: one constant for Q, K, V and every step",
           size=11, anchor="middle", fill="muted", weight="600")

    def row(y, label, offsets, colour):
        c.text(20, y + 17, label, size=11.5, weight="600")
        w = min(78, 700 / len(offsets))
        for i, off in enumerate(offsets):
            box(c, 150 + i * (w + 4), y, w, 26, f"+{off >> 4}", fill=colour, stroke=colour, opacity=0.18, size=10.5)

    c.text(20, 150, f"Constants added to the tile's low word, k-step by k-step, in 16-byte units ({stage.block_n}-key "
                    "tiles, two 64-column boxes per operand):", size=11.5)
    row(162, "Q, QKᵀ step kk", q_off, "q")
    row(196, "K, QKᵀ step kk", k_off, "k")
    row(230, "V, PV step j", v_off, "v")
    c.text(20, 278, "Per wgmma, in the SASS:", size=11.5, weight="600")
    before = ["add the offset", "shift >> 4", "mask 14 bits", "or the LBO", "move the high word", "(Q: R2UR ×2)"]
    after = ["add the constant to the tile's low word (high word: a constant register)"]
    for i, label in enumerate(before):
        box(c, 150 + i * 114, 290, 108, 28, label, fill="skip", stroke="stroke", opacity=0.5, size=10.5)
    c.text(20, 309, "stage 18", size=11.5)
    box(c, 150, 328, 450, 28, after[0], fill="tensor", stroke="tensor", opacity=0.2, size=10.5)
    c.text(20, 347, f"stage {stage.number}", size=11.5)
    c.lines(20, 384, ["Shared memory ends at 228 KB, below the 256 KB that 14 bits of (address >> 4) reach: the add "
                      "never carries into the leading byte offset."], size=11, leading=1.4, fill="muted")
    return done(c, stage, "The offsets are computed from the tile shape; the arithmetic of the loop "
                          "is unchanged, only its address work shrinks.")


def register_p(stage, stages):
    t = facts.Tiles.of(stage)
    c = canvas("register-p", 240, "P stays in registers: wgmma RS instead of SS",
               "With SS both PV operands come from shared memory, so P must be written there first; with RS "
               "the A operand (P) comes from registers, saving the store, the fence and the read.")
    for row, (label, steps) in enumerate((
            ("SS (before)", ["softmax → P (regs)", "stmatrix P → smem", "fence.proxy.async", "wgmma SS"]),
            ("RS (this stage)", ["softmax → P (regs)", "cvt to bf16 A fragment", "wgmma RS"]))):
        y = 56 + row * 66
        c.text(12, y + 22, label, size=12, weight="600")
        for i, s in enumerate(steps):
            box(c, 140 + i * 172, y, 160, 34, s, fill="p", stroke="p", opacity=0.15 + 0.1 * i, size=11)
            if i:
                c.line(140 + i * 172 - 12, y + 17, 140 + i * 172 - 2, y + 17, stroke="p", arrow=True)
    c.text(12, 210, f"Saved per KV iteration: {fmt_bytes(t.p)} written to and read back from shared memory "
                    f"({stage.block_m}×{stage.block_n} bf16).", size=11.5)
    return done(c, stage, "The S accumulator layout of wgmma matches its A-from-registers layout once converted "
                          "to bf16.")


def two_consumers(stage, stages):
    t = facts.Tiles.of(stage)
    c = canvas("two-consumers", 260, "Two consumer warpgroups share each K/V tile",
               f"A CTA of {stage.block_m} query rows: warpgroup 0 runs rows 0–{stage.block_m // 2 - 1}, warpgroup 1 "
               f"rows {stage.block_m // 2}–{stage.block_m - 1}; both read the same K and V tiles in shared memory.")
    box(c, 20, 60, 240, 50, "warpgroup 0", fill="q", stroke="q", opacity=0.2, sub=f"rows 0–{stage.block_m // 2 - 1}")
    box(c, 20, 140, 240, 50, "warpgroup 1", fill="v", stroke="v", opacity=0.2,
        sub=f"rows {stage.block_m // 2}–{stage.block_m - 1}")
    box(c, 520, 60, 300, 50, "K tile (shared memory)", fill="k", stroke="k", opacity=0.25,
        sub=f"{stage.block_n}×{stage.head_dim} · {fmt_bytes(t.k)}")
    box(c, 520, 140, 300, 50, "V tile (shared memory)", fill="k", stroke="k", opacity=0.25,
        sub=f"{stage.block_n}×{stage.head_dim} · {fmt_bytes(t.v)}")
    for ya in (85, 165):
        for yb in (85, 165):
            c.line(518, yb, 262, ya, stroke="k", sw=1.2, arrow=True)
    c.text(20, 228, f"L2 bytes per query row and iteration: {(t.k + t.v) / stage.block_m:.0f} B "
                    f"(vs {(t.k + t.v) / (stage.block_m // 2):.0f} B with one warpgroup per CTA).", size=11.5)
    return done(c, stage, "Doubling the rows per CTA halves the K/V traffic per unit of tensor-core work.")


def mbarrier_ring(stage, stages):
    ns = max(2, stage.kv_stages)
    iters = 3 * ns
    c = canvas("mbarrier-ring", 330, "The full/empty mbarrier ring and its phases",
               f"{ns} shared-memory slots, each with a full and an empty mbarrier. Iteration k uses slot k mod "
               f"{ns} and waits for phase (k / {ns}) mod 2: the producer waits on empty, arms full with the "
               "byte count and issues TMA; consumers wait on full and arrive on empty when done.")
    sw = 150
    for s in range(ns):
        x = 40 + s * (sw + 30)
        box(c, x, 50, sw, 40, f"slot {s}", fill="k", stroke="k", opacity=0.25, sub="K/V tile")
        c.rect(x, 96, sw / 2 - 2, 20, fill="ok", stroke=None, opacity=0.5, rx=3)
        c.text(x + sw / 4, 110, "full", size=10, anchor="middle")
        c.rect(x + sw / 2 + 2, 96, sw / 2 - 2, 20, fill="bar", stroke=None, opacity=0.5, rx=3)
        c.text(x + 3 * sw / 4, 110, "empty", size=10, anchor="middle")
    y0 = 150
    c.text(20, y0, "iteration k", size=11, weight="600")
    c.text(20, y0 + 22, "slot", size=11, fill="muted")
    c.text(20, y0 + 44, "phase", size=11, fill="muted")
    for k in range(iters):
        x = 120 + k * 56
        c.text(x, y0, str(k), size=11, anchor="middle", weight="600")
        c.text(x, y0 + 22, str(k % ns), size=11, anchor="middle")
        c.text(x, y0 + 44, str((k // ns) % 2), size=11, anchor="middle")
    c.lines(20, 230, ["producer: wait empty[s] (phase ^ 1) → arrive.expect_tx full[s] → TMA into slot s",
                      "consumer: wait full[s] (phase) → wgmma on slot s → arrive empty[s]",
                      ("the phase bit flips each time the ring wraps, so a barrier is never confused with "
                      "its previous round")], size=11.5, leading=1.5, mono=False)
    return done(c, stage, f"Stage {stage.id}: {ns}-slot ring; mbarriers in shared memory: "
                          f"{', '.join(b.name for b in facts.barriers(stage)) or 'none'}.")


def _role_lanes(c, stage, y0, iters=3, width=700, x0=140):
    """Per-role lanes of the schedule model (the same model as the timeline); a role gets one track
    per unit it uses, so its overlapping ops stay visible."""
    slots = [s for s in schedule.simulate(stage, iters) if s.op.kind not in schedule.ONCE]
    end = max(s.end for s in slots)
    sc = width / end
    y = y0
    for r in [r.name for r in stage.roles]:
        mine = [s for s in slots if s.op.role == r]
        units = [u for u in schedule.UNITS if any(s.op.unit == u for s in mine)]
        h = 24 * len(units) + 6
        c.text(12, y + h / 2 + 4, r, size=11.5, weight="600")
        c.rect(x0, y, width, h, fill="panel", stroke="grid", rx=3)
        for k, u in enumerate(units):
            ty = y + 3 + 24 * k
            c.text(x0 - 6, ty + 15, u, size=9, anchor="end", fill="muted")
            for s in mine:
                if s.op.unit != u:
                    continue
                w = (s.end - s.start) * sc
                c.rect(x0 + s.start * sc, ty, w, 22, fill=KIND_COLOUR[s.op.kind], stroke="bg", rx=2,
                       opacity=0.9 if s.it % 2 == 0 else 0.65)
                label = s.op.kind.replace("softmax", "sm").replace("load_", "") + f" {s.it}"
                if w > 8 * len(label):
                    c.text(x0 + s.start * sc + w / 2, ty + 15, label, size=9.5, anchor="middle", fill="bg",
                           weight="600")
        y += h + 8
    return y, end


def _lanes_height(stage, iters=3) -> int:
    slots = schedule.simulate(stage, iters)
    total = 0
    for r in stage.roles:
        units = {s.op.unit for s in slots if s.op.role == r.name and s.op.kind not in schedule.ONCE}
        total += 24 * len(units) + 14
    return total


def pingpong(stage, stages):
    c = canvas("pingpong", 130 + _lanes_height(stage), "Pingpong: two warpgroups alternate GEMMs and softmax",
               "Per-role lanes from the schedule model: while one consumer warpgroup runs its softmax on the "
               "MUFU, the other issues its GEMMs to the tensor cores; named barriers keep the GEMMs in order.")
    y, _end = _role_lanes(c, stage, 50)
    p = schedule.predict(stage)
    c.text(12, y + 24, f"Model: {fmt_us(p.period)} per iteration; tensor cores {p.utilisation('tensor') * 100:.0f}% "
                       f"busy, softmax {p.utilisation('softmax') * 100:.0f}% busy.", size=11.5)
    c.legend(12, y + 48, [("s", "QKᵀ"), ("p", "softmax"), ("o", "PV"), ("k", "load K"), ("v", "load V")], size=11)
    return done(c, stage, "Lanes per role, placed by the same schedule model as the timeline.")


def intra_overlap(stage, stages):
    c = canvas("intra-wg-overlap", 130 + _lanes_height(stage), "Intra-warpgroup overlap: QK(j+1) and PV(j) around softmax",
               "Each consumer issues the QK GEMM of the next tile and the PV GEMM of the previous tile before "
               "running the softmax, so its own tensor-core work is in flight while it exponentiates.")
    y, _end = _role_lanes(c, stage, 50)
    c.text(12, y + 24, "Program order per consumer: issue qk(j+1), issue pv(j) with P(j), softmax(j+1) while both run; "
                       "the cost: registers for two S tiles.", size=11.5)
    c.legend(12, y + 48, [("s", "QKᵀ"), ("p", "softmax"), ("o", "PV"), ("k", "load K"), ("v", "load V")], size=11)
    return done(c, stage, "Lanes per role, placed by the schedule model from the stage's declared program order.")
