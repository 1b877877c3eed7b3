"""The tile of each head dim (stage 24 on): per ``HeadDimTile<D>`` specialisation of the stage's
kernel.cu, its CTA tile (query rows × keys, drawn to scale), consumer warpgroups and their
setmaxnreg budget, the rings' buffers, where O is staged, the shared memory it takes of the 227 KB
a block may have (Q, K, V, O's staging, barriers) and a consumer thread's accumulators (O, S, P)
of its register budget. Every number is the kernel's own constexpr, evaluated by
hopattn.lineage's Stage.constants(head_dim); a kernel without the specialisations raises.
"""

from __future__ import annotations

from .concepts.common import canvas, done
from .svg import fmt_bytes, text_width

SMEM_LIMIT = 227 * 1024  # a block's shared memory on sm_90
KEYS = ("HEAD_DIM", "HEAD_DIM_V", "CONSUMERS", "BLOCK_M", "BLOCK_N", "KV_STAGES", "Q_STAGES", "O_BUFFERS",
        "PRODUCER_REGS", "CONSUMER_REGS", "SMEM_BYTES", "Q_TILE_BYTES", "K_TILE_BYTES", "V_TILE_BYTES",
        "O_STAGING_BYTES", "O_REGS", "S_REGS", "P_REGS")


class HeadDimError(ValueError):
    """kernel.cu has no tile per head dim, or a tile lacks a number the figure draws."""


def tiles(stage) -> list[dict]:
    """The numbers of each HeadDimTile<D> of the stage's kernel.cu, in order of head dim."""
    dims = stage.tile_head_dims()
    if not dims:
        raise HeadDimError(f"{stage.kernel_path}: no HeadDimTile<D> specialisations")
    out = []
    for d in sorted(dims):
        c = stage.constants(d)
        missing = [k for k in KEYS if k not in c]
        if missing:
            raise HeadDimError(f"{stage.kernel_path}: HeadDimTile<{d}>: {', '.join(missing)} not found as constexpr")
        out.append({k: c[k] for k in KEYS})
    return out


def kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB"


