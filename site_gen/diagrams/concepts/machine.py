"""Figures of the Hopper machine model (docs/hopper.md): the chip, one SM, the memory hierarchy,
threads to warpgroups, and what one tile costs on one SM. Every number is the H200's (h200.py)."""

from __future__ import annotations

from .. import h200, rates
from ..svg import text_width
from .common import canvas, done_doc


def h200_chip(stages):
    rows, cols = 11, 12  # 132 SMs
    c = canvas("h200-chip", 390, "The H200: 132 SMs around one L2, HBM3e beside them",
               f"{h200.SMS} streaming multiprocessors at up to {h200.CLOCK_GHZ:.2f} GHz share one L2 cache of "
               f"{h200.L2} and {h200.HBM_GB} GB of HBM3e, {h200.HBM_TBS_DATASHEET} TB/s on the datasheet and "
               f"{h200.HBM_TBS_MEASURED:.2f} TB/s measured as a device-to-device copy. A CTA runs on one SM.")
    hx, hw = 12, 120
    for x in (hx, 860 - hx - hw):
        c.rect(x, 50, hw, 300, fill="warp", stroke="warp", opacity=0.16, rx=6)
        c.text(x + hw / 2, 180, "HBM3e", size=14, anchor="middle", weight="700")
        c.text(x + hw / 2, 200, f"{h200.HBM_GB} GB in all", size=12, anchor="middle", fill="muted")
    gx0, gx1 = hx + hw + 20, 860 - hx - hw - 20
    cell = (gx1 - gx0) / cols
    l2_y, l2_h = 50 + 5 * 24 + 8, 40
    for r in range(rows):
        y = 50 + r * 24 + (l2_h + 16 if r >= 5 else 0)
        for k in range(cols):
            n = r * cols + k
            c.rect(gx0 + k * cell + 1, y, cell - 2, 20, fill="tensor", stroke="tensor", opacity=0.18 if n else 0.55,
                   rx=2, sw=0.6)
    c.text(gx0 + cell / 2, 50 + 15, "SM", size=11, anchor="middle", weight="600")
    c.rect(gx0, l2_y, gx1 - gx0, l2_h, fill="accent", stroke="accent", opacity=0.25, rx=4)
    c.text((gx0 + gx1) / 2, l2_y + 17, f"L2 cache · {h200.L2} (torch reports 60 MB)", size=13, anchor="middle",
           weight="700")
    c.text((gx0 + gx1) / 2, l2_y + 33, "shared by every SM: where K and V are reused across CTAs", size=12,
           anchor="middle", fill="muted")
    y = 50 + rows * 24 + l2_h + 16 + 22
    c.text(gx0, y, f"{h200.SMS} SMs · up to {h200.CLOCK_GHZ:.2f} GHz · a CTA stays on one SM from start to end",
           size=12)
    c.text(gx0, y + 20, f"HBM3e: {h200.HBM_TBS_DATASHEET} TB/s datasheet, {h200.HBM_TBS_MEASURED:.2f} TB/s measured "
                        f"(about {h200.HBM_TBS_MEASURED * 1000 / h200.SMS:.0f} GB/s per SM)", size=12, fill="muted")
    c.height = int(y + 34)
    return done_doc(c, "The chip the numbers are measured on. The SMs in a row are only a picture of 132; "
                       "their physical arrangement (GPCs, TPCs) does not matter to the kernels.")


