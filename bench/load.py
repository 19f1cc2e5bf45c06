"""Many sessions on one server, as a class shares a teacher's: N browser sessions on the Playground of one
`streamlit run app.py` (loopback only) press Step at the same time, and each Step's time is read twice:
server (the rerun's whole time on the server, from the page's timing caption: the model, the page, and any
wait for the engine thread behind other sessions) and click→chip (from the click until the frame that shows
the new token chip, in the page's own clock). A second scenario has one session press Run to end while the
others Step: with a fair engine thread their Steps do not wait for the whole run.

    python -m bench load [--sessions 1,4,8] [--steps 8] [--model embedded|tiny] [--browsers normal|low]
                         [--client browser|ws] [--pace SECONDS]

--browsers low starts Chromium at the lowest CPU priority (SCHED_IDLE, `chrt --idle`), standing in for a class
whose browsers run on the students' own machines: the server then has the CPUs first, as it would alone.
--client ws drives the sessions with no browser at all: each is a websocket speaking Streamlit's protocol
(bench/ws_session.py), all in this process, so the server has the machine nearly to itself, as with a class
whose browsers are elsewhere; its times run from the press to the message (not to a drawn frame). --pace S
(with either client, default 0) has each session wait a random think time between its Steps, exponential with
mean S seconds and seeded, like students reading each token before pressing again.

Bounded: at most 16 sessions and 50 Steps each, every wait has a timeout, one Chromium for all sessions.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.app import ARM, ROOT, TIMING, _chip, _tiny_model_dir, load_note, parse_timing
from bench.browser import CHROMIUM, CHROMIUM_ARGS, streamlit_server
from bench.procs import client_counts
from bench.report import machine, write_section
from decoding.core.formulas import percentile

MAX_SESSIONS = 16
MAX_STEPS = 50
LONG_RUN_TOKENS = 160          # the Run to end of the second scenario (it may stop sooner, at EOS)
QUIET_S = 3.0                  # a Run to end has ended when its session has sent nothing for this long
WAIT_MS = 120_000
IDLE = ("() => !document.querySelector('[data-testid=\"stStatusWidget\"]') "
        "&& !document.querySelector('[data-stale=\"true\"]')")


def parse_sessions(text: str) -> tuple[int, ...]:
    """'1,4,8' -> (1, 4, 8); each between 1 and MAX_SESSIONS."""
    return client_counts(text, "--sessions", MAX_SESSIONS)


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


async def _steps(page, first: int, pauses: list[float]) -> list[dict]:
    rows = []
    for i, pause in enumerate(pauses, start=first):
        await asyncio.sleep(pause)
        rows.append(await _step(page, i))
    return rows


def _query(session: int, steps: int) -> str:
    return f"max_new={LONG_RUN_TOKENS + steps + 2}&seed={session}"


def think_times(pace: float, seed: int, count: int) -> list[float]:
    """Seconds to wait before each of `count` Steps: exponential with mean `pace` (none when 0), seeded."""
    rng = random.Random(seed)
    return [rng.expovariate(1.0 / pace) if pace > 0 else 0.0 for _ in range(count)]


async def _scenario(browser, url: str, sessions: int, steps: int, long_run: bool, pace: float) -> list[dict]:
    """`sessions` Playgrounds, one warm-up Step each, then all press Step `steps` times at once (with
    `long_run`, session 0 presses Run to end instead and only the others' Steps are returned)."""
    opened = [await _open(browser, url, _query(i, steps)) for i in range(sessions)]
    try:
        pages = [page for _, page in opened]
        await asyncio.gather(*(_step(page, 0) for page in pages))
        stepping = range(1 if long_run else 0, sessions)
        if long_run:
            await pages[0].get_by_role("button", name="Run to end", exact=True).click(timeout=WAIT_MS)
            await pages[0].wait_for_timeout(500)
        results = await asyncio.gather(*(_steps(pages[i], 1, think_times(pace, i, steps)) for i in stepping))
        return [row for rows in results for row in rows]
    finally:
        for context, _ in opened:
            await context.close()


async def _ws_step(session, pause: float) -> dict:
    """Press Step once on a websocket session: the server ms of that rerun (its caption), and the ms from
    sending the press until the message with the new chip, and until the run's script_finished, arrived."""
    await asyncio.sleep(pause)
    run = await session.press("Step")
    try:
        server = sum(parse_timing(run.caption))
    except ValueError:                        # no caption in the run: counted in the client's times only
        server = float("nan")
    chip = float("nan") if run.chip_s is None else run.chip_s * 1000.0
    return {"server_ms": server, "press_to_chip_ms": chip, "press_to_finished_ms": run.finished_s * 1000.0,
            "ended_at": time.perf_counter()}


async def _ws_steps(session, pauses: list[float]) -> list[dict]:
    return [await _ws_step(session, pause) for pause in pauses]


async def _keep_running(session) -> None:
    """Run to end, again and again (Reset between): a run ends at EOS, often before the others' Steps do."""
    while True:
        await session.send_press("Run to end")
        await session.follow(QUIET_S)
        await session.press("Reset")


async def _ws_scenario(url: str, sessions: int, steps: int, long_run: bool, pace: float) -> list[dict]:
    """_scenario with websocket sessions (bench/ws_session.py) in place of browser contexts."""
    from bench.ws_session import WsSession
    opened, runner = [], None
    try:
        for i in range(sessions):
            opened.append(await WsSession.open(url, _query(i, steps)))
        await asyncio.gather(*(session.press("Step") for session in opened))
        stepping = range(1 if long_run else 0, sessions)
        if long_run:                          # its messages are read (and dropped) while the others Step
            runner = asyncio.create_task(_keep_running(opened[0]))
            await asyncio.sleep(0.5)
        results = await asyncio.gather(*(_ws_steps(opened[i], think_times(pace, i, steps)) for i in stepping))
        rows = [row for rows in results for row in rows]
        if long_run:                          # a Step ended while the run went on: a later message came
            if runner.done():
                runner.result()               # the runner's error, if it stopped on one
            for row in rows:
                row["during_run"] = row["ended_at"] <= opened[0].last_message_at
        return rows
    finally:
        if runner is not None:
            runner.cancel()
        for session in opened:
            await session.close()


def _scenarios(counts: tuple[int, ...]) -> list[tuple[str, int, bool]]:
    """(name, sessions, long run) of each scenario: every count stepping, then the largest less one
    stepping while one runs to end."""
    out = [(f"{n} session{'s' if n > 1 else ''} stepping", n, False) for n in counts]
    n = max(counts)
    return out + ([(f"{n - 1} stepping while 1 runs to end", n, True)] if n > 1 else [])


def _idle_chromium(folder: Path) -> str:
    """A launcher that runs Chromium, and every process it starts, under SCHED_IDLE (a nice value does not
    hold: Chromium sets its own processes' nice values)."""
    launcher = folder / "chromium-idle"
    launcher.write_text(f'#!/bin/sh\nexec chrt --idle 0 {CHROMIUM} "$@"\n')
    launcher.chmod(0o755)
    return str(launcher)


async def _run(url: str, counts: tuple[int, ...], steps: int, chromium: str, pace: float) -> tuple[dict, str]:
    from playwright.async_api import async_playwright
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=list(CHROMIUM_ARGS))
        try:
            return {name: await _scenario(browser, url, n, steps, long_run, pace)
                    for name, n, long_run in _scenarios(counts)}, browser.version
        finally:
            await browser.close()


