"""Every page at a projector's 1280×800 and at 1920×1080 (issue 46, item 3): the Playground under each strategy
family, Compare, What-if, Traces (a recorded DSpark tree round), the Tour's stops and the Lab. Each view is drawn
once, at 1280×800, then checked there and again after the window is resized to 1920×1080 (the browser reflows it;
no rerun): nothing scrolls sideways, no text is cut off, chart text is at least 12 px and no chart title sits under
the toolbar (tests/layout_checks.py). A screenshot of each view at 1280×800 goes to tests/artifacts/layout-*.png,
to be looked at, not only asserted on. One server for the module (the tiny model)."""
from __future__ import annotations

import re
import urllib.request

import pytest
from browser_support import (  # noqa: F401  (fixtures)
    ARTIFACTS,
    ROOT,
    browser,
    chip,
    choose,
    click,
    dspark_link,
    idle,
    open_app,
    server,
    settle,
    shot,
)
from layout_checks import layout_problems

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.flaky(reruns=2, reruns_delay=2)]

PROJECTOR = {"width": 1280, "height": 800}
DESKTOP = {"width": 1920, "height": 1080}
LOOKUP_PROMPT = "one two three one two three one two three one two"


@pytest.fixture
def page(browser):  # noqa: F811
    context = browser.new_context(viewport=PROJECTOR, accept_downloads=True)
    pg = context.new_page()
    yield pg
    context.close()


def check_both_sizes(page, name: str) -> None:
    """The view as drawn, at 1280×800 (screenshot layout-<name>.png, the window's width, the page's whole
    height) and at 1920×1080: no problem at either."""
    settle(page)
    idle(page)
    page.wait_for_timeout(800)                  # plotly and graphviz finish drawing
    found = {}
    for size in (PROJECTOR, DESKTOP):
        page.set_viewport_size(size)
        page.wait_for_timeout(700)              # the layout follows the window
        found[f"{size['width']}×{size['height']}"] = layout_problems(page)
        if size is PROJECTOR:
            shot(page, f"layout-{name}")        # the window grows to the page's height for it, then shrinks back
    page.set_viewport_size(PROJECTOR)
    assert not page.locator('[data-testid="stException"]').count()
    assert not any(found.values()), found


def run_to_end(page) -> None:
    click(page, "Run to end")
    page.get_by_text(re.compile(r"steps? recorded \(finished\)")).wait_for(timeout=90_000)
    idle(page)


def test_playground_greedy_and_sampling(server, page):
    open_app(page, server, "?max_new=12")
    run_to_end(page)
    check_both_sizes(page, "greedy")
    open_app(page, server, "?strategy=sample&temperature=0.8&top_k=6&top_p=0.9&seed=3&max_new=12")
    click(page, "Step")
    page.get_by_text("The draw: u against the CDF", exact=False).first.wait_for(timeout=30_000)
    check_both_sizes(page, "sampling")


def test_playground_beam(server, page):
    open_app(page, server, "?strategy=beam&num_beams=3&max_new=6")
    run_to_end(page)
    page.locator('[data-testid="stGraphVizChart"] svg').first.wait_for(timeout=30_000)
    check_both_sizes(page, "beam")


def test_playground_speculative_then_whatif(server, page):
    open_app(page, server, "?strategy=speculative&draft=lookup&gamma=3&max_new=24&chat=0&prompt="
                           + urllib.request.quote(LOOKUP_PROMPT))
    run_to_end(page)
    page.get_by_text("draft(s) verified", exact=False).first.wait_for(timeout=30_000)
    check_both_sizes(page, "speculative")
    page.get_by_role("link", name="What-if").click()
    page.get_by_text("Tokens per target forward vs γ").first.wait_for(timeout=30_000)
    check_both_sizes(page, "whatif")


def test_playground_dspark_tree(server, page):
    """DSpark on the tiny model's test drafter (a tree round, the default selection): the tree view, then the
    lattice view of the same round."""
    open_app(page, server, dspark_link(page, server))
    for step in range(3):
        click(page, "Step")
        page.get_by_text(re.compile(rf"^{step + 1} steps? recorded")).wait_for(timeout=90_000)
        idle(page)
    page.locator(".ds-chips span.ds-chip[data-step]").first.wait_for(timeout=30_000)
    check_both_sizes(page, "dspark")


