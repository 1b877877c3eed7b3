"""Figures of the introduction (docs/introduction.md): what attention computes, why the naive way
is memory-bound, how the fused kernel tiles it, and the arithmetic intensity of each; and the
grouped-query heads of stage 20 and the deferred maximum of stage 21. Sizes are the 4k benchmark shape's (B 8, H 16, L 4096, D 128)."""

from __future__ import annotations

import math

from .. import h200
from ..svg import fmt_bytes, text_width
from .common import box, canvas, done, done_doc
from .sass_counts import DEFERRED_MAX

B, H, L, D = 8, 16, 4096, 128  # the 4k shape
MEASURED_TFLOPS = 680  # the practical GEMM rate docs/introduction.md uses


def _matrix(c, x, y, w, h, name, dims, colour, note=None, opacity=0.22):
    c.rect(x, y, w, h, fill=colour, stroke=colour, opacity=opacity, rx=3, sw=1.4)
    c.text(x + w / 2, y + h / 2 - (4 if note else -5), name, size=15, anchor="middle", weight="700")
    if note:
        c.text(x + w / 2, y + h / 2 + 14, note, size=12, anchor="middle", fill="muted")
    c.text(x + w / 2, y + h + 16, dims, size=12, anchor="middle", fill="muted")


def attention_shapes(stages):
    per_head_qkv = L * D * 2
    per_head_s = L * L * 2
    c = canvas("attention-shapes", 312, "What is computed, per batch element and head",
               f"S = τ Q Kᵀ is Lq × Lk; the softmax of each row gives P; O = P V is Lq × D like Q. At L = {L} and "
               f"D = {D}, Q, K, V and O are {fmt_bytes(per_head_qkv)} each per head in bf16 and S is "
               f"{fmt_bytes(per_head_s)}: quadratic in the sequence length while the inputs are linear in it.")
    y0 = 60
    _matrix(c, 12, y0, 44, 176, "Q", "Lq × D", "q", None)
    c.text(66, y0 + 96, "×", size=18, anchor="middle")
    _matrix(c, 78, y0, 176, 44, "Kᵀ", "D × Lk", "k")
    c.text(266, y0 + 96, "=", size=18, anchor="middle")
    _matrix(c, 280, y0, 176, 176, "S", "Lq × Lk", "s", f"{fmt_bytes(per_head_s)} per head")
    c.line(462, y0 + 88, 500, y0 + 88, stroke="p", sw=1.8, arrow=True)
    c.text(481, y0 + 78, "softmax", size=12, anchor="middle", fill="p", weight="600")
    c.text(481, y0 + 108, "per row", size=12, anchor="middle", fill="muted")
    _matrix(c, 506, y0, 176, 176, "P", "Lq × Lk", "p", "rows sum to 1")
    c.text(694, y0 + 96, "×", size=18, anchor="middle")
    _matrix(c, 706, y0, 44, 176, "V", "Lk × D", "v")
    c.text(762, y0 + 96, "=", size=18, anchor="middle")
    _matrix(c, 776, y0, 44, 176, "O", "Lq × D", "o")
    c.text(12, y0 + 218, f"At the 4k shape (L = {L}, D = {D}): Q, K, V, O {fmt_bytes(per_head_qkv)} each per head; "
                         f"S and P {fmt_bytes(per_head_s)} each, {L // D}× as large.", size=12)
    c.text(12, y0 + 240, f"{B} × {H} = {B * H} heads of that: {B * H * per_head_s / 1e9:.1f} GB for one pass over "
                         "S in bf16. The fused kernels never write it.", size=12, fill="muted")
    return done_doc(c, "The forward pass of attention for one (batch, head); drawn at D = 128, L not to scale.")