async def _run_ws(url: str, counts: tuple[int, ...], steps: int, pace: float) -> tuple[dict, str]:
    """The scenarios with websocket sessions; also what the client cost: its CPU seconds over the wall."""
    import websockets
    cpu, wall = time.process_time(), time.perf_counter()
    out = {name: await _ws_scenario(url, n, steps, long_run, pace) for name, n, long_run in _scenarios(counts)}
    return out, (f"the sessions are websocket clients (websockets {websockets.__version__}), all in one Python "
                 "process (asyncio) on the same machine as the server, at the same CPU priority; that process "
                 f"used {time.process_time() - cpu:.1f} s of CPU in the {time.perf_counter() - wall:.0f} s the "
                 "scenarios took")


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} / {percentile(values, 95):.0f}"


def _finite(rows: list[dict], key: str) -> list[float]:
    return [r[key] for r in rows if math.isfinite(r[key])]


BROWSER_COLUMNS = (("click→chip", "click_to_chip_ms"),)
WS_COLUMNS = (("press→chip", "press_to_chip_ms"), ("press→finished", "press_to_finished_ms"))


def _table(results: dict, columns: tuple[tuple[str, str], ...]) -> list[str]:
    """The scenarios' rows: server ms and each client-side column, p50 / p95, and server p50 against the
    first scenario's (one session); a Step whose value was not read counts in the other columns only."""
    names = "".join(f" {label} p50 / p95 |" for label, _ in columns)
    lines = [f"| scenario | Steps | server p50 / p95 |{names} server p50 vs 1 session |",
             "|---|---|---|" + "---|" * len(columns) + "---|"]
    first = _finite(next(iter(results.values())), "server_ms")
    single = statistics.median(first) if first else float("nan")
    for name, rows in results.items():
        server = _finite(rows, "server_ms")
        ratio = f"{statistics.median(server) / single:.2f}×" if server and single > 0 else "—"
        cells = "".join(f" {_cell(v) if (v := _finite(rows, key)) else '—'} |" for _, key in columns)
        steps = str(len(rows))
        if rows and "during_run" in rows[0]:
            steps += f" ({sum(r['during_run'] for r in rows)} while the run went on)"
        lines.append(f"| {name} | {steps} | {_cell(server) if server else '—'} |{cells} {ratio} |")
    return lines


