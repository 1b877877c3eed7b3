"""Part II's pages in headless Chromium, with tests/test_site_browser.py's checks: the overview and
three RMSNorm stage pages load without console errors or zero-size pictures, their diff tabs work;
every figure legible at 1400 and 390 px (each clicked open full screen), its text against what is
under it in both themes; at 390 px every Part II figure reads inline (11 px or more, scrolling
sideways with its hint) and the page itself is not wider than the screen; the not-measured state.

Needs chromium + chromedriver and selenium; skipped otherwise.
"""

import pytest
from conftest import make_site
from test_rmsnorm_site import add_rmsnorm
from test_site_browser import (  # noqa: F401  (browser: the module's fixture, used here too)
    MIN_TEXT_PX,
    PICK_FIGURES,
    _build,
    _check_figures,
    _check_full_screen,
    _check_lead,
    _check_site,
    _contrast,
    _get,
    _page_state,
    _serve,
    _width,
    browser,
)

pytestmark = pytest.mark.browser

STAGE_PAGES = ["rmsnorm/01-row-per-thread/", "rmsnorm/04-row-in-registers/", "rmsnorm/05-cluster-rows/"]
PART_II_KINDS = ("holders", "reduction", "traffic")

# Every Part II figure on the page, as shown inline: its smallest text on screen, whether it scrolls
# sideways, and whether its hint says so.
INLINE = """
const out = [];
for (const fig of document.querySelectorAll('.md-content figure.hd-figure')) {
  if (!arguments[0].includes(fig.dataset.kind || '')) continue;
  const pic = fig.querySelector('.hd-figure-svg'), svg = pic.querySelector('svg');
  const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
  let min = Infinity;
  for (const t of svg.querySelectorAll('text')) min = Math.min(min, parseFloat(getComputedStyle(t).fontSize) * scale);
  const hint = fig.querySelector('.hd-scroll-hint');
  out.push({id: fig.id, min: min, scrolls: pic.scrollWidth > pic.clientWidth + 1,
            hint: !!hint && getComputedStyle(hint).display !== 'none'});
}
return out;
"""


def test_part_ii_in_browser(browser, tmp_path):  # noqa: F811  (the fixture imported above)
    root = add_rmsnorm(make_site(tmp_path / "repo"))
    _build(root, root / "site")
    _check_site(browser, root / "site", [*STAGE_PAGES, "rmsnorm/"])  # the second has a predecessor: diff tabs
    server = _serve(root / "site")
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        for width in (1400, 390):
            _width(browser, width)
            for path in ["rmsnorm/", *STAGE_PAGES]:
                _get(browser, base + path)
                figures = _check_figures(browser, path)
                kinds = {f["kind"] for f in figures}
                if path == "rmsnorm/":
                    assert "chart" in kinds, f"{path}: no climb frame; the page: {_page_state(browser)}"
                else:
                    assert kinds & set(PART_II_KINDS), f"{path} at {width} px: {figures}"
                if width == 390 and path != "rmsnorm/":
                    _check_lead(browser, path)
                    for f in browser.execute_script(INLINE, list(PART_II_KINDS)):
                        assert f["min"] >= MIN_TEXT_PX - 0.01, f"{path} {f['id']}: {f['min']:.1f} px inline at 390 px"
                        assert f["scrolls"] and f["hint"], f"{path} {f['id']}: {f}"
                if width == 1400:
                    assert not _contrast(browser, path)
                    if path != "rmsnorm/":
                        text = browser.find_element("id", "benchmark").find_element("xpath", "following-sibling::p").text
                        assert text.startswith("Not measured yet."), f"{path}: {text[:80]}"
                for fig_id, kind, folded in browser.execute_script(PICK_FIGURES):
                    _check_full_screen(browser, f"{path} {fig_id} ({kind}) at {width} px", fig_id, folded)
    finally:
        _width(browser, 1400)
        server.shutdown()
