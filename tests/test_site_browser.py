"""The built site in headless Chromium: no console errors, no zero-size pictures, working diff tabs;
every figure legible at 1400 px and at 390 px (inline, or in its full-screen view, its smallest text
at least 11 px on screen), its text inside the picture and clear of other text, in both themes; the
gallery's filters and comparison.

Needs chromium + chromedriver (apt: chromium chromium-driver) and selenium (pip); skipped otherwise.
"""

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading

import pytest
from conftest import REPO

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1000")

# Every <img>/<svg> in the article that is displayed (not inside a closed <details>, an inactive tab
# or anything display:none) must have a non-zero box, and images must have loaded.
FIND_EMPTY = """
const bad = [];
for (const el of document.querySelectorAll('.md-content img, .md-content svg')) {
  if (el.tagName.toLowerCase() === 'svg' && el.parentElement.closest('svg')) continue;
  const host = el.tagName.toLowerCase() === 'svg' ? el.parentElement : el;
  if (host.closest('details:not([open])')) continue;
  if (host.offsetParent === null && getComputedStyle(host).position !== 'fixed') continue;
  const r = el.getBoundingClientRect();
  const loaded = el.tagName.toLowerCase() !== 'img' || (el.complete && el.naturalWidth > 0);
  if (r.width < 1 || r.height < 1 || !loaded) bad.push(el.outerHTML.slice(0, 120));
}
return bad;
"""


MIN_TEXT_PX = 11

# Per figure: the smallest text as rendered inline (px), whether it has the full-screen button, and
# its texts that run out of the picture or overlap each other (measured with getBBox).
MEASURE_FIGURES = """
const out = [];
for (const fig of document.querySelectorAll('.md-content figure.hd-figure')) {
  const svg = fig.querySelector('.hd-figure-svg > svg');
  if (!svg || fig.closest('[hidden]') || fig.offsetParent === null) continue;
  const vb = svg.viewBox.baseVal, scale = svg.getBoundingClientRect().width / vb.width;
  let min = Infinity;
  const boxes = [], problems = [];
  for (const t of svg.querySelectorAll('text')) {
    const size = parseFloat(t.getAttribute('font-size'));
    if (size * scale < min) min = size * scale;
    if (!t.textContent.trim()) continue;
    const b = t.getBBox();
    if (t.getAttribute('transform')) continue;  // rotated axis labels: checked in Python (svg.text_problems)
    if (b.x < -1 || b.y < -1 || b.x + b.width > vb.width + 1 || b.y + b.height > vb.height + 1)
      problems.push('clipped: ' + t.textContent);
    boxes.push([b.x + 1, b.y + 1, b.x + b.width - 1, b.y + b.height - 1, t.textContent]);
  }
  if (fig.dataset.kind !== 'timeline') {
    for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
      const a = boxes[i], b = boxes[j];
      if (a[0] < b[2] && b[0] < a[2] && a[1] < b[3] && b[1] < a[3]) problems.push('overlap: ' + a[4] + ' / ' + b[4]);
    }
  }
  out.push({id: fig.id, kind: fig.dataset.kind || '', inline: min, zoom: !!fig.querySelector('.hd-zoom'),
            problems: problems.slice(0, 5)});
}
return out;
"""

# Opens one figure's full-screen view and returns its smallest text on screen (px), then closes it.
FULL_SCREEN = """
const fig = document.getElementById(arguments[0]);
fig.querySelector('.hd-zoom').click();
const viewer = document.querySelector('.hd-viewer');
const svg = viewer.querySelector('svg');
const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
let min = Infinity;
for (const t of svg.querySelectorAll('text')) min = Math.min(min, parseFloat(t.getAttribute('font-size')) * scale);
const open = !viewer.hidden;
viewer.querySelector('button[data-zoom="close"]').click();
return [open, min, viewer.hidden, !!fig.querySelector('.hd-figure-svg > svg')];
"""


def _check_figures(browser, path):
    """Every figure of the page legible at the window's width, and nothing clipped or overlapping."""
    for theme in ("default", "slate"):
        browser.execute_script(f"document.body.setAttribute('data-md-color-scheme', '{theme}')")
        figures = browser.execute_script(MEASURE_FIGURES)
        for f in figures:
            assert not f["problems"], f"{path} {f['id']} ({theme}): {f['problems']}"
            assert f["zoom"], f"{path} {f['id']}: no full-screen view"
            if f["inline"] < MIN_TEXT_PX:  # too small inline: its full-screen view must make it legible
                opened, smallest, closed, back = browser.execute_script(FULL_SCREEN, f["id"])
                assert opened and closed and back, f"{path} {f['id']}: the full-screen view did not open and close"
                assert smallest >= MIN_TEXT_PX - 0.01, f"{path} {f['id']}: {smallest:.1f} px in full screen"
        if theme == "default":
            light = browser.execute_script(
                "return getComputedStyle(document.body).getPropertyValue('--hd-fg').trim()")
        else:
            dark = browser.execute_script("return getComputedStyle(document.body).getPropertyValue('--hd-fg').trim()")
            assert light and dark and light != dark, f"{path}: the figures' colours do not follow the theme"
    browser.execute_script("document.body.setAttribute('data-md-color-scheme', 'default')")
    return figures


