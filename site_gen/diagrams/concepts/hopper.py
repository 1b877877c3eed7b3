"""Concepts of the Hopper stages: a TMA box over a tensor map, wgmma's core matrices and
descriptors, the descriptor offsets of stage 19, register-resident P, two consumer warpgroups,
the mbarrier ring and its phases, pingpong and intra-warpgroup overlap."""

from __future__ import annotations

from .. import facts, rates
from ..svg import fmt_bytes, text_width
from .common import box, canvas, done

BOX_COLS = 64  # bf16 in one 128-byte row of a SWIZZLE_128B box: the inner box dimension
SWIZZLE_ATOM = 1024  # 8 rows x 128 bytes: the SBO of every descriptor (kernel.cu SWIZZLE_ATOM)
DESC_FIELDS = ((0, 14, "start address >> 4"), (16, 30, "LBO >> 4"), (32, 46, "SBO >> 4"), (49, 52, "base"),
               (62, 64, "layout"))


def descriptor_values(stage) -> dict:
    """LBO and SBO (bytes) and the start-address step of each operand's descriptor, as the kernels
    compute them (make_smem_desc_sw128 in common/wgmma.cuh)."""
    return {"Q": {"lbo": 16, "sbo": SWIZZLE_ATOM, "step": 32, "box": stage.block_m * BOX_COLS * 2},
            "K": {"lbo": 16, "sbo": SWIZZLE_ATOM, "step": 32, "box": stage.block_n * BOX_COLS * 2},
            "V": {"lbo": stage.block_n * BOX_COLS * 2, "sbo": SWIZZLE_ATOM, "step": 16 * 128, "box": None}}


