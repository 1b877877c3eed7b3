"""How dQ is summed: every key block adds its share to every query row's dQ.

The upper panel is the default path (facts.dq_path): the CTAs of one head's key blocks add their
block_m × head_dim partials into one fp32 accumulator in global memory, in whatever order they
arrive; the lower one is the deterministic mode (supports.deterministic), which sums in a fixed
order instead: a second pass that walks the key blocks in order and keeps dQ in registers, or
ordered additions. Numbers are the spec's (tiles, threads, the mechanism named by its engines and
tasks).
"""

from __future__ import annotations

from ..diagram import Diagram
from ..svg import Canvas, text_width, wrap
from . import facts

W = 860
BLOCKS = 4  # key blocks drawn


def _box(c, x, y, w, h, lines, colour, light=False):
    c.rect(x, y, w, h, fill="bg" if light else colour, stroke=colour, opacity=None if light else 0.2, rx=4, sw=1.3)
    for k, s in enumerate(lines):
        size = 12.0
        while text_width(s, size, bold=k == 0) > w - 6 and size > 11:
            size -= 0.5
        c.text(x + w / 2, y + h / 2 + 4 + (k - (len(lines) - 1) / 2) * 15, s, size=size, anchor="middle",
               weight="600" if k == 0 else None, fill="fg" if k == 0 else "muted")


def _para(c, y, text, size=12, fill="fg") -> float:
    for line in wrap(text, W - 24, size):
        c.text(12, y, line, size=size, fill=fill)
        y += 18
    return y


def signature(stage) -> str:
    return repr((facts.dq_path(stage), stage.block_m, stage.block_n, stage.head_dim, stage.deterministic,
                 _pass_keys(stage), [g.out_shown for g in facts.gemms(stage)]))


def dq_diagram(stage, stages) -> Diagram:
    did = f"b{stage.id}-dq"
    path = facts.dq_path(stage)
    n = stage.block_n
    title = f"Backward stage {stage.id}: how dQ is summed over the key blocks"
    desc = (f"Every key block of {n} keys adds its share dS K to the dQ of every query row. Backward stage "
            f"{stage.id} sums the shares "
            + (f"with {path.mechanism} into an fp32 accumulator in global memory ({path.per_cta:,} additions per CTA "
               f"per query block), in the order the CTAs arrive" if path.atomic else "in registers")
            + (f"; its deterministic mode sums them in a fixed order ({path.deterministic})." if path.deterministic
               else "; it has no deterministic mode."))
    c = Canvas(did, W, 900, title, desc)
    c.heading(f"{stage.id} · backward", ": how the key blocks' shares of dQ are summed")
    y = 50
    if path.atomic:
        y = _atomics(c, stage, path, y)
    else:
        y = _in_registers(c, stage, y, "dQ is summed in registers", "the CTA of a query block walks the key blocks")
    if path.deterministic:
        y += 14
        c.line(12, y - 8, W - 12, y - 8, stroke="grid", sw=1)
        if path.deterministic == "second pass" and path.atomic:
            step = _pass_keys(stage)
            walk = "the key blocks in order" if step == n else f"the keys in order, {step} a step"
            y = _in_registers(c, stage, y + 12, "Deterministic mode: a second pass, no atomics",
                              f"the main kernel computes dK and dV only; a CTA per query block then walks {walk}",
                              step)
            main = {g.kind: g.out_shown for g in facts.gemms(stage)}
            y = _para(c, y + 4, f"Tensor work per (query block, key block): the main kernel's {main['qk']}, "
                                f"{main['dp']}, dV and dK (4 GEMMs) and the pass's S, dP and dQ (3), 7 of "
                                f"{facts.gemm_flops(stage) / 1e6:.2f} MFLOP against the default's 5, and every "
                                "addition in the same order on every run.")
        elif path.deterministic == "ordered":
            y = _para(c, y + 12, "Deterministic mode: the key blocks add their shares in their order, each waiting "
                                 "for the one before it, so the sum is the same on every run.", size=13)
    else:
        y = _para(c, y + 8, "No deterministic mode at this stage: the sum's order is the CTAs' arrival order.",
                  fill="muted")
    c.height = height = int(y + 6)
    cap = ((f"Default: {path.mechanism} into an fp32 accumulator, {path.adds_label} per query "
            "block, in arrival order (dQ differs in its last bits from run to run). ") if path.atomic else
           "dQ is summed in registers. ")
    if path.deterministic == "second pass":
        cap += "With `deterministic=True` a second pass walks the key blocks in order instead: no atomics, more GEMMs."
    elif path.deterministic:
        cap += "With `deterministic=True` the additions are ordered."
    return Diagram(did, title, "dq", stage.number, c.tostring(), cap.strip(), W, height, signature(stage))