def naive_vs_fused(stages):
    elems = B * H * L * L
    naive_bytes = 4 * elems * 2  # write S, read S, write P, read P (bf16)
    fused_bytes = 4 * B * H * L * D * 2  # read Q, K, V, write O
    flops = 4 * B * H * L * L * D
    hbm = h200.HBM_TBS_MEASURED * 1e12
    rows = (("naive: 3 kernels", naive_bytes / hbm, flops / (MEASURED_TFLOPS * 1e12),
             f"{naive_bytes / 1e9:.1f} GB of S and P"),
            ("fused: S stays on chip", fused_bytes / hbm, flops / (MEASURED_TFLOPS * 1e12),
             f"{fused_bytes / 1e9:.2f} GB: Q, K, V, O"))
    c = canvas("naive-vs-fused", 246, "Moving S and P through HBM takes longer than the matmuls",
               f"At the 4k shape (B {B}, H {H}, L {L}): the naive version writes and reads S and P, "
               f"{naive_bytes / 1e9:.1f} GB, {naive_bytes / hbm * 1e3:.2f} ms at {h200.HBM_TBS_MEASURED:.2f} TB/s, "
               f"against {flops / (MEASURED_TFLOPS * 1e12) * 1e3:.2f} ms of matmuls at {MEASURED_TFLOPS} TFLOP/s; "
               f"the fused kernel moves {fused_bytes / 1e9:.2f} GB.")
    x0, x1 = 200, 800
    scale = (x1 - x0) / max(max(r[1], r[2]) for r in rows)
    y = 56
    for label, mem, comp, what in rows:
        c.text(12, y + 30, label, size=13, weight="700")
        c.rect(x0, y, mem * scale, 22, fill="warp", stroke="warp", opacity=0.4, rx=3)
        label = f"HBM traffic: {what}"
        if text_width(label, 12) + 12 <= mem * scale:
            c.text(x0 + 6, y + 16, label, size=12)
            c.text(x0 + mem * scale + 8, y + 16, f"{mem * 1e3:.2f} ms", size=12, weight="600")
        else:
            c.text(x0 + mem * scale + 8, y + 16, f"{mem * 1e3:.2f} ms", size=12, weight="600")
            c.text(x0 + mem * scale + 64, y + 16, label, size=12)
        c.rect(x0, y + 28, comp * scale, 22, fill="tensor", stroke="tensor", opacity=0.4, rx=3)
        c.text(x0 + 6, y + 44, f"matmuls: {flops / 1e12:.2f} TFLOP", size=12)
        c.text(x0 + comp * scale + 8, y + 44, f"{comp * 1e3:.2f} ms", size=12, weight="600")
        y += 76
    c.text(12, y + 10, f"Times at {h200.HBM_TBS_MEASURED:.2f} TB/s (measured copy) and {MEASURED_TFLOPS} TFLOP/s "
                       "(measured GEMM); the two can overlap, so the larger one bounds the kernel.", size=12,
           fill="muted")
    return done_doc(c, "The table of the introduction's section on the naive implementation, drawn to scale.")


