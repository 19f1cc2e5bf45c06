"""The Tour page in a real browser (fixtures and helpers of test_browser.py): a link opens a stop, its
recorded speculative trace draws accepted and rejected chips without any model run, Next moves on and
updates the URL. Screenshots go to tests/artifacts/."""
from __future__ import annotations

import pytest

from test_browser import ARTIFACTS, browser, click, idle, page, server, shot, sync_api  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.flaky(reruns=3, reruns_delay=2)]


def test_tour_link_draws_the_recorded_speculative_trace_and_next_moves_on(server, page):  # noqa: F811
    # The first session of a fresh server that opens a deep link gets Streamlit's "Page not found" modal
    # (the pages are known only after a first script run); a real server has had visitors. Warm it up.
    page.goto(server)
    page.get_by_role("button", name="Step", exact=True).wait_for(timeout=60_000)
    idle(page)
    page.goto(f"{server}/tour?stop=speculative")
    page.get_by_role("heading", name="5. Speculative decoding").wait_for(timeout=60_000)
    idle(page)
    page.locator(".ds-chips span.ds-chip.ds-origin-accepted").first.wait_for(timeout=30_000)
    assert page.locator(".ds-chips span.ds-chip.ds-origin-rejected").count() > 0
    page.locator(".js-plotly-plot").first.wait_for(timeout=30_000)   # the round's draft bars
    shot(page, "tour-speculative")
    try:
        page.get_by_role("button", name="Next →", exact=True).click(timeout=30_000)
    except sync_api.TimeoutError:
        page.screenshot(path=str(ARTIFACTS / "tour-next-failure.png"), full_page=True)
        raise
    page.get_by_role("heading", name="6. Parallel drafting with DP selection (DSpark)").wait_for(timeout=30_000)
    idle(page)
    assert "stop=dspark" in page.url
    assert not page.locator('[data-testid="stException"]').count()
    shot(page, "tour-dspark")
