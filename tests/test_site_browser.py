"""The built website as a reader sees it: every page of _toc.yml opened in headless Chromium
(Debian's package, driven by playwright without a browser download) from a local server, offline.

On every page: the math is typeset by MathJax (served by the site itself) and no raw TeX is left,
every image loaded, the console stays free of errors (and no request failed), every link of the
sidebar (and of the intro's text) leads to a page and anchor that exist, and no test or solution
marker or progress bar shows in the text. Screenshots of the intro, chapter 3 and chapter 8 are
written to _build/screenshots/ (docs/screenshots/ keeps a copy to look at).

`make test` builds the site and installs Chromium when missing (as root, with apt-get); without
Chromium the test skips, except under CI (CI=true), where it fails.
"""
from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
SCREENSHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = {"book/intro": "intro", "book/03_tiled": "chapter3", "book/08_backprop": "chapter8"}
# What must never reach a reader: test markers, solution markers, progress bars, save notes.
DEBRIS = re.compile(r"NBVAL_|nbval-|BEGIN SOLUTION|END SOLUTION|\d+%\|[^\n]*\|\s*\d+/\d+|^saved \d+ rows? to ",
                    re.MULTILINE)

NO_CHROMIUM = "no chromium on this machine: apt-get install chromium (make test installs it as root)"
if not (HTML / "index.html").is_file():
    pytestmark = pytest.mark.skip(reason="no built site: run `make book` first (make test does)")
elif CHROMIUM is None and not os.environ.get("CI"):
    pytestmark = pytest.mark.skip(reason=NO_CHROMIUM)


def toc_pages() -> list[str]:
    return re.findall(r"^\s*(?:root|- file):\s*(\S+)", (ROOT / "_toc.yml").read_text(), re.MULTILINE)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site():
    """The built site, served on 127.0.0.1 (a free port) for this module's tests."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(HTML)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    thread.join()


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:  # only under CI (elsewhere the module skips): CI must run these tests
        pytest.fail(NO_CHROMIUM)
    from playwright.sync_api import sync_playwright  # the test extra: pip install -e '.[test]'
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile, sync_playwright() as p:
        # a fresh profile each run; playwright drives Debian's chromium and downloads no browser
        context = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1280, "height": 900}, service_workers="block")
        yield context
        context.close()


@functools.lru_cache(maxsize=None)
def _fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""


def _resolves(url: str) -> str | None:
    """None when url's page exists (and its #anchor, if any), else what is wrong."""
    page, _, anchor = url.partition("#")
    status, text = _fetch(page)
    if status != 200:
        return f"HTTP {status}"
    if anchor and not re.search(rf"""id=["']{re.escape(urllib.parse.unquote(anchor))}["']""", text):
        return f"no element with id '{anchor}' on that page"
    return None


# Runs in the page once MathJax is done: what the assertions below look at.
INSPECT = r"""async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  await Promise.all([...document.images].map(img => { img.loading = "eager"; return img.decode().catch(() => null); }));
  const skip = el => el.closest("pre, code, script, style, mjx-container, .MathJax");
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const rawTex = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (!skip(n.parentElement) && /\\\(|\\\)|\\\[|\\\]|\$\$/.test(n.textContent)) rawTex.push(n.textContent.trim().slice(0, 80));
  }
  const math = [...document.querySelectorAll(".math")];
  const links = sel => [...document.querySelectorAll(sel)].map(a => a.href).filter(h => h);
  return {
    mathElements: math.length,
    mathTypeset: math.filter(el => el.querySelector("mjx-container")).length,
    rawTex,
    brokenImages: [...document.images].filter(img => !(img.complete && img.naturalWidth > 0)).map(img => img.src),
    images: document.images.length,
    sidebarLinks: links(".bd-sidebar-primary a.reference, .bd-sidebar-primary .navbar-brand"),
    articleLinks: links("article.bd-article a.reference.internal, article.bd-article a[href$='.html']"),
    text: document.body.innerText,
  };
}"""


@pytest.mark.parametrize("page", toc_pages())
def test_page_reads_right_in_a_browser(page, site, browser):
    tab = browser.new_page()
    problems = []
    tab.on("console", lambda m: m.type == "error" and problems.append(f"console error: {m.text}"))
    tab.on("pageerror", lambda e: problems.append(f"uncaught: {e}"))
    tab.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} ({r.failure})"))
    tab.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"))
    try:
        tab.goto(urllib.parse.urljoin(site, f"{page}.html"), wait_until="load")
        seen = tab.evaluate(INSPECT)
        tab.wait_for_timeout(200)  # late console messages (deferred scripts) land here
        if page in SHOTS:
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            first_display = tab.locator("div.math").first
            if SHOTS[page] == "chapter8" and first_display.count():
                first_display.scroll_into_view_if_needed()  # the dX and dW equations
            tab.screenshot(path=str(SCREENSHOTS / f"{SHOTS[page]}.png"))
    finally:
        tab.close()

    assert not problems, f"{page}: " + "; ".join(problems)
    assert seen["mathTypeset"] == seen["mathElements"], (
        f"{page}: MathJax typeset {seen['mathTypeset']} of {seen['mathElements']} formulas "
        "(is _static/mathjax in the site? `make book` copies it from the mathjax npm package)")
    assert not seen["rawTex"], f"{page}: raw TeX on the page: {seen['rawTex'][:3]}"
    assert not seen["brokenImages"], f"{page}: images that did not load: {seen['brokenImages']}"
    debris = DEBRIS.findall(seen["text"])
    assert not debris, f"{page}: markers or progress output in the text: {debris[:3]} (scripts/tidy_notebooks.py)"
    assert seen["sidebarLinks"], f"{page}: no sidebar links found"
    links = seen["sidebarLinks"] + (seen["articleLinks"] if page == "book/intro" else [])
    broken = {url: why for url in dict.fromkeys(links)
              if url.startswith(site) and (why := _resolves(url)) is not None}
    assert not broken, f"{page}: links that lead nowhere: {broken}"


def test_intro_links_every_chapter(site):
    status, text = _fetch(urllib.parse.urljoin(site, "book/intro.html"))
    assert status == 200
    chapters = [p.split("/")[-1] for p in toc_pages() if p.startswith("book/0")]
    article = text[text.find("<article"):]
    missing = [c for c in chapters if f'href="{c}.html' not in article]
    assert not missing, f"book/intro.md's chapter list does not link {missing}"
