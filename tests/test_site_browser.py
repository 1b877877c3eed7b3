"""The built site in headless Chromium: no console errors, no zero-size pictures, working diff tabs.

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
        for path in ["", "gallery/", *stage_pages]:
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
