"""The Tour page in a real browser (fixtures and helpers of test_browser.py): a link opens a stop, its
recorded speculative trace draws accepted and rejected chips without any model run, Next moves on and
updates the URL. Screenshots go to tests/artifacts/."""
from __future__ import annotations

import pytest
from browser_support import (  # noqa: F401  (fixtures)
    ARTIFACTS,
    ROOT,
    browser,
    click,
    content_height,
    idle,
    page,
    png_height,
    server,
    shot,
    sync_api,
)

pytestmark = [pytest.mark.browser, pytest.mark.flaky(reruns=3, reruns_delay=2)]


def test_tour_link_draws_the_recorded_speculative_trace_and_next_moves_on(server, page):  # noqa: F811
    # The link is the fresh server's first visit: a shared link must open its page, not "Page not found".
    # (A `pages/` directory beside app.py, even an empty one, makes Streamlit look for pages there before
    # st.navigation has run, and a first visit to a deep link then fails.)
    assert not (ROOT / "pages").exists(), "remove the pages/ directory beside app.py (see the comment above)"
    page.goto(f"{server}/tour?stop=speculative")
    page.get_by_role("heading", name="5. Speculative decoding").wait_for(timeout=60_000)
    idle(page)
    assert page.get_by_text("Page not found").count() == 0 and "/tour" in page.url
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
    taken = shot(page, "tour-dspark")
    assert png_height(taken) >= content_height(page) > page.viewport_size["height"]   # the whole stop, not a window