def tma_box(stage, stages):
    rows_per_box = stage.block_n
    boxes = stage.head_dim // BOX_COLS
    box_bytes = rows_per_box * BOX_COLS * 2
    c = canvas("tma-box", 470, "A TMA box over a tensor map, landing swizzled in shared memory",
               f"The tensor map describes K in global memory (its sizes, strides, box and swizzle). One "
               f"cp.async.bulk.tensor names the map, the box's coordinates and an mbarrier: the TMA unit fetches "
               f"{rows_per_box} rows × {BOX_COLS} bf16 ({fmt_bytes(box_bytes)}), writes them with the 128-byte "
               "swizzle and counts the bytes on the mbarrier; the K tile is {boxes} such boxes.".replace(
                   "{boxes}", str(boxes)))
    # The global tensor, one (batch, head) of K, with the box at its coordinates.
    gx, gy, cw, rh = 20, 84, 84, 30
    nrow = 6
    c.text(gx, 58, "global memory: K as the tensor map sees it", size=13, weight="700")
    c.text(gx, 76, f"[rows = B·H·L, {stage.head_dim} columns] bf16, rows {stage.head_dim * 2} B apart", size=12,
           fill="muted")
    for r in range(nrow):
        for b in range(boxes):
            hot = r == 2 and b == 0
            c.rect(gx + b * cw, gy + r * rh, cw, rh, fill="k", stroke="bg", opacity=0.55 if hot else 0.14, rx=0)
            if hot:
                c.text(gx + b * cw + cw / 2, gy + r * rh + 20, "box", size=12, anchor="middle", weight="700")
        c.text(gx + boxes * cw + 6, gy + r * rh + 20, f"rows {r * rows_per_box}–{(r + 1) * rows_per_box - 1}", size=12,
               fill="muted")
    c.text(gx, gy + nrow * rh + 18, f"columns 0–63 | 64–127: one box is {rows_per_box} × {BOX_COLS}", size=12,
           fill="muted")
    # The tensor map's fields.
    mx = 300
    c.rect(mx, 52, 250, 176, fill="panel2", stroke="stroke", rx=5)
    c.text(mx + 10, 72, "CUtensorMap (128 B, built on the host)", size=12, weight="700")
    fields = [("dtype", "bf16"), ("rank", "4 (col, row, head, batch)" if stage.strided else "2"),
              ("sizes", f"{stage.head_dim}, rows"), ("strides", f"{stage.head_dim * 2} B per row"),
              ("box", f"{BOX_COLS} × {rows_per_box}"), ("swizzle", "128 B"), ("out of bounds", "zeros")]
    for i, (k, v) in enumerate(fields):
        c.text(mx + 10, 94 + i * 19, k, size=12, fill="muted")
        c.text(mx + 104, 94 + i * 19, v, size=12)
    c.line(gx + cw + 2, gy + 2 * rh + 14, mx - 4, 150, stroke="k", sw=1.4, dash="4 3")
    # The instruction and the shared-memory box.
    c.text(20, 328, "one thread issues:", size=12, weight="600")
    c.text(150, 328, "mbarrier.arrive.expect_tx [mbar], bytes of K and V", size=12, mono=True)
    c.text(150, 348, "cp.async.bulk.tensor.2d [smem], [map, {0, row}], [mbar]   (per box)", size=12, mono=True)
    sx, sy, s = 600, 84, 30
    c.text(sx, 58, "shared memory: the box", size=13, weight="700")
    c.text(sx, 76, "first 8 rows; chunk c of row r at c ⊕ r", size=12, fill="muted")
    for r in range(8):
        for k in range(8):
            pos = k ^ r
            c.rect(sx + pos * s, sy + r * s * 0.8, s, s * 0.8, fill="k", stroke="bg", opacity=0.12 + 0.07 * k, rx=0)
            c.text(sx + pos * s + s / 2, sy + r * s * 0.8 + 17, f"c{k}", size=11, anchor="middle")
    c.line(mx + 250, 140, sx - 4, 140, stroke="k", sw=2, arrow=True)
    c.text(sx, sy + 8 * s * 0.8 + 20, f"{rows_per_box} rows × 128 B = {fmt_bytes(box_bytes)}", size=12)
    y = 384
    c.lines(12, y, [f"The mbarrier's phase completes when the expected {fmt_bytes(box_bytes * boxes * 2)} have "
                    "arrived: no thread waited on the copy, no register held the data.",
                    "Rows past the end of the tensor come back as zeros: the last tile of any length needs no "
                    "special load (stage 17 on).",
                    "The same box, in reverse, is a TMA store (stage 15)."], size=12, leading=1.6)
    return done(c, stage, f"Box sizes of stage {stage.id}: {boxes} boxes of {rows_per_box} × {BOX_COLS} per K or V "
                          "tile; the swizzle is the bank map's XOR, applied by the TMA unit.")


def _bitfield(c, x0, y0, width, values):
    bw = width / 64
    c.rect(x0, y0, width, 34, fill="panel2", stroke="stroke", rx=0)
    for lo, hi, name in DESC_FIELDS:
        c.rect(x0 + lo * bw, y0, (hi - lo) * bw, 34, fill="tensor", stroke="stroke", opacity=0.3, rx=0)
        label = name if text_width(name, 12, bold=True) < (hi - lo) * bw - 4 else ""
        if label:
            c.text(x0 + (lo + hi) / 2 * bw, y0 + 22, label, size=12, anchor="middle", weight="600")
        c.text(x0 + lo * bw + 1, y0 - 5, str(lo), size=11, fill="muted")
    for lo, hi, name in DESC_FIELDS:
        if name in values:
            text = values[name]
            x = min(x0 + (lo + hi) / 2 * bw, x0 + width - text_width(text, 12) / 2)
            c.text(x, y0 + 50, text, size=12, anchor="middle", fill="muted")