def intensity(stages):
    naive = 4 * D / 8
    balance = MEASURED_TFLOPS / h200.HBM_TBS_MEASURED
    datasheet = h200.TENSOR_TFLOPS / h200.HBM_TBS_DATASHEET
    fused = [(f"fused, L = {n}", n / 2) for n in (4096, 8192, 16384)]
    bars = [("naive: S and P through HBM", naive, "warp")] + [(lbl, v, "tensor") for lbl, v in fused]
    c = canvas("intensity", 300, "Arithmetic intensity against the machine balance",
               f"FLOP per byte of HBM traffic: the naive version reaches at most 4D / 8 B = {naive:.0f}; the fused "
               f"kernel L / 2 ({', '.join(f'{v:.0f}' for _, v in fused)} at 4k, 8k, 16k). The H200 balances "
               f"tensor cores and HBM at {balance:.0f} FLOP/B measured ({datasheet:.0f} on the datasheet).")
    x0, x1 = 250, 820
    lo, hi = math.log10(10), math.log10(20000)

    def x(v):
        return x0 + (x1 - x0) * (math.log10(v) - lo) / (hi - lo)
    y = 56
    for tick in (10, 100, 1000, 10000):
        c.line(x(tick), y - 6, x(tick), y + 4 * 36 + 4, stroke="grid")
        c.text(x(tick), y + 4 * 36 + 20, f"{tick:,}", size=12, anchor="middle", fill="muted")
    for label, v, colour in bars:
        c.text(x0 - 10, y + 17, label, size=12, anchor="end")
        c.rect(x0, y, x(v) - x0, 24, fill=colour, stroke=colour, opacity=0.4, rx=3)
        c.text(x(v) + 6, y + 17, f"{v:,.0f}", size=12, weight="600")
        y += 36
    for v, dash in ((balance, "6 3"), (datasheet, "2 3")):
        c.line(x(v), 48, x(v), y + 2, stroke="bar", sw=1.6, dash=dash)
    c.text(x(balance) - 4, 46, f"machine balance {balance:.0f} (measured)", size=12, anchor="end", fill="bar")
    c.text(x(datasheet) + 4, 46, f"{datasheet:.0f} (datasheet)", size=12, fill="bar")
    c.text(12, y + 40, "FLOP per byte, log scale. Left of the balance a kernel waits on memory; right of it, on the "
                       "tensor cores.", size=12, fill="muted")
    return done_doc(c, "Why the fused kernel is compute-bound and the naive one is not.")


def tiling(stages):
    stage = next((s for s in stages if s.number == 16), stages[-1])
    bm, bn = stage.block_m, stage.block_n
    nq, nk = 6, 8
    cell = 40
    c = canvas("tiling", 400, "The fused kernel: one CTA per query tile, K and V streamed through",
               f"The score matrix of one head cut into tiles of {bm} query rows × {bn} keys. A CTA owns one row of "
               "tiles: it keeps its Q tile, and for each K/V tile in turn computes that tile of S, updates the "
               "running softmax and accumulates O, all on chip. The grid covers query tiles × heads × batch.")
    x0, y0 = 150, 110
    c.text(x0, y0 - 52, "K and V tiles, one per iteration →", size=12, fill="muted")
    for j in range(nk):
        c.rect(x0 + j * cell + 2, y0 - 40, cell - 4, 28, fill="k", stroke="k", opacity=0.35, rx=3)
        c.text(x0 + j * cell + cell / 2, y0 - 21, f"K{j}", size=12, anchor="middle")
    for i in range(nq):
        c.rect(x0 - 52, y0 + i * cell + 2, 40, cell - 4, fill="q", stroke="q", opacity=0.35 if i != 2 else 0.7, rx=3)
        c.text(x0 - 32, y0 + i * cell + 25, f"Q{i}", size=12, anchor="middle", weight="600" if i == 2 else None)
        for j in range(nk):
            mine = i == 2
            c.rect(x0 + j * cell + 1, y0 + i * cell + 1, cell - 2, cell - 2, fill="s", stroke="bg",
                   opacity=0.55 if mine else 0.12, rx=2)
    c.text(x0 - 60, y0 + 2 * cell + 25, "CTA →", size=12, anchor="end", weight="600")
    c.line(x0, y0 + 2 * cell + cell + 10, x0 + nk * cell - 4, y0 + 2 * cell + cell + 10, stroke="s", sw=1.6,
           arrow=True)
    c.text(x0, y0 + nq * cell + 22, f"S of one head: {nq} × {nk} tiles drawn; at L = 4096: {4096 // bm} × "
                                    f"{4096 // bn}", size=12, fill="muted")
    tx = x0 + nk * cell + 40
    c.text(tx, y0 - 20, "one CTA, one query tile:", size=13, weight="700")
    c.lines(tx, y0 + 4, [f"Q tile: {bm} × {stage.head_dim}, loaded once",
                         f"per iteration t: K_t, V_t ({bn} keys each)",
                         f"  S_t = Q K_tᵀ   ({bm} × {bn}, in registers)",
                         "  m, ℓ updated; P_t = exp(S_t − m)",
                         f"  O += P_t V_t   ({bm} × {stage.head_dim}, in registers)",
                         "after the last tile: O / ℓ to memory",
                         "",
                         f"grid: {4096 // bm} query tiles × H × B CTAs",
                         "at 4k, 8k and 16k alike: 4096 tiles"], size=12, leading=1.55)
    return done_doc(c, f"Tile sizes of stage {stage.id} ({bm} × {bn}); stage 01 starts with 128 × 64.")


