"""Warp roles, drawn as a protocol: the CTA's warps by role, then one lane per role over a few KV
tiles, the rings between them as slots, and the hand-offs as arrows in time order (a slot filled:
full; a slot freed: empty; a turn passed on: a named barrier; every warp meeting: a CTA barrier).

The data is protocol.build(stage); what changed against the previous stage is highlighted and
named in the caption. Labels are short (12 px and up); every task of every role is listed under
the figure, in a collapsible block of the page (pages/stage.py).
"""

from __future__ import annotations

from . import protocol
from .diagram import Diagram
from .svg import Canvas, fmt_bytes, text_width, wrap

W = 860
LEFT = 168  # label column
X0, X1 = LEFT + 8, W - 14
TRACK_H, TRACK_GAP = 24, 4
SLOT_H = 18
REGFILE = 65536
KIND_COLOUR = {"load_k": "k", "load_v": "v", "load_kv": "k", "load_q": "q", "qk": "s", "softmax": "p",
               "pv": "o", "store_o": "warp", "claim": "accent", "read_id": "accent"}
TRACKS = {"copy": "copies", "tensor": "tensor cores", "softmax": "softmax, epilogue"}
LEGEND = (("load_kv", "K, V load"), ("load_k", "K load"), ("load_v", "V load"), ("load_q", "Q load"), ("qk", "S = QKᵀ"), ("softmax", "softmax"),
          ("pv", "O += PV"), ("store_o", "store O"), ("claim", "tile id"))


def _ranges(ws) -> str:
    ws = sorted(ws)
    return f"{ws[0]}–{ws[-1]}" if len(ws) > 1 and ws[-1] - ws[0] == len(ws) - 1 else ", ".join(map(str, ws))


def _tracks(p, lane) -> list[str]:
    used = {e.track for e in p.events if e.lane == lane.role}
    return [t for t in TRACKS if t in used]


def _box_label(e, w: float) -> str:
    for s in (e.label, e.label.split(" ")[-1] if e.tile >= 0 else e.label):
        if text_width(s, 12, bold=True) <= w - 6:
            return s
    return ""


def previous(stage, stages):
    return next((s for s in stages if s.number == stage.number - 1), None)


def changes(stage, stages) -> tuple[list[str], list[str], set[str]]:
    """(new or changed features, features gone, keys to highlight) against the previous stage; a new
    set of roles is said once ("roles: ... (were ...)")."""
    now = protocol.build(stage).features()
    prev = previous(stage, stages)
    if prev is None:
        return [], [], set()
    before = protocol.build(prev).features()
    hot = {k for k, v in now.items() if before.get(k) != v}
    lanes_now = [v for k, v in now.items() if k.startswith("lane ")]
    lanes_before = [v for k, v in before.items() if k.startswith("lane ")]
    new, gone = [], []
    if lanes_now != lanes_before:
        new.append(f"roles: {', '.join(lanes_now)} (were: {', '.join(lanes_before)})")
    new += [v for k, v in now.items() if before.get(k) != v and not k.startswith("lane ")]
    gone += [v for k, v in before.items() if k not in now and not k.startswith("lane ")]
    return new, gone, hot


