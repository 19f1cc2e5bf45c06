"""Many sessions on one server, as a class shares a teacher's: N browser sessions on the Playground of one
`streamlit run app.py` (loopback only) press Step at the same time, and each Step's time is read twice:
server (the rerun's whole time on the server, from the page's timing caption: the model, the page, and any
wait for the engine thread behind other sessions) and click→chip (from the click until the frame that shows
the new token chip, in the page's own clock). A second scenario has one session press Run to end while the
others Step: with a fair engine thread their Steps do not wait for the whole run.

    python -m bench load [--sessions 1,4,8] [--steps 8] [--model embedded|tiny] [--browsers normal|low]

--browsers low starts Chromium at the lowest CPU priority (SCHED_IDLE, `chrt --idle`), standing in for a class
whose browsers run on the students' own machines: the server then has the CPUs first, as it would alone.

Bounded: at most 16 sessions and 50 Steps each, every wait has a timeout, one Chromium for all sessions.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench.app import ARM, ROOT, TIMING, _chip, _tiny_model_dir, load_note, parse_timing
from bench.browser import CHROMIUM, CHROMIUM_ARGS, streamlit_server
from bench.report import machine, write_section
from decoding.core.formulas import percentile

MAX_SESSIONS = 16
MAX_STEPS = 50
LONG_RUN_TOKENS = 160          # the Run to end of the second scenario
WAIT_MS = 120_000
IDLE = ("() => !document.querySelector('[data-testid=\"stStatusWidget\"]') "
        "&& !document.querySelector('[data-stale=\"true\"]')")


def parse_sessions(text: str) -> tuple[int, ...]:
    """'1,4,8' -> (1, 4, 8); each between 1 and MAX_SESSIONS."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--sessions must be numbers separated by commas, got {text!r}") from None
    if not counts or any(not 1 <= n <= MAX_SESSIONS for n in counts):
        raise ValueError(f"--sessions must each be between 1 and {MAX_SESSIONS}, got {text!r}")
    return counts


async def _idle(page) -> None:
    try:
        await page.wait_for_function(IDLE, timeout=30_000)
    except Exception:   # noqa: BLE001 - a page still busy after 30 s is measured as it is
        pass


async def _open(browser, url: str, query: str):
    context = await browser.new_context(viewport={"width": 1400, "height": 1900})
    page = await context.new_page()
    await page.goto(f"{url}/?{query}")
    await page.get_by_role("button", name="Step", exact=True).wait_for(timeout=300_000)
    await _idle(page)
    return context, page


async def _caption(page) -> str:
    return await page.get_by_text(TIMING).inner_text(timeout=WAIT_MS)


async def _step(page, step: int) -> dict:
    """Press Step once: click→chip ms and the server ms of that rerun (model + page beyond it)."""
    before = await _caption(page) if step else ""
    await page.evaluate(ARM, {"selector": _chip(step)})
    await page.get_by_role("button", name="Step", exact=True).click(timeout=WAIT_MS)
    await page.locator(_chip(step)).wait_for(timeout=WAIT_MS)
    await page.wait_for_function("() => window.__dsT1 !== null", timeout=WAIT_MS)
    wall = float(await page.evaluate("() => window.__dsT1 - window.__dsT0"))
    await _idle(page)
    text = before
    for _ in range(40):                       # the caption is drawn last
        text = await _caption(page)
        if text != before:
            break
        await page.wait_for_timeout(50)
    try:
        server = sum(parse_timing(text))
    except ValueError:                        # no caption read: counted in click→chip only
        server = float("nan")
    return {"click_to_chip_ms": wall, "server_ms": server}


async def _steps(page, first: int, count: int) -> list[dict]:
    return [await _step(page, i) for i in range(first, first + count)]


async def _scenario(browser, url: str, sessions: int, steps: int, long_run: bool) -> list[dict]:
    """`sessions` Playgrounds, one warm-up Step each, then all press Step `steps` times at once (with
    `long_run`, session 0 presses Run to end instead and only the others' Steps are returned)."""
    opened = [await _open(browser, url, f"max_new={LONG_RUN_TOKENS + steps + 2}&seed={i}") for i in range(sessions)]
    try:
        pages = [page for _, page in opened]
        await asyncio.gather(*(_step(page, 0) for page in pages))
        steppers = pages
        if long_run:
            await pages[0].get_by_role("button", name="Run to end", exact=True).click(timeout=WAIT_MS)
            await pages[0].wait_for_timeout(500)
            steppers = pages[1:]
        results = await asyncio.gather(*(_steps(page, 1, steps) for page in steppers))
        return [row for rows in results for row in rows]
    finally:
        for context, _ in opened:
            await context.close()