def gqa_heads(stage, stages):
    hq, hkv = 32, 8  # the 8k-gqa benchmark shape: Llama-3-8B's 32 query heads over 8 K/V heads
    group = hq // hkv
    c = canvas("gqa-heads", 330, "Grouped-query heads: K and V read in place, once per group from L2",
               f"With {hq} query heads over {hkv} K/V heads, query head h reads K/V head h / {group}. The CTAs of "
               f"the {group} query heads of a group read the same K and V tiles; the grid orders them close in "
               "time, so the tiles come from L2 and no repeated copy of K and V is made. The epilogue can also "
               "write the log-sum-exp of every row.")
    x0, w = 60, (860 - 72) / hq
    c.text(12, 70, "Q", size=14, weight="700", fill="q")
    c.text(12, 186, "K, V", size=14, weight="700", fill="k")
    for h in range(hq):
        x = x0 + h * w
        g = h // group
        c.rect(x + 1, 52, w - 2, 28, fill="q", stroke="q", opacity=0.2 + 0.12 * (h % group), rx=2)
        if h % 4 == 0:
            c.text(x + w / 2, 46, str(h), size=12, anchor="middle", fill="muted")
        c.line(x + w / 2, 82, x0 + (g + 0.5) * group * w, 166, stroke="stroke", sw=0.8)
    for g in range(hkv):
        x = x0 + g * group * w
        c.rect(x + 3, 168, group * w - 6, 30, fill="k", stroke="k", opacity=0.3, rx=3)
        c.text(x + group * w / 2, 188, f"K/V head {g}", size=12, anchor="middle")
    c.text(x0, 222, f"query heads {', '.join(f'{group * g}–{group * g + group - 1}' for g in range(3))}, … share "
                    f"K/V heads 0, 1, 2, …: h / {group}", size=12)
    c.text(x0, 244, f"one K tile of a group: read by {group} CTAs, from HBM once, then from L2", size=12, fill="muted")
    c.text(x0, 276, "LSE (log-sum-exp) per query row: m + log ℓ, fp32, −∞ for a row that sees no key", size=12)
    c.text(x0, 298, f"drawn for the 8k-gqa benchmark shape (Hq {hq}, Hkv {hkv}, Llama-3-8B's heads)", size=12,
           fill="muted")
    return done(c, stage, "No copy of K and V for grouped-query attention: the kernel maps each query head to its "
                          "K/V head when it builds the tensor maps' coordinates.")