def _atomics(c, stage, path, y) -> float:
    m, n, d = stage.block_m, stage.block_n, stage.head_dim
    c.text(12, y + 8, f"Default: every key block adds into one fp32 accumulator ({path.mechanism})", size=13,
           weight="700")
    top = y + 40
    bh, gap = 38, 10
    x0, bw = 12, 176
    acc_x, acc_w = 410, 210
    conv_x, conv_w = 690, 158
    for j in range(BLOCKS):
        by = top + j * (bh + gap)
        _box(c, x0, by, bw, bh, (f"CTA of keys {j * n}–{(j + 1) * n - 1}", f"dS K: {m}×{d} fp32 partial"), "k")
    mid = top + (BLOCKS * (bh + gap) - gap) / 2
    acc_h = 74
    acc_y = mid - acc_h / 2
    for j in range(BLOCKS):
        ym = top + j * (bh + gap) + bh / 2
        yt = acc_y + 14 + j * (acc_h - 28) / (BLOCKS - 1)
        c.line(x0 + bw + 2, ym, acc_x - 3, yt, stroke="bar", sw=1.5, arrow=True)
    c.text((x0 + bw + acc_x) / 2, top - 8, f"{path.mechanism}: {path.adds_label}", size=12,
           anchor="middle", weight="600")
    _box(c, acc_x, acc_y, acc_w, acc_h, ("dQ accumulator, fp32", f"query rows q0 … q0+{m - 1}, one head",
                                         f"{d} × 4 B per row, global memory"), "bar")
    c.line(acc_x + acc_w + 2, mid, conv_x - 3, mid, stroke="bar", sw=1.5, arrow=True)
    c.text((acc_x + acc_w + conv_x) / 2, mid - 8, "then", size=12, anchor="middle", fill="muted")
    _box(c, conv_x, mid - 26, conv_w, 52, ("dQ = scale · acc.", "rounded to bf16"), "q", light=True)
    y = top + BLOCKS * (bh + gap) + 14
    y = _para(c, y, f"{path.per_cta:,} floats added per CTA per query block ({m} rows × {d}), {path.adds_label}; "
                    "every key block of the head adds into the same rows, in whatever order the CTAs arrive, "
                    "so the last bits of dQ can differ from run to run.")
    return y


def _pass_keys(stage) -> int:
    """Keys per step of the deterministic dQ pass ([diagram] dq_pass_keys; left out: block_n)."""
    return stage.diagram.dq_pass_keys or stage.block_n


def _in_registers(c, stage, y, head, sub, n=None) -> float:
    m, d = stage.block_m, stage.head_dim
    n = n or stage.block_n
    c.text(12, y + 8, head, size=13, weight="700")
    c.text(12, y + 28, sub, size=12, fill="muted")
    top = y + 44
    bh = 52
    x = 12
    _box(c, x, top, 164, bh, (f"CTA of query rows 0–{m - 1}", f"dQ: {m}×{d} fp32 in registers"), "q")
    x += 164
    step_w, gap = 108, 16
    for j in range(BLOCKS):
        c.line(x + 2, top + bh / 2, x + gap - 3, top + bh / 2, stroke="q", sw=1.5, arrow=True)
        x += gap
        last = j == BLOCKS - 1
        _box(c, x, top, step_w, bh, (f"keys {j * n}–{(j + 1) * n - 1}" if not last else "… last keys",
                                     "S, dP, dS again", "dQ += dS K"), "k")
        x += step_w
    c.line(x + 2, top + bh / 2, x + gap - 3, top + bh / 2, stroke="q", sw=1.5, arrow=True)
    x += gap
    _box(c, x, top, W - 12 - x, bh, ("dQ, bf16", "st.global once"), "q", light=True)
    return top + bh + 26