def wgmma_descriptors(stage, stages):
    v = descriptor_values(stage)
    c = canvas("wgmma-descriptors", 620, "wgmma reads shared memory through descriptors: core matrices, LBO, SBO",
               "A 64-bit matrix descriptor gives wgmma the start address of an operand tile in shared memory, two "
               "byte offsets and the swizzle mode. With the 128-byte swizzle the tile is made of 8-row × 128-byte "
               "atoms (1024 B); core matrices are 8 rows × 16 bytes. K-major operands (Q, K) step through k by "
               "moving the start address 32 bytes; the MN-major V steps by 16 rows and finds its second 64-column "
               "box LBO bytes away.")
    _bitfield(c, 20, 64, 820, {"start address >> 4": "first byte this k-step reads", "LBO >> 4": "leading offset",
                               "SBO >> 4": "stride offset", "layout": "1 = 128B swizzle"})
    cw, rh = 34, 15
    panels = (("K-major: Q and K for S = QKᵀ", "K", 20), ("MN-major: V for O = PV (transposed)", "V", 445))
    for title, op, x0 in panels:
        y0 = 170
        c.text(x0, 146, title, size=13, weight="700")
        fill = "k" if op == "K" else "v"
        for r in range(16):
            for k in range(8):
                hot = k in (0, 1) if op == "K" else True
                opacity = (0.55 if hot else 0.14) if op == "K" else 0.2 + 0.1 * (r // 8)
                c.rect(x0 + k * cw, y0 + r * rh + (6 if r >= 8 else 0), cw, rh, fill=fill, stroke="bg",
                       opacity=opacity, rx=0, sw=0.6)
        c.rect(x0, y0, cw, 8 * rh, fill="none", stroke="fg", sw=2, rx=0)  # one core matrix: 8 rows x 16 B
        gx = x0 + 8 * cw
        c.line(gx + 8, y0 + 2, gx + 8, y0 + 8 * rh + 6 + 2, stroke="bar", sw=1.5, arrow=True)
        c.text(gx + 16, y0 + 14, "atom 0: rows 0–7", size=12)
        c.text(gx + 16, y0 + 30, "8 × 128 B = 1 KiB", size=12, fill="muted")
        c.text(gx + 16, y0 + 8 * rh / 2 + 12, f"SBO = {v[op]['sbo']} B", size=12, fill="bar", weight="600")
        c.text(gx + 16, y0 + 8 * rh + 20, "atom 1: rows 8–15", size=12)
        yb = y0 + 16 * rh + 24
        c.text(x0, yb, "columns: 8 chunks of 16 B = one 128-byte row", size=12, fill="muted")
        c.text(x0, yb + 18, "framed: one core matrix, 8 rows × 16 B", size=12, fill="muted")
        if op == "K":
            c.lines(x0, yb + 46, ["rows: keys (K) or queries (Q); k along the row",
                                  "k-step 0 reads chunks 0–1 (16 bf16): dark",
                                  f"each next k-step: start address + {v['K']['step']} B",
                                  f"k = 64…127: the second box, + {fmt_bytes(v['K']['box'])} (K)",
                                  f"LBO unused (set to {v['K']['lbo']} B); SBO = {v['K']['sbo']} B"], size=12,
                    leading=1.5)
        else:
            c.lines(x0, yb + 46, ["rows: keys = k of the PV product; head dim along the row",
                                  "one PV k-step: 16 keys = rows 0–15, both atoms",
                                  f"next k-step: start address + {fmt_bytes(v['V']['step'])}",
                                  f"head dim 64…127: LBO = {fmt_bytes(v['V']['lbo'])} away (next box)",
                                  f"SBO = {v['V']['sbo']} B between 8-row atoms; transpose bit set"], size=12,
                    leading=1.5)
    return done(c, stage, f"Values of stage {stage.id} ({stage.block_m}-row Q tile, {stage.block_n}-key K/V tiles), "
                          "as make_smem_desc_sw128 in common/wgmma.cuh computes them; tiles start on 1024-byte "
                          "boundaries, so the base offset is 0.")


def descriptor_offsets(stage, stages):
    """The k-steps' descriptors as one base per tile plus constants, computed from the tile shape."""
    steps = stage.head_dim // 16  # QK k-steps over the head dim
    q_off = [(kk * 16 // BOX_COLS) * stage.block_m * BOX_COLS * 2 + (kk * 16 % BOX_COLS) * 2 for kk in range(steps)]
    k_off = [(kk * 16 // BOX_COLS) * stage.block_n * BOX_COLS * 2 + (kk * 16 % BOX_COLS) * 2 for kk in range(steps)]
    v_off = [j * 16 * 128 for j in range(stage.block_n // 16)]
    c = canvas("descriptor-offsets", 420, "A k-step's descriptor: the tile's base plus a constant",
               "The 64-bit wgmma descriptor: its high word (stride byte offset, swizzle) is the same for every "
               "operand, and from one k-step to the next only the start address in the low word moves, by a "
               "compile-time amount. So each wgmma's descriptor is one add on a per-tile base.")
    x0, y0, bw = 20, 66, 820 / 64
    c.rect(x0, y0, 820, 34, fill="panel2", stroke="stroke", rx=0)
    fields = ((0, 14, "start address >> 4", "tensor", 0.45), (16, 30, "leading offset >> 4", "tensor", 0.25),
              (32, 46, "stride offset >> 4", "skip", 0.6), (62, 64, "", "skip", 0.6))
    for lo, hi, name, fill, op in fields:
        c.rect(x0 + lo * bw, y0, (hi - lo) * bw, 34, fill=fill, stroke="stroke", opacity=op, rx=0)
        if name:
            c.text(x0 + (lo + hi) / 2 * bw, y0 + 22, name, size=12, anchor="middle", weight="600")
        c.text(x0 + lo * bw + 2, y0 - 5, str(lo), size=11, fill="muted")
    c.line(x0 + 32 * bw, y0 - 16, x0 + 32 * bw, y0 + 48, stroke="fg", sw=1.5, dash="4,3")
    c.text(x0 + 16 * bw, y0 + 56, "low word: per tile, once; + a constant per k-step", size=12, anchor="middle",
           fill="tensor", weight="600")
    c.text(x0 + 48 * bw, y0 + 56, "high word: one constant for Q, K, V and every step", size=12, anchor="middle",
           fill="muted", weight="600")

    def row(y, label, offsets, colour):
        c.text(20, y + 18, label, size=12, weight="600")
        w = min(78, 690 / len(offsets) - 4)
        for i, off in enumerate(offsets):
            box(c, 150 + i * (w + 4), y, w, 26, f"+{off >> 4}", fill=colour, stroke=colour, opacity=0.18, size=12)

    c.text(20, 152, f"Constants added to the tile's low word, k-step by k-step, in 16-byte units ({stage.block_n}-key "
                    "tiles, two 64-column boxes per operand):", size=12)
    row(164, "Q, QKᵀ step kk", q_off, "q")
    row(198, "K, QKᵀ step kk", k_off, "k")
    row(232, "V, PV step j", v_off, "v")
    c.text(20, 284, "Per wgmma, in the SASS:", size=12, weight="600")
    before = ["add offset", "shift >> 4", "mask 14 bits", "or the LBO", "move high", "(Q: R2UR ×2)"]
    for i, label in enumerate(before):
        box(c, 150 + i * 115, 296, 109, 28, label, fill="skip", stroke="stroke", opacity=0.5, size=12)
    c.text(20, 315, f"stage {stage.number - 1}", size=12)
    box(c, 150, 334, 520, 28, "add the constant to the tile's low word (high word: a constant register)",
        fill="tensor", stroke="tensor", opacity=0.2, size=12)
    c.text(20, 353, f"stage {stage.number}", size=12)
    c.text(20, 392, "Shared memory ends at 228 KB, below the 256 KB that 14 bits of (address >> 4) reach: the add "
                    "never carries into the leading byte offset.", size=12, fill="muted")
    return done(c, stage, "The offsets are computed from the tile shape; the arithmetic of the loop is unchanged, "
                          "only its address work shrinks.")


def register_p(stage, stages):
    t = facts.Tiles.of(stage)
    c = canvas("register-p", 240, "P stays in registers: wgmma RS instead of SS",
               "With SS both PV operands come from shared memory, so P must be written there first; with RS "
               "the A operand (P) comes from registers, saving the store, the fence and the read.")
    for row, (label, steps) in enumerate((
            ("SS (stage 08)", ["softmax → P (regs)", "st.shared P → smem", "fence.proxy.async", "wgmma SS"]),
            ("RS (this stage)", ["softmax → P (regs)", "pack to bf16x2", "wgmma RS"]))):
        y = 56 + row * 66
        c.text(12, y + 22, label, size=12, weight="600")
        for i, s in enumerate(steps):
            box(c, 140 + i * 172, y, 160, 34, s, fill="p", stroke="p", opacity=0.15 + 0.1 * i, size=12)
            if i:
                c.line(140 + i * 172 - 12, y + 17, 140 + i * 172 - 2, y + 17, stroke="p", arrow=True)
    c.text(12, 210, f"Saved per KV iteration: {fmt_bytes(t.p)} written to and read back from shared memory "
                    f"({stage.block_m}×{stage.block_n} bf16).", size=12)
    return done(c, stage, "The S accumulator layout of wgmma matches its A-from-registers layout once converted "
                          "to bf16.")


def two_consumers(stage, stages):
    t = facts.Tiles.of(stage)
    c = canvas("two-consumers", 260, "Two consumer warpgroups share each K/V tile",
               f"A CTA of {stage.block_m} query rows: warpgroup 0 runs rows 0–{stage.block_m // 2 - 1}, warpgroup 1 "
               f"rows {stage.block_m // 2}–{stage.block_m - 1}; both read the same K and V tiles in shared memory.")
    box(c, 20, 60, 240, 50, "warpgroup 0", fill="consumer", stroke="consumer", opacity=0.2,
        sub=f"rows 0–{stage.block_m // 2 - 1}")
    box(c, 20, 140, 240, 50, "warpgroup 1", fill="consumer2", stroke="consumer2", opacity=0.2,
        sub=f"rows {stage.block_m // 2}–{stage.block_m - 1}")
    box(c, 520, 60, 300, 50, "K tile (shared memory)", fill="k", stroke="k", opacity=0.25,
        sub=f"{stage.block_n}×{stage.head_dim} · {fmt_bytes(t.k)}")
    box(c, 520, 140, 300, 50, "V tile (shared memory)", fill="v", stroke="v", opacity=0.25,
        sub=f"{stage.block_n}×{stage.head_dim} · {fmt_bytes(t.v)}")
    for ya in (85, 165):
        for yb, col in ((85, "k"), (165, "v")):
            c.line(518, yb, 262, ya, stroke=col, sw=1.2, arrow=True)
    c.text(20, 228, f"L2 bytes per query row and iteration: {(t.k + t.v) / stage.block_m:.0f} B "
                    f"(vs {(t.k + t.v) / (stage.block_m // 2):.0f} B with one warpgroup per CTA).", size=12)
    return done(c, stage, "Doubling the rows per CTA halves the K/V traffic per unit of tensor-core work.")


def mbarrier_ring(stage, stages):
    ns = max(2, stage.kv_stages)
    iters = 3 * ns
    c = canvas("mbarrier-ring", 340, "The full/empty mbarrier ring and its phases",
               f"{ns} shared-memory slots, each with a full and an empty mbarrier. Tile k uses slot k mod "
               f"{ns} and waits for phase (k / {ns}) mod 2: the producer waits on empty, arms full with the "
               "byte count and issues TMA; consumers wait on full and arrive on empty when done.")
    sw = 150
    for s in range(ns):
        x = 40 + s * (sw + 30)
        box(c, x, 50, sw, 40, f"slot {s}", fill="k", stroke="k", opacity=0.25, sub="K and V tile")
        c.rect(x, 96, sw / 2 - 2, 22, fill="ok", stroke=None, opacity=0.5, rx=3)
        c.text(x + sw / 4, 112, "full", size=12, anchor="middle")
        c.rect(x + sw / 2 + 2, 96, sw / 2 - 2, 22, fill="bar", stroke=None, opacity=0.5, rx=3)
        c.text(x + 3 * sw / 4, 112, "empty", size=12, anchor="middle")
    y0 = 156
    c.text(20, y0, "tile k", size=12, weight="600")
    c.text(20, y0 + 22, "slot", size=12, fill="muted")
    c.text(20, y0 + 44, "parity", size=12, fill="muted")
    for k in range(iters):
        x = 120 + k * 56
        c.text(x, y0, str(k), size=12, anchor="middle", weight="600")
        c.text(x, y0 + 22, str(k % ns), size=12, anchor="middle")
        c.text(x, y0 + 44, str((k // ns) % 2), size=12, anchor="middle")
    c.lines(20, 236, ["producer: wait empty[s] (from the second round) → arrive.expect_tx full[s] → TMA into slot s",
                      "consumer: wait full[s] (parity) → wgmma on slot s → arrive empty[s]",
                      "the parity flips each time the ring wraps, so a wait never confuses a phase with the one "
                      "before"], size=12, leading=1.5)
    return done(c, stage, f"Stage {stage.id}'s ring: {ns} slots; its mbarriers: "
                          f"{', '.join(b.name for b in facts.barriers(stage)) or 'none'}.")


def _gemm_softmax_times(stage):
    """(one GEMM of one consumer warpgroup, its softmax) in seconds, at the H200's rates."""
    rows = stage.block_m // 2
    gemm = 2 * rows * stage.block_n * stage.head_dim / rates.TENSOR_FLOPS_SM
    softmax = max(rows * stage.block_n / rates.MUFU_PER_CLK,
                  (3 * rows * stage.block_n + rows * stage.head_dim) / rates.FMA_PER_CLK) / rates.CLOCK_HZ
    return gemm, softmax


def _schedule(order, gemm, softmax):
    """Place each warpgroup's QK, softmax and PV in the given turn order: the tensor cores run one GEMM
    at a time, a softmax follows its QK, a PV its softmax, a warpgroup's next QK its previous PV."""
    out, tc, done_at = [], 0.0, {}
    for kind, wg, t in order:
        if kind == "softmax":
            start = done_at[("QK", wg, t)]
            end = start + softmax
        else:
            need = done_at.get(("softmax", wg, t), 0.0) if kind == "PV" else done_at.get(("PV", wg, t - 1), 0.0)
            start = max(tc, need)
            end = tc = start + gemm
        done_at[(kind, wg, t)] = end
        out.append((kind, wg, t, start, end))
    return out


def _lanes(c, y0, events, x0, x1, end, labels, busy_lanes=(0, 1)):
    scale = (x1 - x0) / end
    colour = {"QK": "s", "softmax": "p", "PV": "o"}
    for wg, label in enumerate(labels):
        y = y0 + wg * 48
        c.text(12, y + 26, label, size=12, weight="600")
        c.rect(x0 - 4, y, x1 - x0 + 8, 40, fill="panel", stroke="grid", rx=4)
        for kind, w, t, s, e in events:
            if w != wg:
                continue
            sub = 0 if kind != "softmax" else 20
            c.rect(x0 + s * scale, y + 2 + sub, (e - s) * scale - 1, 17, fill=colour[kind], stroke="bg", rx=2,
                   opacity=0.9)
            label = f"{kind} {t}" if kind != "softmax" else f"softmax {t}"
            if text_width(label, 12, bold=True) < (e - s) * scale - 4:
                c.text(x0 + (s + e) / 2 * scale, y + 15 + sub, label, size=12, anchor="middle", fill="bg",
                       weight="600")
    y = y0 + len(labels) * 48
    c.text(12, y + 14, "tensor cores" if len(busy_lanes) > 1 else f"tensor cores ({labels[busy_lanes[0]]})",
           size=12, weight="600")
    busy = sorted((s, e) for kind, w, _t, s, e in events if kind != "softmax" and w in busy_lanes)
    for s, e in busy:
        c.rect(x0 + s * scale, y + 2, (e - s) * scale - 1, 14, fill="tensor", stroke=None, opacity=0.5, rx=1)
    idle = sum(max(0.0, b[0] - a[1]) for a, b in zip(busy, busy[1:]))
    return y + 30, idle / (busy[-1][1] - busy[0][0])


def pingpong(stage, stages):
    gemm, softmax = _gemm_softmax_times(stage)
    tiles = 3
    pp = []
    for t in range(tiles):
        pp += [("QK", 0, t), ("softmax", 0, t), ("QK", 1, t), ("softmax", 1, t), ("PV", 0, t), ("PV", 1, t)]
    ev_pp = _schedule(pp, gemm, softmax)
    c = canvas("pingpong", 330, "Pingpong: one warpgroup's softmax under the other's GEMMs",
               f"Two consumer warpgroups take turns at the tensor cores (named barriers pass the turn): while one "
               f"computes its softmax ({softmax * 1e6:.2f} µs per tile at MUFU and FMA rates), the other's GEMMs "
               f"({gemm * 1e6:.2f} µs each) run. Times at the H200's rates for {stage.block_m // 2} rows × "
               f"{stage.block_n} keys per warpgroup.")
    end = max(e[4] for e in ev_pp)
    y, idle = _lanes(c, 56, ev_pp, 150, 840, end, ["consumer 0", "consumer 1"])
    c.legend(12, y + 6, [("s", "S = QKᵀ"), ("p", "softmax"), ("o", "O += PV")], size=12)
    c.text(12, y + 30, f"Tensor cores idle {idle * 100:.0f} % of the span here; without a second warpgroup to fill "
                       f"them they would wait out every softmax ({softmax / (2 * gemm + softmax) * 100:.0f} % of a "
                       "tile).", size=12)
    c.text(12, y + 50, "Turn order: QK of 0, QK of 1, PV of 0, PV of 1, …: bar.sync on one named barrier, bar.arrive "
                       "on the other.", size=12, fill="muted")
    return done(c, stage, "Durations from the stage's tile sizes and the H200's rates; the FA3 paper's figure 1, "
                          "drawn for this kernel.")


def intra_overlap(stage, stages):
    gemm, softmax = _gemm_softmax_times(stage)
    c = canvas("intra-wg-overlap", 300, "Intra-warpgroup overlap: QK of the next tile and PV of this one around the softmax",
               "Within each consumer, the QK GEMM of tile t+1 and the PV GEMM of tile t are issued together, so the "
               "softmax of tile t+1 runs while its own PV is still on the tensor cores; the cost is registers for a "
               "second S tile.")
    tiles = 3
    x0, x1 = 190, 840
    seq = [("QK", 0)]
    for t in range(tiles):
        if t + 1 < tiles:
            seq.append(("QK", t + 1))
        seq.append(("PV", t))
    events, tc = [], 0.0
    soft_end = {}
    for kind, t in seq:
        need = soft_end.get(t, 0.0) if kind == "PV" else 0.0
        start = max(tc, need)
        events.append((kind, 0, t, start, start + gemm))
        tc = start + gemm
        if kind == "QK":
            s0 = max(tc, soft_end.get(t - 1, 0.0))
            soft_end[t] = s0 + softmax
            events.append(("softmax", 0, t, s0, s0 + softmax))
    plain, t0 = [], 0.0
    for t in range(tiles):
        plain += [("QK", 1, t, t0, t0 + gemm), ("softmax", 1, t, t0 + gemm, t0 + gemm + softmax),
                  ("PV", 1, t, t0 + gemm + softmax, t0 + 2 * gemm + softmax)]
        t0 += 2 * gemm + softmax
    end = max(e[4] for e in events + plain)
    y, _ = _lanes(c, 56, [(k, 0, t, s, e) for k, _w, t, s, e in events] + [(k, 1, t, s, e) for k, _w, t, s, e in plain],
                  x0, x1, end, ["overlapped", "in order"], busy_lanes=(0,))
    c.legend(12, y + 6, [("s", "S = QKᵀ"), ("p", "softmax"), ("o", "O += PV")], size=12)
    span_o = max(e[4] for e in events)
    span_p = max(e[4] for e in plain)
    c.text(12, y + 30, f"One warpgroup, {tiles} tiles: {span_o * 1e6:.2f} µs overlapped against {span_p * 1e6:.2f} µs "
                       "in order; the tensor cores wait only where a PV waits for its softmax.", size=12)
    return done(c, stage, "Durations from the stage's tile sizes and the H200's rates; with two consumers taking "
                          "turns (stage 12) the gaps fill further.")