def deferred_max(stage, stages):
    """Stage 21's softmax path after the QK's completion, beside stage 20's: the instructions from the
    QK's wait to the first exponential and per iteration as the SASS counts them (sass_counts.py,
    checked by tests/test_concept_sass.py); the exponentials and row sums from the tile shape
    (block_n / 2 scores per thread, two rows of them)."""
    before, after = DEFERRED_MAX["20"], DEFERRED_MAX["21"]
    b, a = before["to_first_exp"], after["to_first_exp"]
    lead_b, lead_a = sum(b.values()), sum(a.values())  # the QK's wait to the first MUFU.EX2
    saved = before["per_iteration"] - after["per_iteration"]
    scores = stage.block_n * 64 // 128  # per thread: a warpgroup's 64 x block_n scores over 128 threads
    expo = 3 * scores  # per score an FFMA, a MUFU.EX2 and the row sum's FADD
    check = 4  # two FSETP, the vote, the branch
    c = canvas("deferred-max", 386, "The softmax's path from the QK's completion: the maximum deferred",
               f"Per thread and K/V tile ({scores} scores, two rows): stage {stage.number - 1} finds the tile's row "
               f"maxima and votes on their growth before the first exponential, {lead_b} instructions after the "
               f"QK's wait; this stage takes the exponentials against the row's reference at once ({lead_a} "
               f"instructions after the wait) and checks them with the row sums it computes anyway: "
               f"{before['per_iteration']} instructions an iteration become {after['per_iteration']}.")
    x0, px = 150, 690 / (lead_b + expo)

    def seg(x, y, n, label, fill, opacity=0.22, sub=None):
        box(c, x, y, n * px, 40, label, fill=fill, stroke=fill, opacity=opacity, size=12, sub=sub)
        return x + n * px

    def first_exp(x, y, note):
        c.line(x, y - 8, x, y + 48, stroke="fg", sw=1.5, dash="4,3")
        c.text(x + 4, y - 12, note, size=11, fill="muted")

    y = 74
    c.text(12, y + 18, f"stage {stage.number - 1}", size=12, weight="600")
    c.text(12, y + 34, "every tile", size=11, fill="muted")
    x = seg(x0, y, b["maxima"], "row maxima", "skip", 0.6, "FMNMX, then across the quad")
    vote_x = x
    x = seg(x, y, b["test"], "", "bar", 0.25)
    x = seg(x, y, b["other"], "", "stroke", 0.2)
    c.text(vote_x, y + 56, f"{b['maxima']} row maxima, {b['test']} growth test and vote, {b['other']} more", size=11,
           fill="muted")
    first_exp(x, y, f"first exponential: {lead_b} instructions after the QK's wait")
    seg(x, y, expo, "exponentials and row sums", "softmax", sub=f"{scores} FFMA + {scores} MUFU.EX2 + {scores} FADD")
    y = 174
    c.text(12, y + 18, f"stage {stage.number}", size=12, weight="600")
    c.text(12, y + 34, "unmasked tile", size=11, fill="muted")
    x = seg(x0, y, lead_a, "", "stroke", 0.2)
    first_exp(x, y, f"first exponential: {lead_a} after the wait")
    x = seg(x, y, expo, "exponentials and row sums", "softmax", sub="against the row's reference")
    x = seg(x, y, check, "", "ok", 0.5)
    c.text(x + 6, y + 18, "check: sum ≤ 2²⁴?", size=12, weight="600", fill="ok")
    c.text(x + 6, y + 34, "2 FSETP, a vote", size=11, fill="muted")
    c.text(x0 + 690, y - 12, f"{before['per_iteration']} → {after['per_iteration']} instructions an iteration: "
                             f"{saved} fewer, all of them before the first exponential", size=12, anchor="end")
    y = 290
    c.text(12, y + 18, "rare paths", size=12, weight="600")
    c.text(12, y + 34, "per warp", size=11, fill="muted")
    box(c, x0, y, 330, 44, "sum > 2²⁴: rebase the row", fill="accent", stroke="accent", opacity=0.2, size=12,
        sub="× 2⁻ᵏ on P, the sum and O; the reference + k")
    box(c, x0 + 350, y, 340, 44, "sum ∞ or NaN: scores recomputed", fill="bar", stroke="bar", opacity=0.15, size=12,
        sub="mma.sync from Q and K in shared memory, exact path")
    c.line(x - 2 * px, 216, x0 + 165, y - 2, stroke="stroke", arrow=True)
    c.line(x - 2 * px, 216, x0 + 520, y - 2, stroke="stroke", arrow=True)
    c.text(x0, y + 68, "Masked tiles and each output tile's first K/V tile keep the exact path; K is released "
                       "after the check.", size=12, fill="muted")
    return done(c, stage, "The row maxima only keep the exponentials in range; the row sums, which bound every "
                          "exponential, say afterwards whether they stayed in it. The instruction counts are the "
                          "SASS's (nvcc 13.0, the non-causal kernel's unmasked loop, the common path).")
