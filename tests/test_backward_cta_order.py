"""Backward stage 10's start order of the causal CTAs (``[launch] cta_order = "heavy-first"``) and its
figure: site_gen's heavy_first_order against the kernel's cta_tile() (a transcription of its index
arithmetic, and the function's own lines read from kernel.cu), the model's makespans, and the figure
on stage 10's page only."""

from __future__ import annotations

import re

import pytest
from hopattn import lineage

from site_gen.diagrams.backward import backward_diagrams
from site_gen.diagrams.backward import cta_order as co
from site_gen.diagrams.svg import text_problems

TEN = "10_heavy-first"
NINE = "09_out-of-phase"

# (key blocks, K/V heads, batch, SMs, WINDOW_WAVES)
GRIDS = [
    (6, 5, 1, 8, 2),       # the figure's example: windows of 3 pairs, the last of 2
    (64, 8, 1, 132, 2),    # Llama-3.1-8B at 8k, batch 1: windows of 5 pairs, the last of 3
    (32, 16, 8, 132, 2),   # 16 heads x 8 batches at 4k: 128 pairs in windows of 9, the last of 2
    (4, 2, 1, 8, 2),       # fewer pairs than ceil(2 * 8 / 4) = 4: one window of both
    (1, 3, 2, 132, 2),     # one key block: every pair in one window
    (200, 1, 1, 132, 2),   # more key blocks than two waves: a window of one pair
    (300, 3, 2, 132, 1),   # windows of one pair, pairs over two dimensions
    (7, 3, 3, 10, 3),      # ceil(30 / 7) = 5 pairs a window of 9: 5 + 4
    (5, 4, 2, 16, 2),      # ceil(32 / 5) = 7 of 8: 7 + 1
]


@pytest.fixture(scope="module")
def stages():
    return lineage.discover(lineage.BACKWARD_DIR)


def _stage(stages, name):
    return next(s for s in stages if s.dir.name == name)