def sm_anatomy(stages):
    c = canvas("sm-anatomy", 430, "Inside one SM: four sub-partitions around shared memory",
               "An SM is four sub-partitions, each with a warp scheduler issuing one instruction per clock, a "
               "quarter of the register file (16K 32-bit registers), a tensor core, 32 FP32 lanes and a "
               "quarter of the MUFU; they share 256 KB of L1 / shared memory and the TMA unit.")
    w, gap, x0, y0 = 197, 10, 12, 48
    quarter = h200.REGISTERS // h200.SUBPARTITIONS
    for i in range(h200.SUBPARTITIONS):
        x = x0 + i * (w + gap)
        c.rect(x, y0, w, 236, fill="panel", stroke="stroke", rx=6)
        c.text(x + 10, y0 + 20, f"sub-partition {i}", size=13, weight="700")
        c.text(x + 10, y0 + 37, f"warps {i}, {i + 4}, {i + 8}, …", size=12, fill="muted")
        items = (("warp scheduler", "1 instruction / clock", "warp"),
                 ("registers", f"{quarter // 1024}K × 32 bit = {quarter * 4 // 1024} KB", "consumer"),
                 ("tensor core", "¼ of the SM's MMA rate", "tensor"),
                 ("FP32 lanes", f"{h200.FMA_PER_CLK // 4} FMA / clock", "s"),
                 ("MUFU", f"{h200.MUFU_PER_CLK // 4} ex2 / clock", "p"))
        for k, (name, what, colour) in enumerate(items):
            yy = y0 + 48 + k * 37
            c.rect(x + 8, yy, w - 16, 32, fill=colour, stroke=colour, opacity=0.18, rx=4)
            c.text(x + 16, yy + 14, name, size=12, weight="600")
            c.text(x + 16, yy + 28, what, size=12, fill="muted")
    y = y0 + 248
    c.rect(x0, y, 4 * w + 3 * gap, 52, fill="k", stroke="k", opacity=0.18, rx=6)
    c.text(x0 + 12, y + 21, f"L1 / shared memory · {h200.L1_SMEM_KIB} KB, up to {h200.SMEM_PER_SM_KIB} KB shared "
                            f"({h200.SMEM_PER_BLOCK_KIB} KB per CTA)", size=13, weight="700")
    c.text(x0 + 12, y + 40, f"{h200.SMEM_BANKS} banks × {h200.SMEM_BANK_BYTES} B: {h200.SMEM_BYTES_PER_CLK} B per "
                            "clock · the TMA unit copies tiles between it and global memory", size=12, fill="muted")
    y += 78
    per_sm = rates.TENSOR_FLOPS_SM / 1e12
    c.text(x0, y, f"Per SM: {h200.REGISTERS // 1024}K registers ({h200.REGISTERS * 4 // 1024} KB) · "
                  f"{h200.FMA_PER_CLK} FMA and {h200.MUFU_PER_CLK} ex2 per clock · {per_sm:.2f} TFLOP/s bf16 "
                  f"({h200.TENSOR_TFLOPS} / {h200.SMS}) · up to {h200.MAX_WARPS_PER_SM} warps resident",
           size=12)
    c.text(x0, y + 20, "Warp w runs on sub-partition w mod 4 (observed, relied upon): four consecutive warps, "
                       "a warpgroup, cover all four.", size=12, fill="muted")
    return done_doc(c, "What one SM has: the units the stages schedule. The rates are per clock at up to 1.98 GHz.")


