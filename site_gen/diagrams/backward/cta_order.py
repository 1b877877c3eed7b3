"""The order the causal CTAs start in (``[launch] cta_order = "heavy-first"``, backward stage 10 on).

The causal backward's grid is (key blocks, K/V heads, batch): a CTA per key block of block_n keys
of a (K/V head, batch) pair, whose loop walks the query blocks that see its keys — from the first
one (bottom-right aligned, as the kernel's first_query_block) to the last — for each query head of
the K/V head's group. Key block 0 so has the most steps and the last the fewest. The hardware
starts the CTAs in their linear order, blockIdx.x fastest, each on an SM as one frees up.

The figure is a model of that: every CTA a box as long as its steps (query blocks × group), placed
by greedy list scheduling in start order (a CTA starts on the first SM that frees up; one CTA per
SM; every step costs the same), for the blockIdx order (stage 09 and before) and for the
heavy-first one (cta_tile() of the stage's kernel.cu), on one time axis, at an example small
enough to read: its sizes are EXAMPLE's, the window's waves the kernel's WINDOW_WAVES.

heavy_first_order mirrors cta_tile()'s index arithmetic line by line; tests/test_backward_cta_order.py
checks it against a transcription of the CUDA source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..concepts.scheduling import lpt
from ..diagram import Diagram
from ..svg import Canvas, text_width, wrap

W = 860
LEFT = 12
X0 = 64  # the time axis' origin (the SM labels left of it)
X1 = W - 112  # the longest makespan (its label right of it)
ROW_H, ROW_GAP = 22, 4
CELL_H = 20
PAIR_COLOURS = ("q", "k", "v", "s", "p", "o", "store", "consumer2")
H200_SMS = 132
WINDOW_WAVES_RE = re.compile(r"constexpr\s+int\s+WINDOW_WAVES\s*=\s*(\d+)\s*;")


@dataclass(frozen=True)
class Example:
    """The grid drawn: batch × kv_heads pairs, a causal sequence of key_blocks · block_n, on sms SMs."""

    sms: int = 8
    key_blocks: int = 6
    kv_heads: int = 5
    batch: int = 1
    group: int = 4  # query heads per K/V head (Llama-3.1-8B's 32 / 8)

    @property
    def pairs(self) -> int:
        return self.kv_heads * self.batch


EXAMPLE = Example()
# Llama-3.1-8B's backward at 8k causal, batch 1: 64 key blocks x 8 pairs = 512 CTAs on the H200's SMs.
LLAMA = Example(sms=H200_SMS, key_blocks=64, kv_heads=8, batch=1, group=4)


# --- the orders and the model --------------------------------------------------------------------


def window_waves(stage) -> int:
    """WINDOW_WAVES of the stage's kernel.cu: how many waves of CTAs a window of pairs fills."""
    found = WINDOW_WAVES_RE.search(stage.kernel_path.read_text())
    if not found:
        raise ValueError(f"{stage.kernel_path}: no `constexpr int WINDOW_WAVES = N;` (cta_order = "
                         f"{stage.cta_order!r} needs it)")
    return int(found.group(1))


