"""App benchmark, in a real browser (Debian's Chromium through Playwright):
1. the first page with the embedded model loaded: from `streamlit run app.py` to a Playground ready to
   Step (the prompt tokenized by the loaded model), on a new machine (empty cache: the GGUF is converted
   once), on a cold server (converted copy on disk), and for a second browser session (model in memory);
2. how long a Step takes beyond the model's own time, on the tiny test model (bench/tiny_model.py):
   click Step, wait for the new token chip, subtract the model time the page reports. A trivial
   Streamlit button app is measured the same way as the floor (Streamlit's own round-trip);
3. Run to end on the embedded model: the model time the page reports against the same run on the
   command line (`python -m decoding run`, its own process, the server idle meanwhile), so that the
   app's model steps are seen to cost what the engine's cost alone.

    python -m bench app [--steps N]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.browser import CHROMIUM, launch_chromium, streamlit_server
from bench.report import machine, write_section

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = {"greedy": "", "sample": "&strategy=sample&temperature=0.8&top_k=50&top_p=0.9&seed=3"}
TIMING = re.compile(r"This rerun: model (-?\d+) ms, page beyond the model (-?\d+) ms")
FLOOR_SCRIPT = '''import streamlit as st

st.session_state.setdefault("n", 0)
if st.button("Step"):
    st.session_state.n += 1
st.write(f"count {st.session_state.n}")
'''


def parse_timing(text: str) -> tuple[float, float]:
    """(model ms, server-side page ms beyond the model) from the Playground's timing caption."""
    match = TIMING.search(text)
    if not match:
        raise ValueError(f"no timing caption in {text!r}")
    return float(match.group(1)), float(match.group(2))


def summarize(values: list[float]) -> dict:
    """median, min, max and count of a non-empty list of numbers."""
    if not values:
        raise ValueError("summarize needs at least one value")
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def load_note(before: tuple, after: tuple, cpus: int) -> str:
    """The 1/5/15-minute load averages before and after the run, and whether the machine was busy before
    it (the load after it includes the benchmark's own server, browser and driver, so it cannot tell)."""
    fmt = "/".join
    text = (f"Load average (1/5/15 min) before: {fmt(f'{x:.2f}' for x in before)}, "
            f"after: {fmt(f'{x:.2f}' for x in after)}, on {cpus} CPUs: ")
    if before[0] > cpus:
        return text + "the machine was busy with other work before the run, so these figures are upper bounds."
    return (text + "no more runnable work than CPUs before the run (fairly quiet); the load after it includes "
            "this benchmark's own server, browser and driver.")


def cell(values: list[float]) -> str:
    s = summarize(values)
    return f"{s['median']:.0f} [{s['min']:.0f}–{s['max']:.0f}]"


def _tiny_model_dir(target: Path) -> Path:
    from bench.tiny_model import build_tiny_model_dir
    return build_tiny_model_dir(target)


def _idle(page) -> None:
    """Wait until Streamlit has finished the current run, so the next click is not lost in it."""
    from playwright.sync_api import TimeoutError as PwTimeout
    try:
        page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]') "
                               "&& !document.querySelector('[data-stale=\"true\"]')", timeout=30_000)
    except PwTimeout:
        pass


ARM = """(probe) => {
  window.__dsT0 = null; window.__dsT1 = null;
  const done = () => probe.selector ? !!document.querySelector(probe.selector)
                                    : document.body.innerText.includes(probe.text);
  document.addEventListener('click', () => { if (window.__dsT0 === null) window.__dsT0 = performance.now(); },
                            {capture: true, once: true});
  const painted = () => {            // after the next frame is drawn: a rAF, then a message after it
    const ch = new MessageChannel();
    ch.port1.onmessage = () => { window.__dsT1 = performance.now(); };
    ch.port2.postMessage(0);
  };
  const obs = new MutationObserver(() => {
    if (window.__dsT0 !== null && !obs.seen && done()) {
      obs.seen = true; obs.disconnect(); requestAnimationFrame(painted);
    }
  });
  obs.observe(document.body, {childList: true, subtree: true, characterData: true});
}"""


