"""What the browser tests share: the app served by `streamlit run` on the tiny model (or DECODESCOPE_BROWSER_MODEL),
Debian's Chromium through Playwright, and helpers to drive a page and take its screenshot (tests/artifacts/,
git-ignored). A test module that imports it is skipped, with the reason, where Chromium or Playwright is missing."""
from __future__ import annotations

import os
import struct
import urllib.request
from pathlib import Path

import pytest

from bench.browser import CHROMIUM, launch_chromium, streamlit_server
from bench.tiny_model import build_tiny_model_dir

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"
MAX_NEW = 12
LONG_RUN = 8000      # tokens asked of the run that Stop interrupts
SHOT_MAX_PX = 12_000  # the tallest screenshot taken (the window grows to the page's content for it)

if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is missing (install Debian's chromium package to run the browser tests)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright for python is not installed")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = os.environ.get("DECODESCOPE_BROWSER_MODEL")   # e.g. "default" for screenshots of real text
    if not model:
        model = str(build_tiny_model_dir(tmp_path_factory.mktemp("tiny_browser_model")))
    env = {**os.environ, "DECODESCOPE_MODEL": model}
    with streamlit_server(ROOT / "app.py", env, tmp_path_factory.mktemp("log") / "streamlit.log", cwd=ROOT) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        chromium = launch_chromium(p)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    # A projector's window (issue 46); shot() grows it to the page's height for a screenshot of the whole page.
    context = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    pg = context.new_page()
    yield pg
    context.close()


def settle(page) -> None:
    """Wait for the rerun to finish drawing (no stale elements left)."""
    try:
        page.wait_for_function("() => !document.querySelector('[data-stale=\"true\"]')", timeout=15_000)
    except sync_api.TimeoutError:
        pass


def content_height(page) -> int:
    """The height the page's content needs (px). Streamlit scrolls its main area inside a container, so the
    document is only as tall as the window and a full-page screenshot alone ends where the window does."""
    return page.evaluate("() => Math.max(document.documentElement.scrollHeight, ...[...document.querySelectorAll('*')]"
                         ".filter(e => /(auto|scroll)/.test(getComputedStyle(e).overflowY)).map(e => e.scrollHeight))")


def png_height(path: Path) -> int:
    return struct.unpack(">I", path.read_bytes()[20:24])[0]      # the IHDR chunk: width, then height


def shot(page, name: str) -> Path:
    """A screenshot of the whole page: the window grows to the content's height for it (up to SHOT_MAX_PX)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    settle(page)
    page.wait_for_timeout(600)          # let plotly finish drawing
    window = page.viewport_size
    tall = min(SHOT_MAX_PX, max(window["height"], content_height(page)))
    page.set_viewport_size({"width": window["width"], "height": tall})
    page.wait_for_timeout(300)          # the layout follows the window
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size(window)
    return path


def sideways(page) -> list[int]:
    """How far each table on the page scrolls sideways (its grid's width beyond its box, px)."""
    return page.evaluate("() => [...document.querySelectorAll('[data-testid=\"stDataFrame\"] .dvn-scroller')]"
                         ".map(e => e.scrollWidth - e.clientWidth)")


def show_lattice(page) -> None:
    """A DSpark tree round opens on its tree: switch it to the lattice (a chain round shows only that)."""
    choice = page.get_by_text("the lattice (all candidates)", exact=True)
    if choice.count():
        choice.first.click()
        idle(page)


def chip(step: int) -> str:
    return f'.ds-chips span.ds-chip[data-step="{step}"]'


def click(page, label: str) -> None:
    page.get_by_role("button", name=label, exact=True).click()


def choose(page, label: str, option) -> None:
    """Pick `option` (a locator) from the select box labelled `label`. The box is scrolled into view first: its
    list closes when the page scrolls, and a click that has to scroll the box into view can open and close it
    at once (after a rerun this happened every time), so the box is opened again until the list shows."""
    box = page.locator('[data-testid="stSelectbox"]').filter(has_text=label).locator("input")
    box.scroll_into_view_if_needed()
    for _ in range(3):
        page.wait_for_timeout(200)       # the scroll settles
        box.click()
        try:
            option.wait_for(timeout=5_000)
            break
        except sync_api.TimeoutError:
            page.keyboard.press("Escape")
    option.click()
    idle(page)


def open_app(page, url: str, query: str = "") -> None:
    page.goto(f"{url}/{query}")
    page.get_by_role("button", name="Step", exact=True).wait_for(timeout=60_000)
    idle(page)


def idle(page) -> None:
    """Wait until Streamlit has finished the current script run (no running indicator, nothing stale),
    so that the next click is not lost in a rerun that is still drawing."""
    try:
        page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]') "
                               "&& !document.querySelector('[data-stale=\"true\"]')", timeout=30_000)
    except sync_api.TimeoutError:
        pass


def dspark_link(page, server: str) -> str:
    """The query of the DSpark screenshot's run. The tiny test model: its test drafter at γ = 3 (round 1: the
    first draft accepted, the second rejected). Another model (DECODESCOPE_BROWSER_MODEL): DSpark at its
    defaults (the trained head where one fits, else token recycling; prompt lookup) on the tour's copy prompt."""
    if os.environ.get("DECODESCOPE_BROWSER_MODEL"):
        from ui.views.tour import COPY_PROMPT

        return f"?strategy=dspark&max_new=40&prompt={urllib.request.quote(COPY_PROMPT)}"
    from dspark_helpers import app_drafter

    open_app(page, server, "?max_new=1")
    drafter = app_drafter(page.get_by_role("textbox", name="Model").input_value())
    return f"?strategy=dspark&gamma=3&max_new=8&drafter={urllib.request.quote(drafter)}"