BROWSERS = {"normal": "its sessions on the same machine as the server, at the same CPU priority",
            "low": "its sessions on the same machine as the server but at the lowest CPU priority (SCHED_IDLE), "
                   "standing in for browsers on the students' own machines"}
SERVER_NOTE = ("Server: the rerun's time on the server from the page's timing caption (model + page, with any wait "
               "for the engine thread behind other sessions); ")
VALUES_NOTE = ("Values in ms: p50 / p95 over every session's Steps. Goal of issue 39: with 8 sessions, server p50 "
               "≤ 2× one session's.")


def _pacing(pace: float) -> str:
    if pace <= 0:
        return "all at once"
    return (f"each waiting a think time before every Step (exponential, mean {pace:g} s, seeded per session), "
            "as students reading each token before pressing again")


def render(results: dict, steps: int, model: str, loads: tuple, version: str, command: str,
           browsers: str = "normal", pace: float = 0.0) -> str:
    title = "## Many sessions on one server" + (", browsers at low priority" if browsers == "low" else "")
    lines = [title, "",
             f"Command: `{command}`  ",
             f"Machine: {machine()}; {os.cpu_count()} CPUs; Chromium {version} headless (Playwright), "
             f"{BROWSERS[browsers]}.  ", load_note(*loads, os.cpu_count() or 1) + "  ",
             f"`streamlit run app.py` on the {model} model, greedy. Each session is a browser context of its own "
             f"(one Streamlit session each); after a warm-up Step, every session presses Step {steps} times, "
             f"{_pacing(pace)}. {SERVER_NOTE}click→chip: from the click until the frame showing the new token "
             f"chip, in the page's own clock. {VALUES_NOTE}", ""]
    return "\n".join(lines + _table(results, BROWSER_COLUMNS))


def render_ws(results: dict, steps: int, model: str, loads: tuple, client: str, command: str,
              pace: float) -> str:
    """The report of --client ws; `client` says what the client process was and what it cost."""
    lines = ["## Many sessions on one server, websocket clients (no browser)"
             + (f", think time {pace:g} s" if pace > 0 else ""), "",
             f"Command: `{command}`  ",
             f"Machine: {machine()}; {os.cpu_count()} CPUs; no browser: {client}.  ",
             load_note(*loads, os.cpu_count() or 1) + "  ",
             f"`streamlit run app.py` on the {model} model, greedy. Each session is a websocket client of its own "
             "speaking Streamlit's protocol (bench/ws_session.py: one Streamlit session each, a button press sent "
             "as a browser tab sends it, every message read, nothing drawn); after a warm-up Step, every session "
             f"presses Step {steps} times, {_pacing(pace)}; a session presses only once its previous run has "
             f"finished. {SERVER_NOTE}press→chip: from sending the press until the message carrying the new token "
             "chip arrived; press→finished: until the run's script_finished message arrived (after the step's "
             f"charts), both in the client's clock. {VALUES_NOTE}", ""]
    return "\n".join(lines + _table(results, WS_COLUMNS))


CLIENTS = ("browser", "ws")