def test_compare(server, page):
    page.goto(f"{server}/compare?max_new=12&seed=1")
    button = page.get_by_role("button", name="Run the comparison")
    button.wait_for(timeout=60_000)
    idle(page)
    button.click()
    page.get_by_text("Tokens vs wall time").first.wait_for(timeout=90_000)
    check_both_sizes(page, "compare")


def test_traces_with_a_recorded_dspark_chain(server, page):
    """A recorded chain round (the DP table, stage 1's widest table) replayed on the Traces page."""
    open_app(page, server)
    page.get_by_role("link", name="Traces").click()
    uploader = page.locator('[data-testid="stFileUploader"] input[type="file"]')
    uploader.wait_for(state="attached", timeout=30_000)
    uploader.set_input_files(str(ROOT / "tests" / "golden" / "dspark_head_chain_cost.json"))
    page.get_by_role("slider").wait_for(timeout=30_000)
    page.get_by_role("slider").press("ArrowRight")
    page.get_by_text("Stage 2").first.wait_for(timeout=30_000)
    check_both_sizes(page, "traces-dspark-chain")


def test_tour_every_stop(server, page):
    page.goto(f"{server}/tour")
    page.get_by_role("button", name="Next →", exact=True).wait_for(timeout=60_000)
    from ui.views.tour import STOPS

    for i, stop in enumerate(STOPS):
        idle(page)
        page.locator(".js-plotly-plot, [data-testid='stGraphVizChart']").first.wait_for(timeout=30_000)
        check_both_sizes(page, f"tour-{stop.id}")
        if i + 1 < len(STOPS):
            click(page, "Next →")
            page.wait_for_url(re.compile(f"stop={STOPS[i + 1].id}"), timeout=30_000)


def test_lab_every_tab(server, page):
    open_app(page, server, "?strategy=speculative&draft=lookup&gamma=3&max_new=16&chat=0&prompt="
                           + urllib.request.quote(LOOKUP_PROMPT))
    run_to_end(page)
    page.get_by_role("link", name="Lab").click()
    measure = page.get_by_role("button", name="Measure", exact=True)
    measure.first.wait_for(timeout=60_000)
    idle(page)
    measure.first.click()
    page.locator(".js-plotly-plot", has_text="Cost of a forward").first.wait_for(timeout=90_000)
    check_both_sizes(page, "lab-cost")
    for tab, chart in (("Acceptance", "Acceptance per round"), ("Memory", "KV cache held"),
                       ("Throughput and latency", "Throughput against latency"),
                       ("Losslessness", "seeded rounds per rule")):
        page.get_by_role("tab", name=tab).click()
        idle(page)
        if tab in ("Throughput and latency", "Losslessness"):      # measured on demand: this tab's button
            page.get_by_role("button", name="Measure", exact=True).locator("visible=true").first.click()
        page.locator(".js-plotly-plot", has_text=chart).first.wait_for(timeout=90_000)
        check_both_sizes(page, f"lab-{tab.split()[0].lower()}")


BROKEN = """<div data-testid="stMain" style="width: 1200px">
<button style="width: 60px"><div data-testid="stMarkdownContainer"
  style="overflow: hidden; text-overflow: ellipsis; white-space: nowrap">Run to end</div></button>
<div style="width: 1600px">a row wider than the window</div>
<div class="js-plotly-plot" style="position: relative; width: 600px">
  <div class="modebar" style="position: absolute; top: 0; right: 0; width: 200px; height: 30px"></div>
  <svg class="main-svg" width="600" height="100"><text class="gtitle" x="450" y="20" style="font-size: 16px">A title
  under the toolbar</text><text x="10" y="60" style="font-size: 10px">tiny tick</text></svg></div></div>"""
FIXED = (BROKEN.replace("width: 60px", "width: 120px").replace("width: 1600px", "width: 600px")
         .replace('x="450"', 'x="10"').replace("font-size: 10px", "font-size: 13px"))


def test_the_checks_find_each_problem_and_pass_a_page_without_them(browser):  # noqa: F811
    """Negative control of tests/layout_checks.py on a static page (no server): one problem of each kind is
    found, and the same page with the four fixed is clean."""
    page = browser.new_page(viewport=PROJECTOR)
    try:
        page.set_content(BROKEN)
        found = " | ".join(layout_problems(page))
        for words in ('sideways: the page', 'cut off: "Run to end"', '"tiny tick" at 10.0 px',
                      "under the toolbar"):
            assert words in found, found
        page.set_content(FIXED)
        assert layout_problems(page) == []
    finally:
        page.close()


