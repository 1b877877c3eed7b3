"""How dQ is summed: every key block adds its share to every query row's dQ.

The upper panel is the default path (facts.dq_path): the CTAs of one head's key blocks add their
block_m × head_dim partials into one fp32 accumulator in global memory, in whatever order they
arrive — by reductions from registers, or (a bulk reduce-add in the tasks and a "dQ accum" buffer)
through shared memory: each warpgroup's share stored into a shared tile, one bulk reduce-add per
tile and step, into an accumulator kept in the tiles' order. The lower one is the deterministic
mode (supports.deterministic; how, [diagram] dq_deterministic), which sums in a fixed order
instead: a second pass that walks the key blocks in order and keeps dQ in registers, or the same
kernel's additions made in key-block order (a turn counter per query block and dQ operation).
Numbers are the spec's (tiles, threads, buffers, the mechanism named by its engines and tasks).
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
    b = path.bulk
    desc = (f"Every key block of {n} keys adds its share dS K to the dQ of every query row. Backward stage "
            f"{stage.id} sums the shares "
            + (f"through shared memory: each {facts.group_name(b.writers)} stores its {b.tile_rows}×{b.tile_cols} fp32 "
               f"share into a {b.tile_bytes // 1024} KiB tile, and {b.issuer} adds the tile into an fp32 accumulator "
               f"in global memory{' kept in block order' if b.block_order else ''} with one bulk reduce-add "
               f"({b.ops} per CTA per query block), in the order the CTAs arrive" if b else
               f"with {path.mechanism} into an fp32 accumulator in global memory ({path.per_cta:,} additions per CTA "
               f"per query block), in the order the CTAs arrive" if path.atomic else "in registers")
            + (f"; its deterministic mode sums them in a fixed order ({_mode_words(path)})." if path.deterministic
               else "; it has no deterministic mode."))
    c = Canvas(did, W, 900, title, desc)
    c.heading(f"{stage.id} · backward", ": how the key blocks' shares of dQ are summed")
    y = 50
    if path.bulk:
        y = _bulk(c, stage, path, y)
    elif path.atomic:
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
        elif path.deterministic == "ordered" and path.ordered:
            y = _ordered(c, stage, path, y + 12)
        elif path.deterministic == "ordered":
            y = _para(c, y + 12, "Deterministic mode: the key blocks add their shares in their order, each waiting "
                                 "for the one before it, so the sum is the same on every run.", size=13)
    else:
        y = _para(c, y + 8, "No deterministic mode at this stage: the sum's order is the CTAs' arrival order.",
                  fill="muted")
    c.height = height = int(y + 6)
    cap = ((f"Default: each {facts.group_name(b.writers)}'s {b.tile_rows}×{b.tile_cols} share into "
            + (f"a {b.tile_bytes // 1024} KiB shared tile" if b.tiles_per_op == 1 else
               f"one of its {b.tiles_per_op} shared tiles of {b.tile_bytes // 1024} KiB, in turn")
            + f" ({b.store}, {b.stores} per thread), then one bulk reduce-add of the tile by the TMA unit"
            + (f", issued by a dQ warp of the {b.issuer_role}" if b.own_warps else "")
            + f" ({b.ops} per CTA per query block) into an fp32 accumulator"
            + (" kept in block order" if b.block_order else "")
            + ", in arrival order (dQ differs in its last bits from run to run). ") if b else
           (f"Default: {path.mechanism} into an fp32 accumulator, {path.adds_label} per query "
            "block, in arrival order (dQ differs in its last bits from run to run). ") if path.atomic else
           "dQ is summed in registers. ")
    if path.deterministic == "second pass":
        cap += "With `deterministic=True` a second pass walks the key blocks in order instead: no atomics, more GEMMs."
    elif path.deterministic == "ordered" and path.ordered:
        cap += ("With `deterministic=True` the same kernel makes each query block's additions in key-block order"
                + (", the last key block first" if path.ordered.down else "")
                + f" (a turn counter per query block and dQ {b.part if b else 'share'}): no second pass.")
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


def _bulk(c, stage, path, y) -> float:
    """One CTA's step drawn out (a row per tile: registers, the shared tile, the bulk reduce-add, the
    accumulator's block), the other key blocks' CTAs adding into the same blocks, the conversion."""
    b = path.bulk
    m, n, d = stage.block_m, stage.block_n, stage.head_dim
    group = facts.group_name(b.writers)
    c.text(12, y + 8, f"Default: each {group}'s share through shared memory, one bulk reduce-add ({b.ptx})",
           size=13, weight="700")
    c.text(12, y + 28, f"one CTA (keys 0–{n - 1}) at one step (query rows q0 … q0+{m - 1}); the TMA unit adds while "
                       f"the {group}s go on", size=12, fill="muted")
    top = y + 62
    bh, gap = 48, 16
    xa, wa = 12, 176
    xb, wb = 290, 146
    xc, wc = 562, 150
    xd = 736
    rows = b.ops
    first = _first_group(stage)
    for i in range(rows):
        by = top + i * (bh + gap)
        cols = f"{i * b.tile_cols}–{(i + 1) * b.tile_cols - 1}"
        _box(c, xa, by, wa, bh, (f"warpgroup {first + i}: dQ[:, {cols}]" if b.writers == 128 else f"dQ[:, {cols}]",
                                 f"{b.tile_rows}×{b.tile_cols} fp32, {path.per_thread} / thread"), "q")
        tiles = "shared tile" if b.tiles_per_op == 1 else f"{b.tiles_per_op} shared tiles, in turn"
        _box(c, xb, by, wb, bh, (tiles, f"{b.tile_bytes // 1024} KiB each" if b.tiles_per_op > 1 else
                                 f"{b.tile_bytes // 1024} KiB, register order"), "bar", light=True)
        ym = by + bh / 2
        c.line(xa + wa + 2, ym, xb - 3, ym, stroke="q", sw=1.5, arrow=True)
        c.text((xa + wa + xb) / 2, ym - 7, b.store, size=12, anchor="middle", weight="600")
        c.text((xa + wa + xb) / 2, ym + 16, f"{b.stores} per thread", size=12, anchor="middle", fill="muted")
        c.line(xb + wb + 2, ym, xc - 3, ym, stroke="bar", sw=1.5, arrow=True)
        who = f"dQ warp {b.issuer_warps[i]}" if b.own_warps and i < len(b.issuer_warps) else "1 thread"
        c.text((xb + wb + xc) / 2, ym - 7, "bulk reduce-add", size=12, anchor="middle", weight="600")
        c.text((xb + wb + xc) / 2, ym + 16, f"{who}, {b.tile_bytes // 1024} KiB", size=12, anchor="middle",
               fill="muted")
    # the accumulator: one block per tile of the step
    acc_top, acc_h = top - 22, rows * (bh + gap) - gap + 22
    c.rect(xc, acc_top, wc, acc_h, fill="bar", stroke="bar", opacity=0.12, rx=4, sw=1.3)
    c.text(xc + wc / 2, acc_top + 14, "dQ accumulator, fp32", size=12, anchor="middle", weight="600")
    for i in range(rows):
        by = top + i * (bh + gap)
        label = f"block {i}: cols {i * b.tile_cols}–{(i + 1) * b.tile_cols - 1}"
        _box(c, xc + 6, by + 4, wc - 12, bh - 8, (label, f"{b.tile_bytes // 1024} KiB, as the tile"), "bar")
    mid = acc_top + acc_h / 2
    c.line(xc + wc + 2, mid, xd - 3, mid, stroke="bar", sw=1.5, arrow=True)
    _box(c, xd, mid - 34, W - 12 - xd, 68, ("conversion", "floats back to rows", "× scale, bf16"), "q", light=True)
    # every other key block's CTA adds into the same blocks
    oy = top + rows * (bh + gap) + 6
    others = f"CTAs of keys {n}–{2 * n - 1}, {2 * n}–{3 * n - 1}, …"
    _box(c, xa, oy, xb + wb - xa, 40, (others, f"each the same {b.ops} bulk reduce-adds into the same blocks"), "k")
    c.line(xb + wb + 2, oy + 20, xc + wc / 2, acc_top + acc_h + 2, stroke="bar", sw=1.5, arrow=True)
    c.text(xb + wb + 12, oy + 36, "in arrival order", size=12, fill="muted")
    y = oy + 40 + 24
    order = (f" A bulk reduce-add adds contiguous bytes, so the accumulator is kept in the tiles' order — a "
             f"{b.tile_bytes // 1024} KiB block per query block and {group} — and the conversion kernel puts every "
             "float back at its row and column." if b.block_order else "")
    y = _para(c, y, f"Per CTA and step: {b.ops} bulk reduce-adds of {b.tile_bytes // 1024} KiB ({path.per_cta:,} floats, "
                    f"{m} rows × {d}), one per {group}, issued by {_issuers(b)}.{_handover(stage, b)}{order} Every key "
                    "block of the head adds "
                    "into the same blocks, in whatever order the CTAs arrive, so the last bits of dQ can differ from run "
                    "to run.")
    return y


def _handover(stage, b) -> str:
    """How a tile passes between its writers and the warp that adds it, when that is another role's:
    the full and empty mbarriers of the dQ tiles ([[smem]])."""
    names = " ".join(x.name.lower() for x in stage.smem if x.layout == "mbarrier" and "dq" in x.name.lower())
    if not b.own_warps or "full" not in names or "empty" not in names:
        return ""
    return (" Each tile goes to its dQ warp on a full mbarrier (its writers' arrivals) and comes back on an empty "
            "one once the reduce-add is done with it.")


def _first_group(stage) -> int:
    """The warpgroup index of the dQ GEMM's first warps (1 when a producer warpgroup comes first)."""
    roles = {op.role for op in stage.schedule if op.kind == "dq"}
    warps = [w for r in stage.roles if r.name in roles for w in r.warps]
    return min(warps) // 4 if warps else 0