def roles_diagram(stage, stages) -> Diagram:
    p = protocol.build(stage)
    did = f"s{stage.id}-roles"
    new, gone, hot = changes(stage, stages)
    prev = previous(stage, stages)
    lanes = p.lanes
    ngroups = (stage.warps + 3) // 4

    # Vertical layout.
    y_title, y_warps = 24, 48
    y_proto = y_warps + 32 + 40 + (26 if any(ln.registers for ln in lanes) else 0) + 16
    lane_h = {ln.role: len(_tracks(p, ln)) * (TRACK_H + TRACK_GAP) + 8 for ln in lanes}
    ring_rows = sorted(p.rings, key=lambda r: ("ID", "Q", "KV", "K", "V").index(r.key))
    ring_h = {r.key: r.depth * SLOT_H + 10 for r in ring_rows}
    producer = next((ln for ln in lanes if ln.loads_only), None)
    order = []  # ("lane", lane) / ("ring", ring), top to bottom
    for ln in lanes:
        order.append(("lane", ln))
        if ln is producer or (producer is None and ln is lanes[0]):
            order += [("ring", r) for r in ring_rows]
    if producer is None and not any(k == "ring" for k, _ in order):
        order += [("ring", r) for r in ring_rows]
    y = y_proto + 22
    top_of = {}
    for kind, item in order:
        key = item.role if kind == "lane" else item.key
        top_of[(kind, key)] = y
        y += (lane_h[key] if kind == "lane" else ring_h[key]) + 8
    y_bottom = y
    legend_y = y_bottom + 24
    n_notes = len(p.notes) + (1 if p.cta_sync else 0) + (1 if not p.rings and len(lanes) == 1 else 0)
    height = int(legend_y + 26 + 22 + 20 * n_notes + 14)

    title = f"Stage {stage.id} warp roles"
    role_desc = "; ".join(f"{ln.label}: warps {_ranges(ln.warps)}, "
                          + (f"setmaxnreg {ln.registers}" if ln.registers else "compiler-chosen registers")
                          for ln in lanes)
    desc = (f"The {stage.threads} threads of a stage {stage.id} CTA ({stage.warps} warps, {ngroups} "
            f"warpgroup{'s' if ngroups > 1 else ''}) by role ({role_desc}), then {p.tiles} KV tiles of the "
            "protocol in logical time: which role issues which copy and GEMM, the shared-memory rings "
            + (", ".join(f"{r.label} of {r.depth}" for r in p.rings) if p.rings else "(none)")
            + ", and the barrier hand-offs between them.")
    c = Canvas(did, W, height, title, desc)
    c.heading(f"{stage.id} · {stage.title}", ": who does what, and how tiles are handed over", y=y_title)

    # The CTA's warps, coloured by role, and the register budgets.
    c.text(12, y_warps + 17, f"CTA · {stage.threads} threads", size=12, weight="600")
    colour = {ln.role: ln.colour for ln in lanes}
    role_of = {w: ln.role for ln in lanes for w in ln.warps}
    bw = (X1 - X0) / stage.warps
    for w in range(stage.warps):
        x = X0 + w * bw
        c.rect(x + 1, y_warps, bw - 2, 26, fill=colour[role_of[w]], stroke=colour[role_of[w]], opacity=0.28,
               rx=3, cls="hd-warp")
        c.text(x + bw / 2, y_warps + 17, f"warp {w}", size=12 if bw > 52 else 11, anchor="middle")
    yb = y_warps + 32
    for ln in lanes:
        xs = [X0 + w * bw for w in ln.warps]
        x0, x1 = min(xs) + 2, max(xs) + bw - 2
        c.path([(x0, yb), (x0, yb + 5), (x1, yb + 5), (x1, yb)], stroke=colour[ln.role], sw=1.5)
        label = f"{ln.label} · {ln.threads} threads"
        regs = f"setmaxnreg {ln.registers}" if ln.registers else "compiler-chosen registers"
        if text_width(f"{label} · {regs}", 12) <= x1 - x0:
            c.text((x0 + x1) / 2, yb + 20, f"{label} · {regs}", size=12, anchor="middle")
        else:
            c.text((x0 + x1) / 2, yb + 20, label, size=12, anchor="middle")
            c.text((x0 + x1) / 2, yb + 36, regs, size=12, anchor="middle", fill="muted")
    if any(ln.registers for ln in lanes):
        parts = [f"{ln.threads} × {ln.registers}" for ln in lanes]
        total = sum(ln.threads * ln.registers for ln in lanes)
        c.text(12, yb + 56, f"Registers per SM: {' + '.join(parts)} = {total:,} of {REGFILE:,}",
               size=12, fill="muted")

    # Time axis.
    steps = p.steps
    step = (X1 - X0) / steps
    def tx(t):
        return X0 + t * step
    c.text(12, y_proto + 6, f"{p.tiles} KV tiles", size=12, weight="600")
    c.text(X1, y_proto + 6, "logical steps, in order (the pipeline timeline is to scale)", size=12,
           anchor="end", fill="muted")

    # Lane panels first: the hand-offs run over them and under the boxes.
    for kind, item in order:
        if kind != "lane":
            continue
        ln = item
        top, h = top_of[("lane", ln.role)], lane_h[ln.role]
        if f"lane {ln.role}" in hot and prev is not None:
            _highlight(c, 6, top - 4, LEFT - 4, h + 8)
        c.rect(X0 - 4, top, X1 - X0 + 8, h, fill="panel", stroke="grid", rx=4)
        c.rect(8, top, 6, h, fill=ln.colour, stroke=None, rx=2)
        c.text(20, top + 17, ln.label, size=13, weight="700")
        c.text(20, top + 34, f"warps {_ranges(ln.warps)}", size=12, fill="muted")
        if h > 50:
            third = f"{ln.registers} registers" if ln.registers else f"{ln.threads} threads"
            if ln.label in ("all warps", "one warpgroup"):
                third = f"{stage.block_m // stage.warps} rows per warp"
            c.text(20, top + 50, third, size=12, fill="muted")

    # Where each box goes (drawn after the hand-offs).
    box_at: dict = {}
    for ln in lanes:
        top = top_of[("lane", ln.role)]
        for ti, tr in enumerate(_tracks(p, ln)):
            ty = top + 4 + ti * (TRACK_H + TRACK_GAP)
            for e in [e for e in p.events if e.lane == ln.role and e.track == tr]:
                box_at[id(e)] = (tx(e.start) + 1, ty, tx(e.end) - tx(e.start) - 2, TRACK_H)

    # Rings: one row per slot; a tile occupies its slot from its load to its last release.
    seg_at: dict = {}
    for r in ring_rows:
        top, h = top_of[("ring", r.key)], ring_h[r.key]
        if f"ring {r.key}" in hot and prev is not None:
            _highlight(c, 6, top - 4, LEFT - 4, h + 8)
        c.text(20, top + 14, r.label, size=13, weight="700", fill=r.colour)
        c.text(20, top + 30, f"{r.depth} × {fmt_bytes(r.slot_bytes)}", size=12, fill="muted")
        for s_ in range(r.depth):
            sy = top + 4 + s_ * SLOT_H
            c.rect(X0 - 4, sy, X1 - X0 + 8, SLOT_H - 2, fill="panel2", stroke="grid", rx=2, sw=0.6)
            c.text(LEFT - 2, sy + 13, f"slot {s_}", size=12, anchor="end", fill="muted")
        for occ in [o for o in p.occupancy if o.ring == r.key]:
            sy = top + 4 + occ.slot * SLOT_H
            x0, x1 = tx(occ.start) + 1, tx(occ.end) - 1
            c.rect(x0, sy + 1, x1 - x0, SLOT_H - 4, fill=r.colour, stroke=r.colour, opacity=0.35, rx=2, sw=0.8)
            seg_at[id(occ.load)] = (x0, sy + 1, x1 - x0, SLOT_H - 4)
            for label in (occ.label, occ.label.split(" ")[-1]):
                if text_width(label, 12) <= x1 - x0 - 6:
                    c.text(x0 + 4, sy + 13, label, size=12)
                    break

    # Hand-offs: a filled slot down (or up) to the op that waits for it; a release up to the slot;
    # a turn from one consumer's GEMM issue to the other's.
    labelled = set()
    refills: dict = {}
    for sg in p.signals:
        b = box_at.get(id(sg.dst))
        a = box_at.get(id(sg.src))
        if a is None or b is None:
            continue
        if sg.kind == "full":
            seg = seg_at.get(id(sg.src))
            x = b[0] + 5
            if seg is None:  # no ring row: straight from the copy
                c.line(a[0] + a[2] - 3, a[1] + a[3], x, b[1] - 2, stroke="fg", sw=1.2, arrow=True)
            elif seg[1] < b[1]:
                c.line(x, seg[1] + seg[3], x, b[1] - 2, stroke="fg", sw=1.2, arrow=True)
            else:
                c.line(x, seg[1], x, b[1] + b[3] + 2, stroke="fg", sw=1.2, arrow=True)
        elif sg.kind == "empty":
            seg = next((seg_at[id(o.load)] for o in p.occupancy if o.ring == sg.ring and o.slot == sg.slot
                        and o.load.start < sg.dst.start and o.end >= sg.src.end), None)
            x = a[0] + a[2] - 4
            if seg is not None:
                c.line(x, a[1], x, seg[1] + seg[3] + 2, stroke="muted", sw=1.3, dash="4 3", arrow=True)
                refills.setdefault(id(sg.dst), []).append((x, seg[1], b))
        else:
            x1, y1 = a[0] + a[2] - 2, a[1] + a[3] / 2
            x2, y2 = b[0] + 2, b[1] + b[3] / 2
            c.path([(x1, y1), (x1 + 5, y1), (x1 + 5, y2), (x2, y2)], stroke="bar", sw=1.5, dash="2 3", arrow=True)
        labelled.add(sg.kind)
    for waits in refills.values():  # the producer's refill waits for the last release of the slot
        x, sy, b = max(waits, key=lambda w: w[0])
        c.line(x, sy, b[0] + 5, b[1] + b[3] + 2, stroke="muted", sw=1.3, dash="4 3", arrow=True)

    # The boxes.
    for ln in lanes:
        for e in [e for e in p.events if e.lane == ln.role]:
            x, ty, w, th = box_at[id(e)]
            fill = KIND_COLOUR[e.kind]
            if ln.label in ("all warps", "one warpgroup") and not e.by_one_thread:  # every warp, in lockstep
                for k in (3, 2, 1):
                    c.rect(x + 2 * k, ty + 6 - 2 * k, w - 6, th - 6, fill=fill, stroke="bg", opacity=0.35, rx=2,
                           sw=0.6)
                c.rect(x, ty + 6, w - 6, th - 6, fill=fill, stroke="bg", opacity=0.95, rx=2, sw=0.8)
                lx, lw, ly = x + (w - 6) / 2, w - 6, ty + 6 + (th - 6) / 2 + 4.5
            else:
                c.rect(x, ty, w, th, fill=fill, stroke="bg", opacity=0.95, rx=3, sw=0.8)
                lx, lw, ly = x + w / 2, w, ty + th / 2 + 4.5
            label = _box_label(e, lw)
            if label:
                c.text(lx, ly, label, size=12, anchor="middle", fill="bg", weight="600")

    # CTA barriers: every warp waits there.
    first = None
    for bar in p.barriers:
        x = tx(bar.time) - 0.5
        c.line(x, y_proto + 16, x, y_bottom - 6, stroke="bar", sw=1.6, dash="6 3")
        if first is None:
            first = bar
    # Legend: what the colours and the lines mean.
    items = [(k, lbl) for k, lbl in LEGEND if any(e.kind == k for e in p.events)]
    x = 12
    for key, label in items:
        c.rect(x, legend_y - 11, 12, 12, fill=KIND_COLOUR[key], stroke=None, rx=2)
        c.text(x + 17, legend_y, label, size=12, fill="muted")
        x += 17 + text_width(label, 12) + 16
    y = legend_y + 24
    x = 12
    lines = []
    if "full" in labelled:
        lines.append(("fg", None, "slot filled: the consumer's wait on its full barrier returns"))
    if "empty" in labelled:
        lines.append(("muted", "5 3", "slot freed: consumers arrive on its empty barrier, the producer refills"))
    if "turn" in labelled:
        lines.append(("bar", "2 3", "turn: named barriers 1 and 2 pass the tensor cores to the other consumer"))
    if p.barriers:
        lines.append(("bar", "6 3", f"{first.label}: every warp of the CTA waits here"))
    for stroke, dash, label in lines:
        hot_line = ("turns" in hot and stroke == "bar" and dash == "2 3") and prev is not None
        if x + 40 + text_width(label, 12) > W - 10:
            x, y = 12, y + 20
        if hot_line:
            _highlight(c, x - 4, y - 14, 40 + text_width(label, 12) + 8, 20)
        c.line(x, y - 4, x + 30, y - 4, stroke=stroke, sw=1.5, dash=dash, arrow=True)
        c.text(x + 38, y, label, size=12, fill="fg" if hot_line else "muted")
        x += 40 + text_width(label, 12) + 22
    y += 22
    notes = list(p.notes)
    for key in ("epilogue", "overlap"):
        if key in p.features():
            notes.insert(0, p.features()[key])
    if not p.rings and len(lanes) == 1:
        notes.insert(0, "no barriers: each warp loads its own K and V fragments and works on its own rows")
    for note in notes:
        hot_note = prev is not None and (f"note {note}" in hot or any(
            note == p.features().get(k) and k in hot for k in ("overlap", "epilogue")))
        lines = wrap(note[0].upper() + note[1:], W - 30, 12)
        if hot_note:
            _highlight(c, 8, y - 14, max(text_width(ln, 12) for ln in lines) + 10, 20 * len(lines))
        for line in lines:
            c.text(12, y, line, size=12)
            y += 20
    c.height = height = int(y)
    cap = _caption(stage, prev, p, new, gone)
    return Diagram(did, title, "roles", stage.number, c.tostring(), cap, W, height, signature(p))


