"""Issue 46 at projector size (1280×800) in a real browser: Compare's verdict line in the first screen, a result
marked out of date when the settings change, and a link that lands on the teacher's step. Screenshots of what
the window shows go to tests/artifacts/ (git-ignored), to be looked at, not only asserted."""
from __future__ import annotations

import re
import urllib.request

import pytest
from browser_support import (  # noqa: F401  (fixtures)
    ARTIFACTS,
    browser,
    chip,
    choose,
    click,
    idle,
    open_app,
    server,
    settle,
)

pytestmark = [pytest.mark.browser, pytest.mark.flaky(reruns=2, reruns_delay=2)]
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright for python is not installed")

PROJECTOR = {"width": 1280, "height": 800}
REPEAT = "one two three one two three one two three one two"


@pytest.fixture
def projector(browser):  # noqa: F811  (browser is test_browser's fixture)
    context = browser.new_context(viewport=PROJECTOR)
    pg = context.new_page()
    yield pg
    context.close()


def window_shot(page, name: str) -> None:
    """What the projector shows: the window, not the whole page."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    settle(page)
    page.wait_for_timeout(600)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def in_window(locator) -> bool:
    box = locator.bounding_box()
    return box is not None and 0 <= box["y"] and box["y"] + box["height"] <= PROJECTOR["height"]


def pick(page, label: str, option: str) -> None:
    choose(page, label, page.get_by_role("option", name=option, exact=True))


def test_compare_verdict_and_stale_marker_at_projector_size(server, projector):  # noqa: F811
    page = projector
    page.goto(f"{server}/compare?max_new=12&chat=0&prompt=" + urllib.request.quote(REPEAT))
    run = page.get_by_role("button", name="Run the comparison")
    run.wait_for(timeout=60_000)
    idle(page)
    pick(page, "Lane 2", "speculative")
    run.click()
    line = page.get_by_text("All 2 lanes emitted the same 12 tokens: token-identical to greedy.")
    line.wait_for(timeout=90_000)
    idle(page)
    page.get_by_text("Made with:", exact=False).first.wait_for(timeout=30_000)
    assert in_window(line), line.bounding_box()            # the verdict leads: no scrolling to find it
    assert not page.locator(".ds-chips span.ds-origin-rejected").count()   # the text, not the drafting
    window_shot(page, "projector-compare-verdict")
    box = page.get_by_label("Max new tokens")
    box.fill("10")
    box.press("Enter")
    stale = page.get_by_text(re.compile(r"the settings have changed since \(max new tokens 12 → 10\); run again"))
    stale.wait_for(timeout=30_000)
    assert in_window(stale)
    window_shot(page, "projector-compare-stale")
    assert not page.locator('[data-testid="stException"]').count()


def test_a_link_lands_on_the_teachers_round(server, projector):  # noqa: F811
    page = projector
    query = "?strategy=speculative&draft=lookup&gamma=3&max_new=12&chat=0&step=2&prompt=" + urllib.request.quote(REPEAT)
    open_app(page, server, query)
    page.locator(f"{chip(2)}.ds-current").first.wait_for(timeout=60_000)
    note = page.get_by_text("Opened on step 2, the step the link was made on")
    note.wait_for(timeout=30_000)
    page.get_by_text("KV rolled back (target)").first.wait_for(timeout=30_000)   # the round panel, not "Press Step"
    idle(page)
    assert page.locator(".ds-chips span.ds-chip[data-step='3']").count() == 0   # replayed to the round, no further
    assert not page.get_by_text("Press Step").count()
    assert re.search(r"[?&]step=2\b", page.url), page.url
    assert in_window(note)
    window_shot(page, "projector-link-round")
    click(page, "◀ Back")                                             # a fragment rerun: the URL follows
    page.locator(f"{chip(1)}.ds-current").first.wait_for(timeout=30_000)
    page.wait_for_url(re.compile(r"[?&]step=1\b"), timeout=30_000)
    assert not page.locator('[data-testid="stException"]').count()