def _timed_click(page, probe: dict, locator) -> float:
    """ms from the click event until the frame that shows `probe` (a CSS selector, or a text) has
    been drawn, both read in the page's own clock (so Playwright's wait for the button to be stable and
    idle is not counted; work the page does before that frame, such as drawing charts, is)."""
    page.evaluate(ARM, probe)
    page.get_by_role("button", name="Step", exact=True).click()
    locator.wait_for(timeout=30_000)
    page.wait_for_function("() => window.__dsT1 !== null", timeout=30_000)
    return float(page.evaluate("() => window.__dsT1 - window.__dsT0"))


def _chip(step: int) -> str:
    return f'.ds-chips span.ds-chip[data-step="{step}"]'


def _caption_after(timing, before: str, page) -> str:
    for _ in range(20):                       # the caption is drawn last; identical text is possible
        text = timing.inner_text()
        if text != before:
            return text
        page.wait_for_timeout(50)
    return timing.inner_text()


@contextlib.contextmanager
def playground(browser, url: str, query: str, timeout_ms: int = 60_000):
    """A new browser session on the Playground at `query`, ready to Step; closed afterwards."""
    context = browser.new_context(viewport={"width": 1400, "height": 1900})
    try:
        page = context.new_page()
        page.goto(f"{url}/?{query}")
        page.get_by_role("button", name="Step", exact=True).wait_for(timeout=timeout_ms)
        _idle(page)
        yield page
    finally:
        context.close()


def measure_playground(browser, url: str, query: str, steps: int) -> list[dict]:
    """One row per Step after a warm-up step: click→chip wall ms, model ms, server page ms beyond the model."""
    with playground(browser, url, f"max_new={steps + 2}{query}") as page:
        page.get_by_role("button", name="Step", exact=True).click()                # warm-up Step
        page.locator(_chip(0)).wait_for(timeout=30_000)
        page.locator(".js-plotly-plot").nth(1).wait_for(timeout=60_000)   # warm-up: plotly.js loaded
        _idle(page)
        timing = page.get_by_text(re.compile(r"This rerun: model"))
        rows = []
        for i in range(1, steps + 1):
            before = timing.inner_text()
            wall = _timed_click(page, {"selector": _chip(i)}, page.locator(_chip(i)))
            _idle(page)
            model, server = parse_timing(_caption_after(timing, before, page))
            rows.append({"click_to_chip_ms": wall, "model_ms": model, "server_ms": server,
                         "beyond_model_ms": wall - model})
        return rows


READY = re.compile(r"Prompt as the model sees it")


def _open_ready(browser, url: str) -> float:
    """Seconds from opening the Playground in a new browser session until it is ready to Step."""
    context = browser.new_context(viewport={"width": 1400, "height": 1200})
    try:
        page = context.new_page()
        start = time.perf_counter()
        page.goto(url)
        page.get_by_text(READY).wait_for(timeout=300_000)
        page.get_by_role("button", name="Step", exact=True).wait_for(timeout=60_000)
        return time.perf_counter() - start
    finally:
        context.close()


def measure_embedded(browser, tmp: Path) -> tuple[dict, dict]:
    """On the embedded model: seconds to a ready Playground, 'new machine' (an empty cache, so the GGUF
    is converted), 'cold server' (server start with the converted copy on disk), 'warm' (another
    browser session on that server), server start counted from launching `streamlit run`; then, on the
    warm server, the long runs (measure_long_runs)."""
    out = {}
    env = {k: v for k, v in os.environ.items() if k != "DECODESCOPE_MODEL"}
    for name, cache in (("new machine", tmp / "empty-cache"), ("cold server", None)):
        run_env = dict(env, DECODESCOPE_CACHE=str(cache)) if cache else env
        start = time.perf_counter()
        with streamlit_server(ROOT / "app.py", run_env, tmp / f"first-{len(out)}.log", cwd=ROOT) as url:
            server_s = time.perf_counter() - start
            out[name] = server_s + _open_ready(browser, url)
            if cache is None:
                out["warm (second session)"] = _open_ready(browser, url)
                long_runs = measure_long_runs(browser, url)
    return out, long_runs