def _release(p, load) -> int | None:
    """When the tile a load brought in leaves its slot: the end of the signals that free it."""
    later = [sg for sg in p.signals if sg.kind == "empty" and sg.dst.ring == load.ring and sg.dst.slot == load.slot
             and sg.dst.start > load.start]
    if later:
        nxt = min(sg.dst.start for sg in later)
        return max(sg.src.end for sg in later if sg.dst.start == nxt)
    readers = [sg.dst.end for sg in p.signals if sg.kind == "full" and sg.src is load]
    nxt = [e.start for e in p.events if e.ring == load.ring and e.slot == load.slot and e.start > load.start
           and e.kind == load.kind]
    if nxt:
        return min(nxt)
    return max(readers) if readers and load.ring not in ("Q", "ID") else None


def signature(p) -> str:
    """What the roles picture shows, without the stage's name."""
    events = [(e.lane, e.track, e.kind, e.label, e.start, e.end, e.ring, e.slot) for e in p.events]
    signals = [(s.kind, s.src.label, s.src.start, s.dst.label, s.dst.start) for s in p.signals]
    return repr((sorted(p.features().items()), events, signals, [(b.time, b.label) for b in p.barriers]))


def _highlight(c, x, y, w, h):
    c.rect(x, y, w, h, fill="hl", stroke=None, opacity=0.45, rx=5)


def _caption(stage, prev, p, new, gone) -> str:
    depth = ", ".join(f"{r.label} {r.depth} deep" for r in p.rings)
    if prev is None:
        return (f"Every warp runs the whole loop on its own query rows; {depth or 'no shared memory, no barriers'}. "
                "Boxes are one KV tile's work, in program order.")
    if not new and not gone:
        return f"The roles and their hand-offs are those of stage {prev.id}."
    said = "; ".join(new[:4]) + ("" if not gone else "; gone: " + "; ".join(gone[:2]))
    return f"Since stage {prev.id} (highlighted): {said}."