def _issuers(b) -> str:
    if b.own_warps:
        ws = list(b.issuer_warps)
        named = ", ".join(map(str, ws[:-1])) + f" and {ws[-1]}" if len(ws) > 1 else str(ws[0])
        return f"dQ warp{'s' if len(ws) > 1 else ''} {named} of the {b.issuer_role} warpgroup (one thread each, one per {_group_of(b)})"
    return f"one thread of each {_group_of(b)}"


def _group_of(b) -> str:
    return facts.group_name(b.writers)


def _ordered(c, stage, path, y) -> float:
    """The deterministic mode as turns: key block n's additions to a query block wait for n."""
    o, b = path.ordered, path.bulk
    n = stage.block_n
    part = f"dQ {b.part}" if b else "dQ share"
    c.text(12, y + 8, "Deterministic mode: the same kernel, each query block's additions in key-block order"
           + (", the last first" if o.down else ""), size=13, weight="700")
    start = (", set to L, the last key block that sees the query block" if o.down else "")
    c.text(12, y + 28, f"a turn counter per query block and {part} ({o.counters} per query block){start}; no second pass",
           size=12, fill="muted")
    top = y + 44
    bh, step_w, gap = 62, 166, 14
    x = 12
    for j in range(BLOCKS):
        last = j == BLOCKS - 1
        if o.down:  # L, then the last BLOCKS - 1 blocks down to key block 0
            block = BLOCKS - 1 - j
            keys = "key block L, the last" if j == 0 else f"key block {block} · keys {block * n}–{(block + 1) * n - 1}"
            turn, after = ("L", "L − 1") if j == 0 else (str(block), f"{block - 1}".replace("-", "−"))
        else:
            keys = f"key block {j} · keys {j * n}–{(j + 1) * n - 1}" if not last else "… key block n"
            turn, after = ("n", "n + 1") if last else (str(j), str(j + 1))
        _box(c, x, top, step_w, bh, (keys, f"waits for turn {turn}, adds", f"waits for it, turn → {after}"), "k")
        x += step_w
        if not last:
            c.line(x + 2, top + bh / 2, x + gap - 3, top + bh / 2, stroke="bar", sw=1.5, arrow=True)
            x += gap
    c.line(x + 2, top + bh / 2, W - 12 - 100 - 3, top + bh / 2, stroke="bar", sw=1.5, arrow=True)
    _box(c, W - 12 - 100, top, 100, bh, ("same sum,", "same bits,", "every run"), "q", light=True)
    y = top + bh + 26
    who = f"dQ warp{'s' if b and len(b.issuer_warps) > 1 else ''} of the {b.issuer_role}" if b and b.own_warps else (
        "issuing thread" if b else "CTA")
    steps = [f"waits until the counter reads n{f' ({o.wait})' if o.wait else ''}",
             f"issues its {'bulk reduce-add' if b else 'additions'}",
             f"waits for {'it' if b else 'them'} to complete{f' ({o.done})' if o.done else ''}",
             f"adds {'−1' if o.down else '1'}{f' ({o.count})' if o.count else ''}"]
    text = (f"Key block n's {who.replace('dQ warps', 'dQ warp')} " + ", ".join(steps[:-1]) + f" and {steps[-1]}: every "
            "float of the accumulator receives its key blocks' shares in the same order from the same zero.")
    if o.down:
        text += (" The preprocess sets each counter to L, the last key block that sees its query block, and the turns "
                 "run from L down to key block 0: with a causal mask L is the key block on the query block's diagonal, "
                 "which reaches it at its first step while key block 0 reaches it last, so the turns come in the order "
                 "the CTAs get there.")
    if o.ticket:
        first, before = ("the last key block first", "n + 1") if o.down else ("key block 0 first", "n − 1")
        text += (f" In this mode the CTA takes its key block from a ticket as it starts ({first}), not from its "
                 f"blockIdx: key block n goes only to a CTA that started after the one with {before}, so no turn waits "
                 "for a CTA that has not started.")
    if b and b.own_warps and b.tiles_per_op > 1:
        text += (f" The waits are the dQ warps', off the computing warpgroups' path: each {_group_of(b)} writes into "
                 f"{b.tiles_per_op} tiles in turn, and waits only when it gets {b.tiles_per_op} steps ahead of its dQ warp.")
    elif b and not b.own_warps:
        text += (f" The waiting thread is one of its {_group_of(b)}'s {b.writers}: the wait is on the computing "
                 "path.")
    return _para(c, y, text)


def _mode_words(path) -> str:
    """How the deterministic mode sums, for the description: "second pass", or the turns."""
    if path.deterministic == "ordered" and path.ordered:
        part = f"dQ {path.bulk.part}" if path.bulk else "dQ share"
        order = "in key-block order, the last key block first" if path.ordered.down else "in key-block order"
        return f"{order}: a turn counter per query block and {part}"
    return path.deterministic


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
