"""Makespan of output-tile schedules for causal attention (K/V tiles per CTA), static and dynamic.

    python3 research/sched_sim.py
"""
import heapq


def tiles_work(B, H, L, bm=128, bn=128):
    qb = (L + bm - 1) // bm
    return qb, [(bh, m, (min(L, (m + 1) * bm) + bn - 1) // bn) for bh in range(B * H) for m in range(qb)]


def static(order, G=132, snake=False):
    load = [0] * G
    for i, (_bh, _m, w) in enumerate(order):
        r, c = divmod(i, G)
        cta = (G - 1 - c) if (snake and r % 2) else c
        load[cta] += w + 0.3  # +epilogue/prologue overhead per tile
    return max(load), sum(load) / G


def dynamic(order, G=132):
    h = [(0, c) for c in range(G)]
    for _bh, _m, w in order:
        t, c = heapq.heappop(h)
        heapq.heappush(h, (t + w + 0.3, c))
    return max(t for t, c in h), sum(w + 0.3 for _, _, w in order) / G


def grouped(T, g):
    return sorted(T, key=lambda x: (x[0] // g, -x[1], x[0]))


for B, H, L in [(8, 16, 4096), (4, 16, 8192), (2, 16, 16384)]:
    qb, T = tiles_work(B, H, L)
    s17 = T  # bh-major, m fastest
    lpt = sorted(T, key=lambda x: (-x[1], x[0]))
    print(B, H, L, 'qb', qb)
    for name, o in [('17 order static', s17), ('lpt static', lpt), ('lpt snake', lpt), ('lpt dyn', lpt),
                    ('grp4 dyn', grouped(T, 4)), ('grp8 dyn', grouped(T, 8)), ('grp16 dyn', grouped(T, 16)),
                    ('grp8 snake', grouped(T, 8)), ('17 order dyn', s17)]:
        f = dynamic if 'dyn' in name else (lambda o: static(o, snake=True)) if 'snake' in name else static
        mk, avg = f(o)
        print(f'  {name:16s} makespan/avg {mk/avg:.3f}')