def _idle_chromium(folder: Path) -> str:
    """A launcher that runs Chromium, and every process it starts, under SCHED_IDLE (a nice value does not
    hold: Chromium sets its own processes' nice values)."""
    launcher = folder / "chromium-idle"
    launcher.write_text(f'#!/bin/sh\nexec chrt --idle 0 {CHROMIUM} "$@"\n')
    launcher.chmod(0o755)
    return str(launcher)


async def _run(url: str, counts: tuple[int, ...], steps: int, chromium: str) -> tuple[dict, str]:
    from playwright.async_api import async_playwright
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=list(CHROMIUM_ARGS))
        try:
            out = {f"{n} session{'s' if n > 1 else ''} stepping": await _scenario(browser, url, n, steps, False)
                   for n in counts}
            n = max(counts)
            if n > 1:
                out[f"{n - 1} stepping while 1 runs to end"] = await _scenario(browser, url, n, steps, True)
            return out, browser.version
        finally:
            await browser.close()


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} / {percentile(values, 95):.0f}"


BROWSERS = {"normal": "its sessions on the same machine as the server, at the same CPU priority",
            "low": "its sessions on the same machine as the server but at the lowest CPU priority (SCHED_IDLE), "
                   "standing in for browsers on the students' own machines"}


def render(results: dict, steps: int, model: str, loads: tuple, version: str, command: str,
           browsers: str = "normal") -> str:
    title = "## Many sessions on one server" + (", browsers at low priority" if browsers == "low" else "")
    lines = [title, "",
             f"Command: `{command}`  ",
             f"Machine: {machine()}; {os.cpu_count()} CPUs; Chromium {version} headless (Playwright), "
             f"{BROWSERS[browsers]}.  ", load_note(*loads, os.cpu_count() or 1) + "  ",
             f"`streamlit run app.py` on the {model} model, greedy. Each session is a browser context of its own "
             f"(one Streamlit session each); after a warm-up Step, every session presses Step {steps} times, all "
             "at once. Server: the rerun's time on the server from the page's timing caption (model + page, "
             "with any wait for the engine thread behind other sessions); click→chip: from the click until the "
             "frame showing the new token chip, in the page's own clock. Values in ms: p50 / p95 over every "
             "session's Steps. Goal of issue 39: with 8 sessions, server p50 ≤ 2× one session's.", "",
             "| scenario | Steps | server p50 / p95 | click→chip p50 / p95 | server p50 vs 1 session |",
             "|---|---|---|---|---|"]
    single = statistics.median([r["server_ms"] for r in next(iter(results.values()))])
    for name, rows in results.items():
        server = [r["server_ms"] for r in rows if r["server_ms"] == r["server_ms"]]
        wall = [r["click_to_chip_ms"] for r in rows]
        ratio = f"{statistics.median(server) / single:.2f}×" if server and single > 0 else "—"
        lines.append(f"| {name} | {len(rows)} | {_cell(server) if server else '—'} | {_cell(wall)} | {ratio} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench load")
    parser.add_argument("--sessions", default="1,4,8", help="session counts, e.g. 1,4,8 (each 1–16)")
    parser.add_argument("--steps", type=int, default=8, help=f"Steps per session (1–{MAX_STEPS})")
    parser.add_argument("--model", choices=("embedded", "tiny"), default="embedded")
    parser.add_argument("--browsers", choices=tuple(BROWSERS), default="normal",
                        help="the browsers' CPU priority (low: SCHED_IDLE, as if on other machines)")
    args = parser.parse_args(argv)
    try:
        counts = parse_sessions(args.sessions)
    except ValueError as err:
        sys.exit(str(err))
    if not 1 <= args.steps <= MAX_STEPS:
        sys.exit(f"--steps must be between 1 and {MAX_STEPS}, got {args.steps}")
    if not os.path.exists(CHROMIUM):
        sys.exit(f"bench load needs Chromium at {CHROMIUM} (Debian's chromium package); not found")
    command = f"python -m bench load --sessions {','.join(map(str, counts))} --steps {args.steps} --model {args.model}"
    command += " --browsers low" if args.browsers == "low" else ""
    before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench_load_") as tmp_name:
        tmp = Path(tmp_name)
        env = {k: v for k, v in os.environ.items() if k != "DECODESCOPE_MODEL"}
        if args.model == "tiny":
            env["DECODESCOPE_MODEL"] = str(_tiny_model_dir(tmp / "model"))
        with streamlit_server(ROOT / "app.py", env, tmp / "server.log", cwd=ROOT) as url:
            chromium = _idle_chromium(tmp) if args.browsers == "low" else CHROMIUM
            results, version = asyncio.run(_run(url, counts, args.steps, chromium))
    body = render(results, args.steps, args.model, (before, os.getloadavg()), version, command, args.browsers)
    write_section("load" if args.browsers == "normal" else "load_low", body)
    print(body)