def measure_floor(browser, url: str, steps: int) -> list[float]:
    """click→new text ms of a bare Streamlit button app (no model, one st.write)."""
    context = browser.new_context()
    page = context.new_page()
    try:
        page.goto(url)
        page.get_by_text("count 0", exact=True).wait_for(timeout=60_000)
        _idle(page)
        walls = []
        for i in range(1, steps + 1):
            walls.append(_timed_click(page, {"text": f"count {i}"}, page.get_by_text(f"count {i}", exact=True)))
            _idle(page)
        return walls
    finally:
        context.close()


LONG_RUN_TOKENS = 96
LONG_RUNS = ("greedy", "dspark")               # each with its defaults, in the app and on the command line
FINISHED = re.compile(r"recorded \(finished\)")


def _metric(page, label: str) -> str:
    box = page.locator('[data-testid="stMetric"]').filter(has_text=label).first
    return box.locator('[data-testid="stMetricValue"]').inner_text()


def measure_long_run(browser, url: str, strategy: str, prompt: str) -> dict:
    """Run to end in the Playground on the server's model: tokens, the page's model ms, and the wall
    seconds from the click until the page says the run finished."""
    from urllib.parse import quote
    query = f"strategy={strategy}&max_new={LONG_RUN_TOKENS}&prompt={quote(prompt)}"
    with playground(browser, url, query, timeout_ms=120_000) as page:
        start = time.perf_counter()
        page.get_by_role("button", name="Run to end", exact=True).click()
        page.get_by_text(FINISHED).wait_for(timeout=600_000)
        wall = time.perf_counter() - start
        _idle(page)
        return {"tokens": int(_metric(page, "Tokens")), "wall_s": wall,
                "model_ms": float(_metric(page, "Model time").replace(",", "").split()[0])}


def command_line_run(strategy: str, prompt: str) -> dict:
    """The same run through `python -m decoding run` in a process of its own: tokens and the run's ms."""
    with tempfile.TemporaryDirectory(prefix="bench_app_cli_") as tmp:
        out = Path(tmp) / "trace.json"
        subprocess.run([sys.executable, "-m", "decoding", "run", "--prompt", prompt, "--strategy", strategy,
                        "--max-new-tokens", str(LONG_RUN_TOKENS), "--out", str(out)],
                       cwd=ROOT, check=True, capture_output=True, text=True)
        trace = json.loads(out.read_text())
    steps_ms = sum(sum(step.get("timings_ms", {}).values()) for step in trace["steps"])
    return {"tokens": trace["stats"]["new_tokens"], "model_ms": steps_ms}


def measure_long_runs(browser, url: str) -> dict:
    from bench.prompts import PROMPTS
    return {s: {"app": measure_long_run(browser, url, s, PROMPTS["chat"]), "cli": command_line_run(s, PROMPTS["chat"])}
            for s in LONG_RUNS}


def render_long_runs(long_runs: dict) -> list[str]:
    lines = ["", f"Run to end on the embedded model ({LONG_RUN_TOKENS} new tokens at most, the chat prompt of "
             "bench/prompts.py, each strategy's defaults): the model time the page reports (the sum of the steps' "
             "timing fields) against the same sum for the same run on the command line "
             "(`python -m decoding run`, its own process, the server idle meanwhile); wall: from the click on "
             "**Run to end** until the page says the run finished. One run each.", "",
             "| strategy | tokens (app / CLI) | app model ms per token | CLI model ms per token | app / CLI | "
             "app wall s |", "|---|---|---|---|---|---|"]
    for name, r in long_runs.items():
        app, cli = r["app"], r["cli"]
        per_app, per_cli = app["model_ms"] / app["tokens"], cli["model_ms"] / cli["tokens"]
        lines.append(f"| {name} | {app['tokens']} / {cli['tokens']} | {per_app:.1f} | {per_cli:.1f} | "
                     f"{per_app / per_cli:.2f} | {app['wall_s']:.1f} |")
    return lines