def picker_problems(page, label: str) -> list[str]:
    """Open the select box labelled `label`, check every option of its list, then pick the longest one and
    check the page (the box shows the picked option's text): nothing cut off at 1280 px."""
    from browser_support import choose
    from layout_checks import option_problems

    box = page.locator('[data-testid="stSelectbox"]').filter(has_text=label).locator("input")
    box.scroll_into_view_if_needed()
    page.wait_for_timeout(200)
    box.click()
    options = page.get_by_role("option")
    options.first.wait_for(timeout=10_000)
    found = option_problems(page)
    texts = options.evaluate_all("els => els.map(e => e.innerText)")
    page.keyboard.press("Escape")
    idle(page)
    longest = max(range(len(texts)), key=lambda i: len(texts[i]))
    choose(page, label, page.get_by_role("option").nth(longest))
    settle(page)
    return found + [p for p in layout_problems(page) if p.startswith("cut off")]


def test_force_pickers_fit_at_1280(server, page):
    """Issue 46: the Playground's force pickers show their options whole at 1280×800, in the glossary's words:
    greedy's candidate picker, a speculative round's position and token pickers (a residual round), DSpark's."""
    found = {}
    open_app(page, server, f"?max_new=4&prompt={urllib.request.quote(LOOKUP_PROMPT)}&chat=0")
    click(page, "Step")
    page.get_by_text("Force a candidate at this step").wait_for(timeout=60_000)
    found["greedy"] = picker_problems(page, "Force a candidate at this step")
    shot(page, "force-greedy")
    open_app(page, server, "?strategy=speculative&draft=lookup&gamma=3&temperature=1.0&seed=1&max_new=6&chat=0"
                           f"&prompt={urllib.request.quote(LOOKUP_PROMPT)}")
    click(page, "Step")
    page.get_by_text("Token to force there").wait_for(timeout=60_000)
    found["speculative position"] = picker_problems(page, "Position in the round")
    found["speculative token"] = picker_problems(page, "Token to force there")
    chosen = " ".join(page.get_by_text("Chosen:", exact=False).all_inner_texts())     # the whole note, wrapped
    shot(page, "force-speculative")
    open_app(page, server, dspark_link(page, server))
    for step in range(2):
        click(page, "Step")
        page.get_by_text(re.compile(rf"^{step + 1} steps? recorded")).wait_for(timeout=90_000)
        idle(page)
    page.get_by_text("Token to force there").wait_for(timeout=60_000)
    found["dspark depth"] = picker_problems(page, "Draft position k (depth)")
    found["dspark token"] = picker_problems(page, "Token to force there")
    shot(page, "force-dspark")
    assert not page.locator('[data-testid="stException"]').count()
    assert not any(found.values()), found
    assert "p target" in chosen or "p residual" in chosen, chosen


def test_a_force_picker_shows_the_step_on_view(server, page):
    """Back to an earlier step: the force picker's box shows one of that step's candidates (the first), not the
    label it had at the later step. (Dropping the stale choice on the server alone left the browser showing
    the later step's "rank 4: … score -40.81" over the earlier step's list, while a click forced rank 1.)"""
    open_app(page, server, "?strategy=beam&num_beams=3&max_new=4")
    run_to_end(page)
    box = page.locator('[data-testid="stSelectbox"]').filter(has_text="Force a candidate")
    value = "e => [...e.querySelectorAll('input')].map(i => i.value).join(' ')"     # the box's shown text
    at_end = box.evaluate(value)
    click(page, "◀ Back")
    page.get_by_text(re.compile(r"viewing step 2\b")).wait_for(timeout=30_000)
    idle(page)
    page.wait_for_timeout(500)
    now = box.evaluate(value)
    box.locator("input").scroll_into_view_if_needed()
    box.locator("input").click()
    page.get_by_role("option").first.wait_for(timeout=10_000)
    options = page.get_by_role("option").all_inner_texts()
    page.keyboard.press("Escape")
    assert now != at_end and now.strip() == options[0].strip(), (now, at_end, options)


