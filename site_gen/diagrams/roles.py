"""Warp roles: the CTA's warps and warpgroups, what each role does, its registers and barriers."""

from __future__ import annotations

from . import engines, facts
from .diagram import Diagram
from .svg import Canvas, text_width

W = 860
ROLE_COLOURS = ("q", "k", "v", "s", "o", "p")
REGFILE = 65536


def role_colour(stage, name: str) -> str:
    names = [r.name for r in stage.roles]
    return ROLE_COLOURS[names.index(name) % len(ROLE_COLOURS)]


def wrap(s: str, width: float, size: float) -> list[str]:
    words, out, cur = s.split(), [], ""
    for w in words:
        trial = f"{cur} {w}".strip()
        if text_width(trial, size) > width and cur:
            out.append(cur)
            cur = w
        else:
            cur = trial
    if cur:
        out.append(cur)
    return out


def barriers(stage) -> list[tuple[str, str, str, str]]:
    """(from role, to role, kind, what) for every dependency that crosses roles, plus the CTA-wide
    barriers a single role needs around shared memory."""
    by_name = {op.op: op for op in stage.schedule}
    mbar = bool(facts.barriers(stage))
    groups: dict[tuple[str, str, str], list[str]] = {}
    for op in stage.schedule:
        for dep in op.after:
            name = dep.split(".", 1)[1] if dep.startswith(("prev.", "prev2.")) else dep
            src = by_name[name]
            if src.role == op.role:
                continue
            if src.kind.startswith("load"):
                kind = "full mbarrier (tile landed)" if mbar else "barrier (tile landed)"
            elif op.kind.startswith("load"):
                kind = "empty mbarrier (slot free again)" if mbar else "barrier (slot free again)"
            else:
                kind = "named barrier (order between roles)"
            pair = f"{dep} → {op.op}"
            lst = groups.setdefault((src.role, op.role, kind), [])
            if pair not in lst:
                lst.append(pair)
    out = [(a, b, k, ", ".join(v)) for (a, b, k), v in groups.items()]
    if len(stage.roles) == 1 and stage.smem:
        loads = {engines.family(op.engine) for op in stage.schedule if op.kind.startswith("load")}
        r = stage.roles[0].name
        if "cp.async" in loads:
            out.append((r, r, "cp.async.wait_group + __syncthreads", "a tile has landed before any warp reads it"))
        elif "tma" in loads:
            out.append((r, r, "mbarrier wait", "the TMA transaction count is complete before any warp reads"))
        else:
            out.append((r, r, "__syncthreads", "the tile is in shared memory before any warp reads it"))
        out.append((r, r, "__syncthreads", "every warp is done with a buffer before it is overwritten"))
    return out