def window_size(key_blocks: int, pairs: int, sms: int, window_waves: int) -> int:
    """cta_tile()'s window: enough pairs that their key blocks fill window_waves waves of the SMs."""
    return min(pairs, max(1, (window_waves * sms + key_blocks - 1) // key_blocks))


def heavy_first_order(key_blocks: int, pairs: int, sms: int, window_waves: int) -> list[tuple[int, int]]:
    """(key block, pair) of each linear CTA index in turn, as cta_tile() maps it; a pair is
    kv_head + kv_heads · batch (cta_tile's pair % gridDim.y, pair / gridDim.y)."""
    window = window_size(key_blocks, pairs, sms, window_waves)
    out = []
    for linear in range(key_blocks * pairs):
        first_pair = linear // (window * key_blocks) * window
        in_window = linear % (window * key_blocks)
        width = min(window, pairs - first_pair)  # the last window may hold fewer pairs
        pair = first_pair + in_window % width
        out.append((in_window // width, pair))
    return out


def blockidx_order(key_blocks: int, pairs: int) -> list[tuple[int, int]]:
    """(key block, pair) of each linear CTA index: blockIdx.x (the key block) fastest."""
    return [(j, pair) for pair in range(pairs) for j in range(key_blocks)]


def cta_steps(key_block: int, len_q: int, len_k: int, block_m: int, block_n: int, group: int) -> int:
    """Steps of a causal CTA: the query blocks from the first that sees its keys (the kernel's
    first_query_block) to the last of the padded rows (padded_rows), for each query head of the group."""
    first = key_block * block_n - (len_k - len_q)
    first_block = 0 if first <= 0 else first // block_m
    rows = (len_q + block_m - 1) // block_m * block_m
    return (rows // block_m - first_block) * group


def place(order, steps, sms: int) -> list[tuple[int, int, int, tuple[int, int]]]:
    """(SM, start, end, (key block, pair)) of each CTA: list scheduling in start order, each CTA on
    the SM that frees up first (the lowest-numbered of those free together)."""
    return lpt([(cta, steps(cta[0])) for cta in order], sms)


def makespan(placed) -> int:
    return max(end for _sm, _start, end, _cta in placed)


@dataclass(frozen=True)
class Model:
    example: Example
    block_m: int
    block_n: int
    waves: int
    blockidx: list
    heavy: list

    @property
    def length(self) -> int:
        return self.example.key_blocks * self.block_n

    @property
    def window(self) -> int:
        e = self.example
        return window_size(e.key_blocks, e.pairs, e.sms, self.waves)


def model(example: Example, block_m: int, block_n: int, waves: int) -> Model:
    e = example
    length = e.key_blocks * block_n

    def steps(j):
        return cta_steps(j, length, length, block_m, block_n, e.group)

    return Model(e, block_m, block_n, waves, place(blockidx_order(e.key_blocks, e.pairs), steps, e.sms),
                 place(heavy_first_order(e.key_blocks, e.pairs, e.sms, waves), steps, e.sms))


# --- the picture ---------------------------------------------------------------------------------


def signature(stage) -> str:
    return repr(("cta-order", stage.block_m, stage.block_n, window_waves(stage), EXAMPLE))


def _before(stage, stages):
    """The last stage before this one that starts its CTAs in blockIdx order (None: none)."""
    earlier = [s for s in stages if s.lineage == stage.lineage and s.number < stage.number
               and s.cta_order == "blockidx"]
    return max(earlier, key=lambda s: s.number, default=None)


def _heads(a: int, b: int) -> str:
    return f"K/V head {a}" if a == b else f"K/V heads {a}–{b}"


def _pair_name(e: Example, pair: int) -> str:
    head, batch = pair % e.kv_heads, pair // e.kv_heads
    return f"K/V head {head}" if e.batch == 1 else f"head {head}, batch {batch}"


def cta_order_diagram(stage, stages) -> Diagram:
    did = f"b{stage.id}-cta-order"
    waves = window_waves(stage)
    e = EXAMPLE
    m = model(e, stage.block_m, stage.block_n, waves)
    big = model(LLAMA, stage.block_m, stage.block_n, waves)
    before = _before(stage, stages)
    old = f"stage {before.id}'s blockIdx order" if before is not None else "blockIdx order"
    span_old, span_new = makespan(m.blockidx), makespan(m.heavy)
    ctas = e.key_blocks * e.pairs
    L = m.length
    heaviest = cta_steps(0, L, L, stage.block_m, stage.block_n, e.group)
    lightest = cta_steps(e.key_blocks - 1, L, L, stage.block_m, stage.block_n, e.group)
    title = f"Backward stage {stage.id}: the causal CTAs started heaviest first, a window of pairs at a time"
    desc = (f"A model of the causal backward's CTAs placed on {e.sms} SMs in start order, each on the first SM "
            f"that frees up: {e.key_blocks} key blocks × {e.pairs} (K/V head, batch) pairs = {ctas} CTAs of "
            f"{heaviest} down to {lightest} steps. In {old} the last pair's CTAs, its heaviest "
            f"among them, start last and the grid ends at {span_old} steps; in stage {stage.id}'s order (windows of {m.window} "
            f"pairs, in each the key blocks from 0 up, the window's pairs fastest) it ends at {span_new}.")
    c = Canvas(did, W, 900, title, desc)
    c.heading(f"{stage.id} · backward", ": the causal CTAs on the SMs, in the order they start (a model)")
    c.text(LEFT, 42, f"Example: batch {e.batch}, {e.kv_heads} K/V heads of {e.group} query heads, {L} causal keys "
                     f"and queries: {e.key_blocks} key blocks of {stage.block_n} × {e.pairs} pairs = {ctas} CTAs on "
                     f"{e.sms} SMs (the H200 has {H200_SMS})", size=12, fill="muted")
    items = [(PAIR_COLOURS[p % len(PAIR_COLOURS)], _pair_name(e, p)) for p in range(e.pairs)]
    x = c.legend(LEFT, 62, items, size=12)
    c.text(x, 62, "· a box: a CTA, its key block's number", size=12, fill="muted")
    unit = (X1 - X0) / max(span_old, span_new)
    y = 80
    upper = (f"Stage {before.id} · " if before is not None else "") + "blockIdx order: key blocks fastest, one pair after another"
    panels = ((upper, m.blockidx, blockidx_order(e.key_blocks, e.pairs), None),
              (f"Stage {stage.id} · heavy first: windows of {m.window} pairs (WINDOW_WAVES = {waves}: "
               f"⌈{waves} · {e.sms} / {e.key_blocks}⌉), in each key block 0 first, its pairs fastest",
               m.heavy, heavy_first_order(e.key_blocks, e.pairs, e.sms, waves), m.window))
    grid = c.group()  # drawn first: under the boxes
    tops = []
    for label, placed, order, window in panels:
        y, top = _panel(c, grid, y, label, placed, order, window, unit, e)
        tops.append(top)
    # the shared time axis: a grid line every tick across both panels, the numbers under the last
    tick = _tick(max(span_old, span_new))
    for t in range(0, max(span_old, span_new) + 1, tick):
        tx = X0 + t * unit
        for top, bottom in tops:
            c.line(tx, top - 2, tx, bottom + 2, stroke="grid", sw=1, parent=grid)
        c.text(tx, y + 12, str(t), size=12, anchor="middle", fill="muted")
    c.text(X1 + 100, y + 12, "steps", size=12, anchor="end", fill="muted")
    y += 34
    gain = (span_old - span_new) / span_old * 100
    last0 = next(s for _sm, s, _end, cta in m.blockidx if cta == (0, e.pairs - 1))
    text = (f"A CTA's steps: the query blocks of {stage.block_m} rows that see its keys (key block j: from query "
            f"{stage.block_n} j on, ({L} − {stage.block_n} j) / {stage.block_m} blocks) × {e.group} query heads. "
            f"A CTA starts on the first SM that frees up, in start order; every step costs the same. "
            f"In {old} the last pair's key block 0 starts at {last0} steps and ends the grid at {span_old}, "
            f"the other SMs out of work before it ({_idle(m.blockidx, e.sms)} SM-steps idle in all); heavy first, "
            f"the short CTAs of the last window fill in at the end: {span_new} steps, −{gain:.0f} % in this model "
            f"({_idle(m.heavy, e.sms)} SM-steps idle).")
    for line in wrap(text, W - 2 * LEFT, 12):
        c.text(LEFT, y, line, size=12)
        y += 18
    c.height = height = int(y)
    lw = big.window
    cap = (f"A model, not a measurement: greedy placement in start order (a CTA starts on the first SM that frees "
           f"up, one CTA per SM), every step of every CTA the same cost. Example: batch {e.batch}, {e.kv_heads} K/V "
           f"heads of {e.group} query heads, {L} keys and queries, causal: {e.key_blocks} key blocks × {e.pairs} pairs = {ctas} CTAs "
           f"on {e.sms} SMs drawn (the H200 has {H200_SMS}). Upper: {old}; lower: stage "
           f"{stage.id}'s `cta_tile()`, windows of ⌈WINDOW_WAVES · SMs / key blocks⌉ = {m.window} pairs "
           f"(WINDOW_WAVES = {waves}), in each the key blocks from 0 (the heaviest) up, the window's pairs fastest; "
           f"makespan {span_old} → {span_new} steps. Llama-3.1-8B at 8k causal, batch 1, is {LLAMA.key_blocks} key "
           f"blocks × {LLAMA.pairs} pairs = {LLAMA.key_blocks * LLAMA.pairs} CTAs on {H200_SMS} SMs: windows of "
           f"{lw} pairs, {makespan(big.blockidx)} → {makespan(big.heavy)} steps in the same model; the notes "
           f"have what the GPU measured.")
    return Diagram(did, title, "cta-order", stage.number, c.tostring(), cap, W, height, signature(stage))


def _label_x(bx: float, bw: float, tw: float, lines: list[float]) -> float | None:
    """The x of a box's centred label: its middle, or the middle of the wider side of a window's line
    that crosses the label there; None where it does not fit."""
    if tw > bw - 4:
        return None
    cx = bx + bw / 2
    for wx in lines:
        if abs(wx - cx) < tw / 2 + 4:
            left, right = wx - bx, bx + bw - wx
            if max(left, right) < tw + 8:
                return None
            cx = (bx + wx) / 2 if left >= right else (wx + bx + bw) / 2
    return cx


def _idle(placed, sms: int) -> int:
    """SM-steps without a CTA before the grid's end."""
    return sms * makespan(placed) - sum(end - start for _sm, start, end, _cta in placed)


def _tick(span: int) -> int:
    for t in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        if span / t <= 10:
            return t
    return 2048


def _panel(c, grid, y, label, placed, order, window, unit, e: Example):
    """One order: its heading, the start order as a strip of cells, the SMs' rows, the makespan (and
    the windows' starts, under the boxes in ``grid``). Returns the y below it and the rows' (top, bottom)."""
    c.text(LEFT, y + 14, label, size=13, weight="700")
    y += 24
    # the start order, one cell per CTA (its key block's number, its pair's colour)
    n = len(order)
    cw = (X1 - X0) / n
    c.text(LEFT, y + 14, "starts", size=12, fill="muted")
    for i, (j, pair) in enumerate(order):
        colour = PAIR_COLOURS[pair % len(PAIR_COLOURS)]
        c.rect(X0 + i * cw, y, cw - 1.5, CELL_H, fill=colour, stroke=colour, opacity=0.2, rx=2, sw=1)
        if text_width(str(j), 12) <= cw - 4:
            c.text(X0 + i * cw + (cw - 1.5) / 2, y + 14.5, str(j), size=12, anchor="middle")
    c.line(X0 + n * cw + 2, y + CELL_H / 2, X0 + n * cw + 20, y + CELL_H / 2, stroke="stroke", sw=1.3, arrow=True)
    c.text(X0 + n * cw + 24, y + 14, "in order", size=12, fill="muted")
    y += CELL_H
    starts = []  # (linear index, label) of each window's first CTA
    if window:
        per = window * e.key_blocks
        for k, first in enumerate(range(0, n, per)):
            last = min(first + per, n)
            x0, x1 = X0 + first * cw, X0 + last * cw - 1.5
            c.path([(x0, y + 4), (x0, y + 8), (x1, y + 8), (x1, y + 4)], stroke="accent", sw=1.3)
            pairs = sorted({p for _j, p in order[first:last]})
            c.text((x0 + x1) / 2, y + 22, f"window {k + 1}: {_heads(pairs[0], pairs[-1])}"
                   if e.batch == 1 else f"window {k + 1}: pairs {pairs[0]}–{pairs[-1]}", size=12,
                   anchor="middle", fill="accent")
            starts.append((first, k + 1))
        y += 28
    y += 14
    top = y
    sms = max(sm for sm, *_ in placed) + 1
    # where each window after the first starts: its first CTA's start
    marks = [(X0 + next(s for _sm, s, _end, cta in placed if cta == order[first]) * unit, k)
             for first, k in starts[1:]]
    for sm in range(sms):
        ry = y + sm * (ROW_H + ROW_GAP)
        c.text(LEFT, ry + 15.5, f"SM {sm}", size=12)
        for mm, s, end, (j, pair) in placed:
            if mm != sm:
                continue
            colour = PAIR_COLOURS[pair % len(PAIR_COLOURS)]
            bx, bw = X0 + s * unit, (end - s) * unit - 2
            c.rect(bx, ry, bw, ROW_H, fill=colour, stroke=colour, opacity=0.2, rx=3, sw=1.3)
            lx = _label_x(bx, bw, text_width(str(j), 12), [wx for wx, _k in marks])
            if lx is not None:
                c.text(lx, ry + 15.5, str(j), size=12, anchor="middle")
    bottom = y + sms * (ROW_H + ROW_GAP) - ROW_GAP
    span = makespan(placed)
    mx = X0 + span * unit
    c.line(mx, top - 6, mx, bottom + 4, stroke="bar", sw=2)
    c.text(mx + 6, top + 10, f"ends at {span}", size=12, weight="600", fill="bar")
    c.text(mx + 6, top + 26, "steps", size=12, fill="bar")
    for wx, k in marks:
        c.line(wx, top - 4, wx, bottom + 4, stroke="accent", sw=1.5, dash="5 3", parent=grid)
        c.text(wx + 4, bottom + 17, f"window {k} starts", size=12, fill="accent")
    return bottom + (26 if starts[1:] else 10), (top, bottom)