def cuda_cta_tile(block, grid, sms, window_waves):
    """cta_tile()'s default causal branch, statement by statement (unsigned arithmetic on values
    that do not wrap: / and % are Python's // and % on non-negative integers)."""
    bx, by, bz = block
    gx, gy, gz = grid
    key_blocks, pairs = gx, gy * gz
    window = min(pairs, max(1, (window_waves * sms + key_blocks - 1) // key_blocks))
    linear = bx + gx * (by + gy * bz)
    first_pair = linear // (window * key_blocks) * window
    in_window = linear % (window * key_blocks)
    width = min(window, pairs - first_pair)
    pair = first_pair + in_window % width
    return in_window // width, pair % gy, pair // gy


def _split_top(s: str) -> list[str]:
    """``s`` split at the commas outside parentheses."""
    out, depth, cur = [], 0, ""
    for ch in s:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return out + [cur]


def _py(expr: str) -> str:
    expr = re.sub(r"\b(\d+)u\b", r"\1", expr)
    expr = expr.replace("gridDim.x", "gx").replace("gridDim.y", "gy").replace("gridDim.z", "gz")
    expr = expr.replace("blockIdx.x", "bx").replace("blockIdx.y", "by").replace("blockIdx.z", "bz")
    expr = re.sub(r"\bint\(", "(", expr)
    return expr.replace("/", "//")


def kernel_cta_tile(kernel_text: str):
    """The kernel's own cta_tile(): its unsigned declarations from the SM count on, and its return,
    read from kernel.cu and evaluated as Python (so an edit to the kernel shows here)."""
    body = kernel_text[kernel_text.index("CtaTile cta_tile("):]
    body = body[body.index("{") + 1:body.index("\n}\n")]
    lines = [re.sub(r"//.*", "", ln).strip() for ln in body.splitlines()]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("const unsigned key_blocks"))
    stmts = []
    for ln in lines[start:]:
        if ln.startswith("const unsigned"):
            for decl in _split_top(ln[len("const unsigned"):].rstrip(";")):
                name, expr = decl.split("=", 1)
                stmts.append(f"{name.strip()} = {_py(expr.strip())}")
        elif ln.startswith("return"):
            inner = re.match(r"return \{(.*)\};", ln).group(1)
            stmts.append("result = (" + ", ".join(_py(x.strip()) for x in _split_top(inner)) + ")")
        elif ln:
            raise AssertionError(f"cta_tile() has a line this test does not read: {ln!r}")
    code = "\n".join(stmts)

    def tile(block, grid, sms, waves):
        env = {"min": min, "max": max, "sms": sms, "WINDOW_WAVES": waves, "bx": block[0], "by": block[1],
               "bz": block[2], "gx": grid[0], "gy": grid[1], "gz": grid[2]}
        exec(code, env)
        return env["result"]

    return tile


def _linear_blocks(grid):
    gx, gy, gz = grid
    return [(x, y, z) for z in range(gz) for y in range(gy) for x in range(gx)]  # blockIdx.x fastest


@pytest.mark.parametrize("kb,kv,batch,sms,waves", GRIDS)
def test_heavy_first_order_is_a_permutation_and_the_kernel_s(kb, kv, batch, sms, waves, stages):
    pairs = kv * batch
    order = co.heavy_first_order(kb, pairs, sms, waves)
    assert len(order) == kb * pairs
    assert sorted(order) == sorted((j, p) for j in range(kb) for p in range(pairs))
    grid = (kb, kv, batch)
    kernel = kernel_cta_tile(_stage(stages, TEN).kernel_path.read_text())
    for (j, pair), block in zip(order, _linear_blocks(grid), strict=True):
        want = cuda_cta_tile(block, grid, sms, waves)
        assert (j, pair % kv, pair // kv) == want, (block, want)
        assert kernel(block, grid, sms, waves) == want, block
    # within each window: key block 0 of every pair first, the window's pairs fastest
    window = co.window_size(kb, pairs, sms, waves)
    for first in range(0, pairs, window):
        width = min(window, pairs - first)
        chunk = order[first * kb:(first + width) * kb]
        assert chunk == [(j, first + p) for j in range(kb) for p in range(width)]


def test_the_windows_and_the_orders_are_as_stated():
    assert co.window_size(64, 8, 132, 2) == 5  # Llama: ceil(264 / 64)
    assert co.window_size(4, 2, 8, 2) == 2  # no more than the pairs
    assert co.window_size(200, 1, 132, 2) == 1
    assert co.blockidx_order(3, 2) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    # the steps of a causal CTA, the kernel's first_query_block: (L - 128 j) / 64 query blocks x group
    assert [co.cta_steps(j, 768, 768, 64, 128, 4) for j in range(6)] == [48, 40, 32, 24, 16, 8]
    assert co.cta_steps(1, 100, 300, 64, 128, 1) == 2  # len_k > len_q: key block 1 sees all 2 blocks
    assert co.cta_steps(2, 300, 300, 64, 128, 1) == 1  # rows padded to 320: query block 4 alone


def test_window_waves_is_the_kernel_s(stages):
    ten = _stage(stages, TEN)
    text = ten.kernel_path.read_text()
    assert ten.cta_order == "heavy-first"
    assert co.window_waves(ten) == int(re.search(r"constexpr int WINDOW_WAVES = (\d+);", text).group(1)) == 2
    with pytest.raises(ValueError, match="WINDOW_WAVES"):
        co.window_waves(_stage(stages, NINE))


def test_the_model_s_makespans(stages):
    ten = _stage(stages, TEN)
    m = co.model(co.EXAMPLE, ten.block_m, ten.block_n, co.window_waves(ten))
    old, new = co.makespan(m.blockidx), co.makespan(m.heavy)
    assert new <= old
    assert (old, new) == (128, 112)
    # every CTA placed once, no SM running two at a time
    for placed in (m.blockidx, m.heavy):
        assert sorted(cta for *_x, cta in placed) == sorted(co.blockidx_order(co.EXAMPLE.key_blocks,
                                                                              co.EXAMPLE.pairs))
        for sm in range(co.EXAMPLE.sms):
            runs = sorted((s, e) for k, s, e, _c in placed if k == sm)
            assert all(a[1] <= b[0] for a, b in zip(runs, runs[1:]))
    big = co.model(co.LLAMA, ten.block_m, ten.block_n, 2)
    assert co.makespan(big.heavy) <= co.makespan(big.blockidx)


def test_stage_10_s_figure_draws(stages):
    ten = _stage(stages, TEN)
    d = co.cta_order_diagram(ten, stages)
    assert d.id == "b10-cta-order" and d.kind == "cta-order" and d.stage == 10
    assert text_problems(d.svg, d.width, d.height) == []
    assert min(float(x) for x in re.findall(r'font-size="([\d.]+)"', d.svg)) >= 12
    colours = re.findall(r'(?:fill|stroke)="([^"]*)"', d.svg)
    assert colours and all(v == "none" or v.startswith("var(--hd-") for v in colours)  # the theme's only
    for text in ("ends at 128", "ends at 112", "window 2 starts", "Stage 09 · blockIdx order",
                 "WINDOW_WAVES = 2", "on 8 SMs (the H200 has 132)"):
        assert text in d.svg, text
    for text in ("A model, not a measurement", "greedy placement", "the same cost", "132 SMs", "512 CTAs",
                 "128 → 112 steps"):
        assert text in d.caption, text


def test_stage_09_keeps_its_four_figures_and_stage_10_has_five(stages):
    nine, ten = _stage(stages, NINE), _stage(stages, TEN)
    assert [d.kind for d in backward_diagrams(nine, stages)] == ["memory", "dq", "roles", "timeline"]
    figures = backward_diagrams(ten, stages)
    assert [d.kind for d in figures] == ["memory", "dq", "roles", "cta-order", "timeline"]
    for s in stages:
        if s.cta_order == "blockidx":
            assert len(backward_diagrams(s, stages)) == 4, s.name


def test_the_figure_is_deterministic(stages):
    ten = _stage(stages, TEN)
    a, b = co.cta_order_diagram(ten, stages), co.cta_order_diagram(ten, stages)
    assert a.svg.encode() == b.svg.encode() and a.standalone.encode() == b.standalone.encode()
    assert a.caption == b.caption and a.signature == b.signature