def render_first_page(first: dict) -> list[str]:
    return ["", "First page with the embedded model (Playground ready to Step), in seconds; goal of issue 5: "
            "≤ 20 s cold, ≤ 5 s warm:", "", "| start | seconds |", "|---|---|"] + [
        f"| {name} | {seconds:.1f} |" for name, seconds in first.items()]


def render(results: dict, floor: list[float], steps: int, loads: tuple, browser_version: str,
           first: dict | None = None, long_runs: dict | None = None) -> str:
    lines = ["## App: first page and Step render time in the browser", "",
             f"Command: `python -m bench app --steps {steps}`  ",
             f"Machine: {machine()}; {os.cpu_count()} CPUs; Chromium {browser_version} headless (Playwright).  ",
             load_note(*loads, os.cpu_count() or 1) + "  ",
             "`streamlit run app.py` on the tiny test model (bench/tiny_model.py: 2-layer random llama, "
             "SmolLM2 tokenizer), one browser tab per strategy, one warm-up Step first. click→chip: from the click "
             "event on **Step** until the frame showing the new token chip has been drawn, both read in the "
             "page's own clock (`performance.now()`: a click listener, a mutation observer, then the next "
             "animation frame), so Playwright's own waiting is not counted. Model: the step's model time the page "
             "reports; server: "
             "the page's own time beyond the model on the server (its timing caption). The floor is a bare "
             "Streamlit button app (one `st.write`, full-script rerun) timed the same way, to its new text. "
             f"Values: median [min–max] over {steps} Steps, in ms. Goal of issues 5 and 39: ≤ 150 ms beyond the model.",
             "", "| page | click→chip | model | beyond the model | server page beyond the model |",
             "|---|---|---|---|---|"]
    for name, rows in results.items():
        col = {k: [r[k] for r in rows] for k in rows[0]}
        lines.append(f"| Playground Step, {name} | {cell(col['click_to_chip_ms'])} | {cell(col['model_ms'])} | "
                     f"{cell(col['beyond_model_ms'])} | {cell(col['server_ms'])} |")
    lines.append(f"| floor: bare Streamlit button | {cell(floor)} | — | {cell(floor)} | — |")
    if first:
        lines += render_first_page(first)
    if long_runs:
        lines += render_long_runs(long_runs)
    return "\n".join(lines)


def run(steps: int) -> tuple[dict, list[float], str, dict, dict]:
    from playwright.sync_api import sync_playwright
    with tempfile.TemporaryDirectory(prefix="bench_app_") as tmp_name:
        tmp = Path(tmp_name)
        model_dir = _tiny_model_dir(tmp / "model")
        (tmp / "floor.py").write_text(FLOOR_SCRIPT, encoding="utf-8")
        with sync_playwright() as p:
            browser = launch_chromium(p)
            try:
                first, long_runs = measure_embedded(browser, tmp)
                env = {**os.environ, "DECODESCOPE_MODEL": str(model_dir)}
                with streamlit_server(ROOT / "app.py", env, tmp / "app.log", cwd=ROOT) as url:
                    results = {name: measure_playground(browser, url, query, steps)
                               for name, query in STRATEGIES.items()}
                with streamlit_server(tmp / "floor.py", dict(os.environ), tmp / "floor.log") as url:
                    floor = measure_floor(browser, url, steps)
                return results, floor, browser.version, first, long_runs
            finally:
                browser.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench app")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    if args.steps < 1:
        sys.exit(f"--steps must be at least 1, got {args.steps}")
    if not os.path.exists(CHROMIUM):
        sys.exit(f"bench app needs Chromium at {CHROMIUM} (Debian's chromium package); not found")
    before = os.getloadavg()
    results, floor, version, first, long_runs = run(args.steps)
    body = render(results, floor, args.steps, (before, os.getloadavg()), version, first, long_runs)
    write_section("app", body)
    print(body)