def roles_diagram(stage, stages) -> Diagram:
    did = f"s{stage.id}-roles"
    nwarps = stage.warps
    warp_role = {w: r.name for r in stage.roles for w in r.warps}
    ngroups = (nwarps + 3) // 4
    title = f"Stage {stage.id} warp roles"
    role_desc = "; ".join(
        f"{r.name}: {len(r.warps)} warps ({32 * len(r.warps)} threads), "
        f"{'setmaxnreg ' + str(r.registers) if r.registers else 'compiler-chosen registers'}"
        for r in stage.roles)
    desc = (f"The {stage.threads} threads of a stage {stage.id} CTA: {nwarps} warps in {ngroups} "
            f"warpgroup{'s' if ngroups > 1 else ''}. Roles: {role_desc}.")

    # Role cards: side by side, tasks wrapped to the card width.
    nr = len(stage.roles)
    card_w = (W - 24 - 12 * (nr - 1)) / nr
    task_lines = {r.name: [ln for t in r.tasks for ln in _bullet(t, card_w - 24, 11)] for r in stage.roles}
    card_h = 70 + 15 * max(len(v) for v in task_lines.values())
    bars = barriers(stage)
    top_cta = 40
    wg_h = 86
    cards_y = top_cta + wg_h + 44
    bar_y = cards_y + card_h + 30
    regs_line = any(r.registers for r in stage.roles)
    height = bar_y + 18 * (len(bars) + 1) + (22 if regs_line else 0) + 12
    c = Canvas(did, W, height, title, desc)
    c.text(12, 22, f"{stage.id} · {stage.title}: {stage.threads} threads, {nwarps} warps, "
                   f"{ngroups} warpgroup{'s' if ngroups > 1 else ''}", size=14, weight="600")

    # CTA with its warpgroups and warps.
    c.rect(8, top_cta - 6, W - 16, wg_h + 18, fill="panel", stroke="stroke", rx=8)
    c.text(16, top_cta + 8, "CTA", size=11, fill="muted", weight="600")
    gw = (W - 60 - 10 * (ngroups - 1)) / ngroups
    wg = c.group("warps")
    for g in range(ngroups):
        gx = 48 + g * (gw + 10)
        c.rect(gx, top_cta, gw, wg_h, fill="panel2", stroke="grid", rx=6, parent=wg)
        ws = [w for w in range(g * 4, min(g * 4 + 4, nwarps))]
        names = sorted({warp_role[w] for w in ws}, key=[r.name for r in stage.roles].index)
        c.text(gx + 8, top_cta + 15, f"warpgroup {g}" + (f" · {', '.join(names)}" if names else ""),
               size=11, weight="600", parent=wg)
        ww = (gw - 16 - 6 * 3) / 4
        for k, w in enumerate(ws):
            wx = gx + 8 + k * (ww + 6)
            col = role_colour(stage, warp_role[w])
            c.rect(wx, top_cta + 24, ww, wg_h - 32, fill=col, stroke=col, opacity=0.25, rx=4, parent=wg,
                   cls="hd-warp")
            c.text(wx + ww / 2, top_cta + 46, f"warp {w}", size=11, anchor="middle", weight="600", parent=wg)
            c.text(wx + ww / 2, top_cta + 62, "32 threads", size=10, anchor="middle", fill="muted", parent=wg)

    # Cards.
    for i, r in enumerate(stage.roles):
        x = 12 + i * (card_w + 12)
        col = role_colour(stage, r.name)
        c.rect(x, cards_y, card_w, card_h, fill="bg", stroke=col, sw=1.5, rx=6)
        c.rect(x, cards_y, 6, card_h, fill=col, stroke=None, rx=2)
        c.text(x + 14, cards_y + 20, r.name, size=13, weight="700")
        warps = ", ".join(str(w) for w in r.warps)
        c.text(x + 14, cards_y + 37, f"warps {warps} · {32 * len(r.warps)} threads", size=11, fill="muted")
        regs = f"setmaxnreg {r.registers} registers / thread" if r.registers else "registers: compiler-chosen"
        c.text(x + 14, cards_y + 53, regs, size=11, fill="muted")
        c.lines(x + 14, cards_y + 72, task_lines[r.name], size=11, leading=1.36)

    # Barriers between roles.
    c.text(12, bar_y, "Barriers", size=12.5, weight="600")
    y = bar_y
    for src, dst, kind, what in bars:
        y += 18
        arrow = f"{src} → {dst}" if src != dst else f"all warps of {src}"
        c.rect(16, y - 9, 9, 9, fill="bar", stroke=None, rx=1)
        c.text(32, y, f"{arrow}: {kind} — {what}", size=11)
    if not bars:
        y += 18
        c.text(32, y, "none: each warp works on its own rows and reads its operands itself", size=11, fill="muted")
    if regs_line:
        y += 24
        parts = [f"{32 * len(r.warps)} × {r.registers}" for r in stage.roles]
        total = sum(32 * len(r.warps) * r.registers for r in stage.roles)
        c.text(12, y, f"Register file per SM: {' + '.join(parts)} = {total:,} of {REGFILE:,} 32-bit registers",
               size=11.5, weight="600")
    cap = (f"Warps, warpgroups and roles from `[[roles]]` of stage {stage.id}'s `stage.toml` (tasks verbatim); "
           f"barriers from the schedule dependencies that cross roles.")
    return Diagram(did, title, "roles", stage.number, c.tostring(), cap, W, height)


def _bullet(task: str, width: float, size: float) -> list[str]:
    lines = wrap(task, width, size)
    return ["• " + lines[0]] + ["   " + ln for ln in lines[1:]]