def memory_hierarchy(stages):
    smem_tbs = h200.smem_tbs()
    levels = (
        ("Registers", f"{h200.REGISTERS * 4 // 1024} KB per SM", f"one thread: up to {h200.MAX_REGS_PER_THREAD} × 4 B",
         "read by every instruction", "consumer", 1),
        ("Shared memory", f"{h200.SMEM_PER_SM_KIB} KB per SM", f"one CTA: up to {h200.SMEM_PER_BLOCK_KIB} KB",
         f"{h200.SMEM_BYTES_PER_CLK} B/clock per SM, {smem_tbs:.1f} TB/s in all", "k", 2),
        ("L2 cache", h200.L2, "every SM", "not measured here; the model takes 2 × HBM", "accent", 3),
        ("HBM3e", f"{h200.HBM_GB} GB", "every SM",
         f"{h200.HBM_TBS_MEASURED:.2f} TB/s measured, {h200.HBM_TBS_DATASHEET} datasheet", "warp", 4),
    )
    c = canvas("memory-hierarchy", 332, "The memory hierarchy: size, who shares it, how fast",
               "Registers (256 KB per SM, private to a thread), shared memory (228 KB per SM, shared by a CTA, "
               f"128 B per clock per SM), the L2 cache ({h200.L2}, shared by every SM) and HBM3e "
               f"({h200.HBM_GB} GB, {h200.HBM_TBS_MEASURED:.2f} TB/s measured).")
    y = 52
    c.text(212, 44, "size", size=12, weight="600", fill="muted")
    c.text(410, 44, "shared by", size=12, weight="600", fill="muted")
    c.text(590, 44, "bandwidth", size=12, weight="600", fill="muted")
    for name, size, scope, bw, colour, k in levels:
        width = 150 + 10 * k
        c.rect(12, y, width, 50, fill=colour, stroke=colour, opacity=0.22, rx=5)
        c.text(22, y + 30, name, size=13, weight="700")
        c.text(212, y + 30, size, size=12)
        c.text(410, y + 30, scope, size=12)
        lines = _two_lines(bw, 250)
        for i, line in enumerate(lines):
            c.text(590, y + 30 + (i - (len(lines) - 1) / 2) * 16, line, size=12, fill="muted")
        y += 58
    c.text(12, y + 14, "Down the hierarchy: larger, shared by more, slower. Each stage of the lineage moves K and V "
                       "one level closer to the tensor cores or reuses them more.", size=12)
    return done_doc(c, "Where a tile can live. TMA moves tiles from global memory (L2, HBM) to shared memory; wgmma "
                       "reads shared memory directly; accumulators stay in registers.")


def _two_lines(s: str, width: float) -> list[str]:
    if text_width(s, 12) <= width or ", " not in s:
        return [s]
    a, b = s.split(", ", 1)
    return [a + ",", b]


