"""The figures' colours read in both themes: every text 4.5:1 against what it is drawn on and every
graphic 3:1 (WCAG 2.2, 1.4.3 and 1.4.11), computed from docs/assets/stylesheets/diagrams.css, which
defines the theme variables, for the pairs the figures draw (site_gen/diagrams/svg.py contrast_pairs:
operand colours as text and as bars, labels on bars at their faintest opacity, the text of tinted
boxes and of highlights, outlines). Pure Python: no browser."""

import re

import pytest
from conftest import REPO

from site_gen.diagrams.svg import LABEL_OPACITY, PALETTE, STRONG, contrast_pairs

CSS = REPO / "docs" / "assets" / "stylesheets" / "diagrams.css"
THEMES = ("default", "slate")


def _themes() -> dict[str, dict[str, str]]:
    css = CSS.read_text()
    out = {}
    for theme in THEMES:
        block = re.search(r'\[data-md-color-scheme="' + theme + r'"\]\s*\{([^}]*)\}', css)
        assert block, f"no [data-md-color-scheme={theme}] block in {CSS.name}"
        out[theme] = dict(re.findall(r"--hd-([a-z0-9]+):\s*(#[0-9a-fA-F]{6})\s*;", block.group(1)))
    return out


def _rgb(hex_colour: str) -> tuple[float, float, float]:
    h = hex_colour.lstrip("#")
    return tuple(int(h[i:i + 2], 16) / 255 for i in (0, 2, 4))


def _luminance(rgb) -> float:
    def lin(v):
        return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4

    r, g, b = (lin(v) for v in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def ratio(a, b) -> float:
    la, lb = _luminance(a), _luminance(b)
    return (max(la, lb) + 0.05) / (min(la, lb) + 0.05)


def _over(top, alpha: float, under):
    """``top`` at ``alpha`` over ``under``, as a browser composites (in sRGB)."""
    return tuple(alpha * t + (1 - alpha) * u for t, u in zip(top, under))


def surface(spec: str, colours: dict[str, str]):
    """A surface of contrast_pairs: "key", "key@alpha" (over bg) or "key@alpha/under@alpha"."""
    under = _rgb(colours["bg"])
    for layer in reversed(spec.split("/")):
        key, _, alpha = layer.partition("@")
        under = _over(_rgb(colours[key]), float(alpha or 1), under)
    return under


def test_the_reference_numbers():
    assert ratio(_rgb("#ffffff"), _rgb("#000000")) == pytest.approx(21.0)
    assert ratio(_rgb("#777777"), _rgb("#ffffff")) == pytest.approx(4.48, abs=0.01)
    # the brief's measurements of the old palette, reproduced: white on orange, amber on white
    assert ratio(_rgb("#ffffff"), _rgb("#d9822b")) == pytest.approx(2.93, abs=0.01)
    assert ratio(_rgb("#e0a100"), _rgb("#ffffff")) == pytest.approx(2.27, abs=0.01)


def test_every_key_is_defined_in_both_themes_and_the_fallbacks_are_the_light_theme():
    themes = _themes()
    for theme, colours in themes.items():
        assert set(PALETTE) <= set(colours), (theme, sorted(set(PALETTE) - set(colours)))
    assert {k: v.lower() for k, v in themes["default"].items() if k in PALETTE} == PALETTE
    assert set(STRONG) <= set(PALETTE) and 0.5 < LABEL_OPACITY <= 1


@pytest.mark.parametrize("theme", THEMES)
def test_text_and_graphics_contrast(theme):
    colours = _themes()[theme]
    failures, counted = [], {"text": 0, "label": 0, "graphic": 0}
    for what, ink, on, minimum in contrast_pairs():
        r = ratio(surface(ink, colours), surface(on, colours))
        counted[what] += 1
        if r < minimum - 1e-9:
            failures.append(f"{what}: {ink} on {on}: {r:.2f} < {minimum}")
    assert not failures, f"{theme}: {len(failures)} pairs below the threshold:\n" + "\n".join(failures)
    assert counted["text"] >= 100 and counted["label"] >= 2 * len(STRONG) and counted["graphic"] >= 3 * len(STRONG)


def test_the_pairs_cover_what_the_figures_draw():
    pairs = contrast_pairs()
    inks = {ink for _what, ink, _on, _min in pairs}
    assert {"fg", "muted", "on", "hlfg"} | set(STRONG) <= inks | {"stroke", "hlline"}
    surfaces = {on for _what, _ink, on, _min in pairs}
    for needed in ("bg", "panel", "panel2", "hl", "skip", f"k@{LABEL_OPACITY}", "k@0.2/hl@0.6"):
        assert needed in surfaces, needed
    # text 4.5:1, graphics 3:1
    assert {m for what, _i, _o, m in pairs if what in ("text", "label")} == {4.5}
    assert {m for what, _i, _o, m in pairs if what == "graphic"} == {3.0}