def test_requests_page_and_the_labs_queueing_tab(server, page, tmp_path):
    """A request log uploaded on the Requests page (tests/requests_support.py), its tables and histogram, the
    drafts accepted per strategy opened, vLLM replies uploaded as engine telemetry (tests/data/vllm-replies.json);
    then the Lab's Queueing tab."""
    upload_request_log(page, server, tmp_path)
    page.get_by_text("Drafts accepted, per strategy").click()          # its charts drawn and checked too
    telemetry = page.locator('[data-testid="stFileUploader"]', has_text="Engine telemetry").locator("input")
    telemetry.set_input_files([str(ROOT / "tests" / "data" / "vllm-replies.json")])
    page.get_by_text("vLLM per request (vllm-replies.json", exact=False).wait_for(timeout=30_000)
    check_both_sizes(page, "requests")
    page.get_by_role("link", name="Lab").click()
    page.get_by_role("tab", name="Queueing").click()
    page.locator(".js-plotly-plot", has_text="P99 latency against load").first.wait_for(timeout=30_000)
    check_both_sizes(page, "lab-queueing")


def upload_request_log(page, server, tmp_path, count: int = 9) -> None:
    """The Requests page with `count` records of tests/requests_support.py uploaded as the log's files."""
    from requests_support import log_files

    paths = []
    for name, data, _ in log_files(count):
        paths.append(tmp_path / name)
        paths[-1].write_bytes(data)
    open_app(page, server)
    page.get_by_role("link", name="Requests").click()
    page.get_by_role("heading", name="Requests").wait_for(timeout=30_000)
    page.locator('[data-testid="stMain"]').get_by_text("Log files", exact=True).click()
    uploader = page.locator('[data-testid="stFileUploader"]', has_text="Request-log files").locator("input")
    uploader.wait_for(state="attached", timeout=30_000)
    uploader.set_input_files([str(p) for p in paths])
    page.locator(".js-plotly-plot", has_text="End to end per strategy").first.wait_for(timeout=30_000)


def test_a_click_on_a_row_of_the_requests_table_opens_that_requests_trace(server, page, tmp_path):
    """As a user does it: a click on the third row's selection circle in the requests table (not the picker under
    it) opens that request's trace on the Traces page, its timing line above the views. The third row, not the
    first, so that a click that opened the slowest whatever the row would fail."""
    from requests_support import record

    upload_request_log(page, server, tmp_path)
    records = sorted((record(n, n % 3) for n in range(9)), key=lambda r: -r["timing"]["e2e_s"])
    want = records[2]
    grid = page.locator('[data-testid="stDataFrame"]').nth(1)            # after the percentiles: the requests
    grid.scroll_into_view_if_needed()
    idle(page)
    box = grid.bounding_box()
    row_px = 35                                                          # the grid's header and row height
    page.mouse.click(box["x"] + 18, box["y"] + row_px * 3 + row_px / 2)  # header, row 1, row 2, then row 3
    line = page.locator('[data-testid="stCaptionContainer"]', has_text="Served request").first
    line.wait_for(timeout=30_000)
    idle(page)
    page.locator(chip(0)).first.wait_for(timeout=30_000)                 # the trace's chips drew
    shot(page, "requests-row-opened")
    text = line.inner_text().replace("\u2060", "")
    assert f"Served request {want['id']} ({want['strategy']})" in text, text
    assert not page.locator('[data-testid="stException"]').count()


def test_labs_queueing_tab_measured_live(server, page):
    """The Queueing tab's live measurement on the tiny model (prompt lookup, 5 requests of 4 tokens): its table
    and chart at both sizes."""
    open_app(page, server)
    page.get_by_role("link", name="Lab").click()
    page.get_by_role("tab", name="Queueing").click()
    button = page.get_by_role("button", name="Measure live on this model", exact=True)
    button.wait_for(timeout=30_000)
    choose(page, "Faster strategy", page.get_by_role("option", name="Speculative, prompt lookup"))
    for label, value in (("Requests per strategy", "5"), ("New tokens per request", "4")):
        page.get_by_label(label).fill(value)
        page.get_by_label(label).press("Enter")
        idle(page)
    button.click()
    page.locator(".js-plotly-plot", has_text="measured live").first.wait_for(timeout=60_000)
    page.get_by_text("Per request, speculative was", exact=False).first.wait_for(timeout=10_000)    # the sentence
    assert page.locator('[data-testid="stDataFrame"]').count() >= 2       # the simulation's table and the live one
    check_both_sizes(page, "lab-queueing-live")