def warpgroups(stages):
    stage = next((s for s in stages if len(s.roles) == 3), stages[-1])
    c = canvas("warpgroups", 322, "Threads, warps, warpgroups",
               f"The {stage.threads} threads of a stage {stage.id} CTA: warp = thread / 32, warpgroup = warp / 4. "
               "A warpgroup is four consecutive warps, one on each sub-partition; a wgmma with M = 64 gives warp r "
               "of the warpgroup rows 16r to 16r + 15 of the accumulator.")
    warps = stage.warps
    x0, bw = 12, (860 - 24) / warps
    c.text(x0, 48, f"{stage.threads} threads = {warps} warps of 32 = {warps // 4} warpgroups of 4 warps", size=12,
           weight="600")
    shade = (0.12, 0.28, 0.44, 0.6)  # one shade per sub-partition (not the operands' colours)
    for w in range(warps):
        x = x0 + w * bw
        c.rect(x + 1, 58, bw - 2, 30, fill="warp", stroke="warp", opacity=shade[w % 4], rx=3)
        c.text(x + bw / 2, 78, f"warp {w}", size=12, anchor="middle")
    for g in range(warps // 4):
        xa, xb = x0 + 4 * g * bw + 2, x0 + 4 * (g + 1) * bw - 2
        c.path([(xa, 94), (xa, 100), (xb, 100), (xb, 94)], stroke="stroke", sw=1.5)
        c.text((xa + xb) / 2, 116, f"warpgroup {g} · threads {128 * g}–{128 * g + 127}", size=12, anchor="middle")
    x = 12
    for k in range(4):
        c.rect(x, 130, 12, 12, fill="warp", stroke=None, opacity=shade[k], rx=2)
        label = f"sub-partition {k}"
        c.text(x + 17, 141, label, size=12, fill="muted")
        x += 17 + text_width(label, 12) + 18
    # The accumulator of one warpgroup's wgmma m64nN.
    n = stage.block_n
    ax, ay, aw, ah = 12, 182, 380, 128
    c.text(ax, ay - 8, f"one wgmma m64n{n}: the 64 × {n} accumulator of a warpgroup", size=12, weight="600")
    for r in range(4):
        c.rect(ax, ay + r * ah / 4, aw, ah / 4, fill="s", stroke="bg", opacity=0.12 + 0.08 * r, rx=0)
        c.text(ax + aw / 2, ay + r * ah / 4 + 21, f"rows {16 * r}–{16 * r + 15}: warp {r} of the warpgroup",
               size=12, anchor="middle")
    per_thread = 64 * n // 128
    c.lines(430, 202, [f"Each thread holds {per_thread} fp32 of it ({64 * n * 4 // 1024} KiB for the warpgroup):",
                       "two rows of its warp's 16, pairs of adjacent columns.",
                       "wgmma and setmaxnreg are issued by whole warpgroups,",
                       "so the roles of the later stages are warpgroups."], size=12, leading=1.5)
    return done_doc(c, f"Drawn for the CTA of stage {stage.id}; the warp-to-sub-partition mapping is observed "
                       "behaviour that Hopper kernels rely on.")


def tile_budget(stages):
    m = n = d = 128
    flops = 2 * 2 * m * n * d
    tensor = flops / rates.TENSOR_FLOPS_SM
    cublas = flops / (sum(h200.CUBLAS_TFLOPS) / 2 * 1e12 / h200.SMS)
    mufu = m * n / (h200.MUFU_PER_CLK * rates.CLOCK_HZ)
    fma = (3 * m * n + m * d) / (h200.FMA_PER_CLK * rates.CLOCK_HZ)
    kv = 2 * n * d * 2
    bars = (("tensor cores, datasheet rate", tensor, "tensor", f"{flops / 1e6:.1f} MFLOP"),
            ("tensor cores, cuBLAS rate", cublas, "tensor", f"{sum(h200.CUBLAS_TFLOPS) / 2:.0f} TFLOP/s"),
            ("MUFU: the exponentials", mufu, "p", f"{m * n:,} ex2 at 16 / clock"),
            ("FP32: scale, max, sum, rescale", fma, "s", "≈ 3 FMA per score + O rescale"))
    c = canvas("tile-budget", 300, "One 128 × 128 tile of S on one SM: where the time goes",
               f"At head dim {d}, one tile of S costs {flops / 1e6:.1f} MFLOP on the tensor cores "
               f"({tensor * 1e6:.2f} µs at the datasheet rate, {cublas * 1e6:.2f} µs at cuBLAS's), {m * n:,} "
               f"exponentials on the MUFU ({mufu * 1e6:.2f} µs) and a few FP32 instructions per score "
               f"(about {fma * 1e6:.2f} µs).")
    x0, x1, y = 250, 760, 56
    scale = (x1 - x0) / max(b[1] for b in bars)
    for label, t, colour, note in bars:
        c.text(x0 - 10, y + 17, label, size=12, anchor="end")
        c.rect(x0, y, t * scale, 24, fill=colour, stroke=colour, opacity=0.45, rx=3)
        c.text(x0 + t * scale + 8, y + 17, f"{t * 1e6:.2f} µs", size=12, weight="600")
        if text_width(note, 12) + 12 < t * scale:
            c.text(x0 + 6, y + 17, note, size=12)
        else:
            c.text(x0 + t * scale + 80, y + 17, note, size=12, fill="muted")
        y += 36
    c.text(12, y + 14, f"K and V in: 2 × {n * d * 2 // 1024} KiB = {kv // 1024} KiB per tile, "
                       f"{kv / cublas / 1e9:.0f} GB/s per SM at the cuBLAS rate, "
                       f"{kv / cublas * h200.SMS / 1e12:.1f} TB/s for {h200.SMS} SMs: more than HBM gives, "
                       "so they must come from L2.", size=12)
    c.text(12, y + 36, "The exponentials cost a third to a half of the GEMMs: run one after the other, the tensor "
                       "cores wait that long on every tile.", size=12, fill="muted")
    return done_doc(c, "The arithmetic of docs/hopper.md's last table, drawn: why the later stages overlap the "
                       "softmax with the GEMMs and keep K and V in L2.")