def head_dim_tiles(stage, stages):
    rows = tiles(stage)
    drawn = stage.head_dim
    row_h, top = 98, 76
    height = top + row_h * len(rows) + 80
    c = canvas("head-dim-tiles", height, "The tile of each head dim (kernel.cu's HeadDimTile<D>)",
               "One row per head dim the stage serves: the CTA tile (query rows by keys, to scale), its consumer "
               "warpgroups and their registers, the K/V and Q buffers and where O is staged, the shared memory "
               "of 227 KB it takes and a consumer thread's O, S and P accumulators of its register budget. "
               + "; ".join(f"head dim {r['HEAD_DIM']}: {r['BLOCK_M']} x {r['BLOCK_N']}, {r['CONSUMERS']} consumers "
                           f"of {r['CONSUMER_REGS']} registers, {kib(r['SMEM_BYTES'])}" for r in rows) + ".")
    c.text(12, 42, f"Every number read from the stage's kernel.cu; the other figures of this page draw head dim {drawn} "
                   f"(HeadDimTile<{drawn}>).", size=12, fill="muted")
    # column heads
    xs = {"dim": 12, "tile": 136, "roles": 250, "smem": 520, "end": 848}
    y = 64
    for key, label in (("dim", "head dim"), ("tile", "CTA tile"), ("roles", "consumers, buffers"),
                       ("smem", "shared memory (of 227 KB) · a consumer's registers")):
        c.text(xs[key], y, label, size=12, weight="600", fill="muted")
    bar_w = xs["end"] - xs["smem"]
    scale = 0.42  # px per row or key of the CTA tile
    for i, r in enumerate(rows):
        y = top + i * row_h
        hl = r["HEAD_DIM"] == drawn
        if hl:
            c.rect(6, y - 4, 848, row_h - 6, fill="panel2", stroke="stroke", rx=6)
        dv = "" if r["HEAD_DIM_V"] == r["HEAD_DIM"] else f"V {r['HEAD_DIM_V']}"
        c.text(xs["dim"], y + 24, str(r["HEAD_DIM"]), size=20, weight="600")
        c.text(xs["dim"] + 4 + text_width(str(r["HEAD_DIM"]), 20, bold=True), y + 24, dv, size=12, fill="muted")
        c.text(xs["dim"], y + 42, f"HeadDimTile<{r['HEAD_DIM']}>", size=12, mono=True, fill="muted")
        if hl:
            c.text(xs["dim"], y + 58, "drawn on this page", size=12, fill="accent")
        tw, th = r["BLOCK_N"] * scale, r["BLOCK_M"] * scale
        c.rect(xs["tile"], y + 4, tw, th, fill="s", stroke="s", opacity=0.2, rx=2)
        for k in range(1, r["CONSUMERS"]):
            c.line(xs["tile"], y + 4 + k * th / r["CONSUMERS"], xs["tile"] + tw, y + 4 + k * th / r["CONSUMERS"],
                   stroke="s", dash="3 2")
        c.text(xs["tile"] + tw + 6, y + 18, f"{r['BLOCK_M']} ×", size=12, weight="600")
        c.text(xs["tile"] + tw + 6, y + 33, f"{r['BLOCK_N']}", size=12, weight="600")
        o_where = "O staged in the Q buffer" if r["O_BUFFERS"] == 0 else "O in a buffer of its own"
        c.text(xs["roles"], y + 16, f"{r['CONSUMERS']} consumers × {r['CONSUMER_REGS']} registers", size=12,
               weight="600")
        c.text(xs["roles"], y + 33, f"producer {r['PRODUCER_REGS']} · {r['BLOCK_M'] // r['CONSUMERS']} rows each",
               size=12, fill="muted")
        c.text(xs["roles"], y + 50, f"{r['KV_STAGES']} K/V buffers · {r['Q_STAGES']} Q buffer{'s' if r['Q_STAGES'] > 1 else ''}", size=12)
        c.text(xs["roles"], y + 67, o_where, size=12, fill="muted")
        # shared memory bar
        parts = [("q", "Q", r["Q_STAGES"] * r["Q_TILE_BYTES"]), ("k", "K", r["KV_STAGES"] * r["K_TILE_BYTES"]),
                 ("v", "V", r["KV_STAGES"] * r["V_TILE_BYTES"]), ("o", "O", r["O_STAGING_BYTES"])]
        rest = r["SMEM_BYTES"] - sum(p[2] for p in parts)
        x, by = xs["smem"], y + 6
        c.rect(x, by, bar_w, 20, fill="panel", stroke="stroke", rx=2)
        for col, name, n in parts:
            if not n:
                continue
            w = n / SMEM_LIMIT * bar_w
            c.rect(x, by, w, 20, fill=col, stroke=None, rx=0, opacity=0.9)
            if w > 30:
                c.text(x + w / 2, by + 14, f"{name} {n // 1024}", size=12, anchor="middle", fill="bg")
            x += w
        c.text(xs["smem"], by + 36, f"{kib(r['SMEM_BYTES'])} (barriers and tile ids {fmt_bytes(rest)})", size=12)
        # registers bar
        rx0, ry = xs["smem"], y + 50
        c.rect(rx0, ry, bar_w, 16, fill="panel", stroke="stroke", rx=2)
        x = rx0
        for col, name, n in (("o", "O", r["O_REGS"]), ("s", "S", r["S_REGS"]), ("p", "P", r["P_REGS"])):
            w = n / r["CONSUMER_REGS"] * bar_w
            c.rect(x, ry, w, 16, fill=col, stroke=None, rx=0, opacity=0.9)
            if w > 34:
                c.text(x + w / 2, ry + 12, f"{name} {n}", size=12, anchor="middle", fill="bg")
            x += w
        acc = r["O_REGS"] + r["S_REGS"] + r["P_REGS"]
        c.text(xs["end"], ry + 30, f"O + S + P = {r['O_REGS']} + {r['S_REGS']} + {r['P_REGS']} = {acc} of "
                                   f"{r['CONSUMER_REGS']} registers", size=12, anchor="end")
    y = top + len(rows) * row_h + 12
    c.legend(12, y + 12, [("q", "Q"), ("k", "K"), ("v", "V"), ("o", "O staging / O accumulators"),
                          ("s", "S (fp32 scores)"), ("p", "P (bf16x2)")], size=12)
    c.lines(12, y + 34, ["The CTA tile drawn to scale, its consumer warpgroups' rows split by dashes; a bar's full "
                         "width is 227 KB of shared memory,", "or the consumer's setmaxnreg budget."], size=12,
            leading=1.35, fill="muted")
    return done(c, stage, "The tile of each head dim, from kernel.cu's `HeadDimTile<D>` specialisations: the CTA's "
                          "query rows and keys, its consumer warpgroups and their registers, the buffers of each ring, "
                          f"where O is staged, and what fills the shared memory and a consumer's registers. The other "
                          f"figures of this page draw head dim {drawn}.")