MAX_PACE = 600.0          # s: a mean think time of ten minutes is a session that has left


def parse_pace(text: str) -> float:
    """--pace: a finite number of seconds, 0 to MAX_PACE (beyond it, asyncio's sleep overflows or the run never
    ends)."""
    try:
        pace = float(text)
    except ValueError:
        raise ValueError(f"--pace must be a number of seconds, got {text!r}") from None
    if not math.isfinite(pace) or pace < 0:
        raise ValueError(f"--pace must be a finite number of seconds, 0 or more, got {text!r}")
    if pace > MAX_PACE:
        raise ValueError(f"--pace must be at most {MAX_PACE:g} seconds (a mean think time), got {text!r}")
    return pace


def _checked(argv) -> tuple[argparse.Namespace, tuple[int, ...], float]:
    """The flags, refused in one line each where they cannot run: (args, session counts, pace)."""
    parser = argparse.ArgumentParser(prog="python -m bench load")
    parser.add_argument("--sessions", default="1,4,8", help="session counts, e.g. 1,4,8 (each 1–16)")
    parser.add_argument("--steps", type=int, default=8, help=f"Steps per session (1–{MAX_STEPS})")
    parser.add_argument("--model", choices=("embedded", "tiny"), default="embedded")
    parser.add_argument("--browsers", choices=tuple(BROWSERS), default="normal",
                        help="the browsers' CPU priority (low: SCHED_IDLE, as if on other machines)")
    parser.add_argument("--client", default="browser",
                        help="browser (Chromium through Playwright) or ws (websocket sessions, no browser)")
    parser.add_argument("--pace", default="0", help="mean think time in seconds before each Step "
                        "(exponential, seeded; default 0: press again at once)")
    args = parser.parse_args(argv)
    try:
        counts, pace = parse_sessions(args.sessions), parse_pace(args.pace)
    except ValueError as err:
        sys.exit(str(err))
    if not 1 <= args.steps <= MAX_STEPS:
        sys.exit(f"--steps must be between 1 and {MAX_STEPS}, got {args.steps}")
    if args.client not in CLIENTS:
        sys.exit(f"--client must be one of {', '.join(CLIENTS)}, got {args.client!r}")
    if args.client == "ws" and args.browsers != "normal":
        sys.exit(f"--browsers {args.browsers} applies to --client browser only; --client ws starts no browser")
    if args.client == "browser" and not os.path.exists(CHROMIUM):
        sys.exit(f"bench load needs Chromium at {CHROMIUM} (Debian's chromium package); not found")
    return args, counts, pace


def _command(args: argparse.Namespace, counts: tuple[int, ...], pace: float) -> str:
    command = f"python -m bench load --sessions {','.join(map(str, counts))} --steps {args.steps} --model {args.model}"
    command += " --browsers low" if args.browsers == "low" else ""
    command += " --client ws" if args.client == "ws" else ""
    return command + (f" --pace {pace:g}" if pace > 0 else "")


def _section(args: argparse.Namespace, pace: float) -> str:
    if args.client == "ws":
        return "load_ws_paced" if pace > 0 else "load_ws"
    return "load" if args.browsers == "normal" else "load_low"


def main(argv=None) -> None:
    args, counts, pace = _checked(argv)
    before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench_load_") as tmp_name:
        tmp = Path(tmp_name)
        env = {k: v for k, v in os.environ.items() if k != "DECODESCOPE_MODEL"}
        if args.model == "tiny":
            env["DECODESCOPE_MODEL"] = str(_tiny_model_dir(tmp / "model"))
        with streamlit_server(ROOT / "app.py", env, tmp / "server.log", cwd=ROOT) as url:
            if args.client == "ws":
                results, client = asyncio.run(_run_ws(url, counts, args.steps, pace))
            else:
                chromium = _idle_chromium(tmp) if args.browsers == "low" else CHROMIUM
                results, version = asyncio.run(_run(url, counts, args.steps, chromium, pace))
    loads, command = (before, os.getloadavg()), _command(args, counts, pace)
    if args.client == "ws":
        body = render_ws(results, args.steps, args.model, loads, client, command, pace)
    else:
        body = render(results, args.steps, args.model, loads, version, command, args.browsers, pace)
    write_section(_section(args, pace), body)
    print(body)