def _check_legible_at_both_widths(browser, base, pages):
    counted = 0
    for width in (1400, 390):
        browser.set_window_size(width, 1000)
        for path in pages:
            browser.get(base + path)
            figures = _check_figures(browser, path)
            counted += len(figures)
            if width == 1400 and path != "gallery/":  # the gallery's are thumbnails: full screen reads them
                for f in figures:
                    if f["kind"] in ("memory", "roles", "concept", "chart"):
                        # at page width the text reads inline; the warp roles' labels at 12 px
                        floor = 11.5 if f["kind"] == "roles" else MIN_TEXT_PX - 0.5
                        assert f["inline"] >= floor, f"{path} {f['id']}: {f['inline']:.1f} px inline at 1400 px"
    browser.set_window_size(1400, 1000)
    return counted


def _check_gallery(browser, base):
    browser.get(base + "gallery/")
    grid = browser.find_element("css selector", ".hd-gallery")
    total = int(grid.get_attribute("data-total"))
    def shown():
        return browser.execute_script(
            "return [...document.querySelectorAll('.hd-thumb:not(.hd-thumb-same)')].filter(c => !c.hidden).length")
    assert shown() == total
    browser.find_element("css selector", '.hd-kinds button[data-kind="roles"]').click()
    roles = shown()
    assert 0 < roles < total
    browser.execute_script("const s = document.querySelector('.hd-stage-filter'); s.value = '12';"
                           "s.dispatchEvent(new Event('change'))")
    browser.find_element("css selector", '.hd-kinds button[data-kind=""]').click()
    browser.execute_script("const c = document.querySelector('.hd-compare'); c.checked = true;"
                           "c.dispatchEvent(new Event('change'))")
    cols = browser.execute_script(
        "return [...document.querySelectorAll('.hd-thumb')].filter(c => !c.hidden)"
        ".map(c => [c.dataset.stage, c.style.gridColumn])")
    assert {stage for stage, _ in cols} == {"11", "12"}
    assert all(col == ("1" if stage == "11" else "2") for stage, col in cols)
    assert "compare" in browser.current_url


def _driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS:
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(DRIVER), options=opts)


def _serve(directory):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _build(root, site_dir):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
                         cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and DRIVER):
        pytest.skip("headless Chromium not installed (apt-get install chromium chromium-driver)")
    pytest.importorskip("selenium", reason="selenium not installed (pip install selenium)")
    d = _driver()
    yield d
    d.quit()


def _check_site(browser, site_dir, stage_pages):
    server = _serve(site_dir)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        for path in ["", "gallery/", "models/", *stage_pages]:
            browser.get_log("browser")  # drop what earlier pages logged
            browser.get(base + path)
            errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
            assert not errors, f"{path}: console errors {errors}"
            assert browser.execute_script(FIND_EMPTY) == [], f"{path}: pictures rendered at zero size"
            assert browser.find_elements("css selector", "h1"), f"{path}: no title"
        # The diff tabs of a stage with a predecessor switch between unified and side by side.
        if len(stage_pages) > 1:
            browser.get(base + stage_pages[1] + "#diff")
            tabs = browser.find_elements("css selector", ".tabbed-set")
            assert tabs, "no diff tabs"
            unified = tabs[0].find_element("css selector", ".hd-unified")
            split = tabs[0].find_element("css selector", ".hd-split")
            assert unified.is_displayed() and not split.is_displayed()
            label = tabs[0].find_element("css selector", ".tabbed-labels label:nth-child(2)")
            browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", label)
            label.click()
            assert split.is_displayed() and not unified.is_displayed()
            # a folded run of unchanged lines opens on click
            fold = split.find_elements("css selector", "details.hd-fold")
            if fold:
                summary = fold[0].find_element("css selector", "summary")
                browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", summary)
                summary.click()
                assert fold[0].get_attribute("open") is not None
            errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
            assert not errors, f"console errors after switching tabs: {errors}"
    finally:
        server.shutdown()


def test_fixture_site_in_browser(browser, site_root):
    _build(site_root, site_root / "site")
    _check_site(browser, site_root / "site", ["stages/01-baseline/", "stages/02-smem-tiles/", "stages/03-ldmatrix/"])


def test_real_site_in_browser(browser, tmp_path):
    _build(REPO, tmp_path / "site")
    pages = sorted(f"stages/{p.name}/" for p in (tmp_path / "site" / "stages").iterdir() if p.is_dir())
    _check_site(browser, tmp_path / "site", pages)
    server = _serve(tmp_path / "site")
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        counted = _check_legible_at_both_widths(
            browser, base, ["", "gallery/", "introduction/", "hopper/", "models/", *pages])
        assert counted >= 2 * 100  # every stage's figures, the gallery's, the hand-written pages'
        _check_gallery(browser, base)
    finally:
        server.shutdown()
