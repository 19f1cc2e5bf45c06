"""An endpoint under load, as the seed's opening scene: `python -m decoding serve` (a separate process, loopback
only) called by the official `openai` SDK from C clients at once, each sending its share of the requests
back to back after a seeded think time, streamed. Per strategy and concurrency: P50/P90/P99 of time to first
token, inter-token latency and end to end as the clients see them, the server's queue time, and how many
answers differ from greedy's for the same prompt (at temperature 0 every strategy is lossless: 0 expected).

    python -m bench serve [--strategies greedy,speculative,dspark] [--concurrency 1,4,8] [--requests 12]
                          [--max-tokens 64] [--think SECONDS] [--seed 0] [--model default] [--no-write]

Prompts are shaped like the seed's: summaries of 500-1,000-token texts (written here from a seeded generator
of meeting minutes, so they never change) and free writing (bench/prompts.py FRESH_PROMPTS). Bounded: at most
16 clients and 200 requests per level; every request has a timeout; the server is stopped at the end.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.procs import check_ranges, client_counts, free_port, stop
from bench.prompts import FRESH_PROMPTS
from bench.report import write_section
from decoding.core.formulas import percentile
from decoding.runtime.packed_gemm import cpu_name

ROOT = Path(__file__).resolve().parents[1]
MAX_CONCURRENCY = 16
MAX_REQUESTS = 200
STRATEGIES = ("greedy", "speculative", "dspark")
REQUEST_TIMEOUT_S = 600
START_TIMEOUT_S = 600
BUSY = ("**The machine was busy with other work** (its load average passed its core count): every time here is "
        "inflated by it, so compare rows with one another, not with other sections, and rerun on an idle machine.")


# ------------------------------------------------------------------------------ prompts

PLACES = ("the river road", "the old market", "the north school", "the train station", "the harbour", "the park")
PEOPLE = ("the mayor", "two shop owners", "a group of parents", "the head of transport", "a local doctor",
          "the council's engineer", "several cyclists", "a bus driver")
ACTIONS = ("asked for a delay to", "spoke in favour of", "raised concerns about", "proposed changes to",
           "presented figures on", "questioned the cost of")
TOPICS = ("the new bicycle lanes", "the parking charges", "the summer festival", "the repairs to the bridge",
          "the library's opening hours", "the bus timetable", "the tree planting plan", "street lighting")
DETAILS = ("The estimate was {n} thousand pounds.", "Work would take about {n} weeks.",
           "A survey of {n} residents was quoted.", "The last review was {n} months ago.",
           "About {n} people signed the petition.")


def minutes(seed: int, sentences: int) -> str:
    """A seeded text of meeting minutes, `sentences` long (about 13 words each)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(sentences):
        lines.append(f"At {rng.choice(PLACES)}, {rng.choice(PEOPLE)} {rng.choice(ACTIONS)} {rng.choice(TOPICS)}.")
        if rng.random() < 0.5:
            lines.append(rng.choice(DETAILS).format(n=rng.randint(2, 90)))
    return " ".join(lines)


def prompts() -> dict[str, str]:
    """Three summaries (about 500, 750 and 1,000 tokens of text) and the free-writing prompts."""
    summaries = {f"summary-{n}": "Summarize the following minutes in three sentences.\n\n" + minutes(n, lines)
                 for n, lines in ((500, 25), (750, 36), (1000, 46))}
    return {**summaries, **FRESH_PROMPTS}


# ------------------------------------------------------------------------------ the clients

@dataclass(frozen=True)
class Result:
    """One request as its client saw it (seconds), and the server's queue time."""

    strategy: str
    concurrency: int
    prompt: str
    ttft_s: float | None
    itl_s: tuple[float, ...]
    e2e_s: float
    queue_s: float | None
    tokens: int
    text: str
    error: str | None = None


def plan(requests: int, concurrency: int, names: list[str], think_s: float, seed: int) -> list[list[tuple]]:
    """Per client, its (prompt name, think time before sending) in order: prompts dealt round-robin from a
    seeded shuffle, think times exponential with mean `think_s` (0: none), both from `seed`."""
    rng = random.Random(seed)
    order = [names[i % len(names)] for i in range(requests)]
    rng.shuffle(order)
    think = [rng.expovariate(1 / think_s) if think_s > 0 else 0.0 for _ in order]
    return [list(zip(order[c::concurrency], think[c::concurrency])) for c in range(concurrency)]


def ask(client, model: str, strategy: str, concurrency: int, name: str, text: str, max_tokens: int) -> Result:
    """One streamed chat request; the time of each chunk that carries text."""
    start, stamps, pieces, queue, tokens = time.perf_counter(), [], [], None, 0
    try:
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": text}], max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True}, extra_body={"decodescope": {"strategy": strategy}})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                stamps.append(time.perf_counter())
                pieces.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
                queue = (chunk.model_extra or {}).get("decodescope", {}).get("timing", {}).get("queue_s")
    except Exception as err:    # noqa: BLE001 - a failed request is counted, with its one line
        return Result(strategy, concurrency, name, None, (), time.perf_counter() - start, None, 0, "",
                      f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}")
    gaps = tuple(b - a for a, b in zip(stamps, stamps[1:]))
    ttft = stamps[0] - start if stamps else None
    return Result(strategy, concurrency, name, ttft, gaps, time.perf_counter() - start, queue, tokens,
                  "".join(pieces))


def level(client, model: str, strategy: str, concurrency: int, work: list[list[tuple]], max_tokens: int) -> list:
    """C clients at once, each sending its requests back to back after its think times."""
    texts, results, lock = prompts(), [], threading.Lock()

    def one_client(share):
        for name, think in share:
            time.sleep(think)
            result = ask(client, model, strategy, concurrency, name, texts[name], max_tokens)
            with lock:
                results.append(result)

    threads = [threading.Thread(target=one_client, args=(share,), daemon=True) for share in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=REQUEST_TIMEOUT_S * max(1, len(work[0])))
    return results


# ------------------------------------------------------------------------------ the server

def wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server stopped: {log.read_text(errors='replace').strip()[-400:]}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        time.sleep(0.5)
    sys.exit(f"the server did not answer /health within {START_TIMEOUT_S} s")


def resident_mib(pid: int) -> float | None:
    """A process's resident set size in MiB (None where /proc is missing or it has ended)."""
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


@contextlib.contextmanager
def served(model: str, max_tokens: int, concurrency: int, extra: tuple[str, ...] = ()) -> Iterator[tuple[str, int]]:
    """`python -m decoding serve` on a free loopback port, with `extra` flags; (its base URL, its process id);
    stopped after."""
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="bench_serve_")) / "server.log"
    cmd = [sys.executable, "-m", "decoding", "serve", "--model", model, "--port", str(port),
           "--max-new-tokens", str(max_tokens), "--max-waiting", str(max(64, concurrency)), *extra]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, log)
        yield f"http://127.0.0.1:{port}/v1", proc.pid
    finally:
        stop(proc, timeout=30)


def served_model(base_url: str) -> str:
    """The model id the server answers to (its /v1/models)."""
    with urllib.request.urlopen(base_url + "/models", timeout=10) as reply:
        return json.load(reply)["data"][0]["id"]


# ------------------------------------------------------------------------------ the table

def pct(values: list[float], q: float) -> str:
    return f"{percentile(values, q):.2f}" if values else "—"


def differing(results: list[Result]) -> int:
    """Answers that differ from greedy's answer to the same prompt (None of greedy's: not counted)."""
    greedy = {r.prompt: r.text for r in results if r.strategy == "greedy" and not r.error}
    return sum(1 for r in results if not r.error and r.prompt in greedy and r.text != greedy[r.prompt])


def row(results: list[Result], strategy: str, concurrency: int, wall_s: float) -> str:
    mine = [r for r in results if r.strategy == strategy and r.concurrency == concurrency]
    ok = [r for r in mine if not r.error]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [gap for r in ok for gap in r.itl_s]
    e2e, queue = [r.e2e_s for r in ok], [r.queue_s for r in ok if r.queue_s is not None]
    rate = sum(r.tokens for r in ok) / wall_s if wall_s > 0 else 0.0
    return (f"| {strategy} | {concurrency} | {len(ok)} | {len(mine) - len(ok)} | "
            f"{pct(ttft, 50)} / {pct(ttft, 90)} / {pct(ttft, 99)} | "
            f"{pct([g * 1000 for g in itl], 50)} / {pct([g * 1000 for g in itl], 99)} | "
            f"{pct(e2e, 50)} / {pct(e2e, 90)} / {pct(e2e, 99)} | {pct(queue, 50)} / {pct(queue, 99)} | {rate:.1f} |")


def e2e_at(results: list[Result], strategy: str, concurrency: int, q: float) -> float | None:
    values = [r.e2e_s for r in results if r.strategy == strategy and r.concurrency == concurrency and not r.error]
    return percentile(values, q) if values else None


def lesson_lines(results: list[Result], args) -> list[str]:
    """The seed's question per strategy: its speedup on one request (end-to-end P50 at 1 client against
    greedy's) beside what it does to P99 at 4 clients ("" where greedy, 1 or 4 clients were not run)."""
    if "greedy" not in args.strategies or not {1, 4} <= set(args.concurrency):
        return []
    lines = []
    for strategy in (s for s in args.strategies if s != "greedy"):
        one = (e2e_at(results, "greedy", 1, 50), e2e_at(results, strategy, 1, 50))
        four = (e2e_at(results, "greedy", 4, 99), e2e_at(results, strategy, 4, 99))
        if None in one or None in four:
            continue
        lines.append(f"- {strategy}: {one[0] / one[1]:.2f}× greedy's speed on one request (end-to-end P50 at "
                     f"1 client {one[1]:.2f} s against {one[0]:.2f} s); at 4 clients its P99 end to end is "
                     f"{four[1]:.2f} s against greedy's {four[0]:.2f} s ({four[0] / four[1]:.2f}× lower).")
    return ["The seed's question, per strategy: its speed on one request beside what it does to the tail at 4 "
            "clients, where each request also waits for the others' decoding:", "", *lines, ""] if lines else []


def render(results: list[Result], walls: dict, args, command: str, loads: tuple) -> str:
    header = ("| strategy | clients | requests | failed | TTFT s P50 / P90 / P99 | ITL ms P50 / P99 | "
              "end to end s P50 / P90 / P99 | queue s P50 / P99 | tokens/s |\n|---|---|---|---|---|---|---|---|---|")
    rows = [row(results, s, c, walls[s, c]) for s in args.strategies for c in args.concurrency]
    errors = sorted({r.error for r in results if r.error})
    return "\n".join([
        "## An endpoint under load: `python -m decoding serve` called by the openai SDK",
        "",
        f"`{command}`, {time.strftime('%Y-%m-%d')}; {cpu_name()}, {os.cpu_count()} CPU cores, load average "
        f"{loads[0][0]:.1f} before and {loads[1][0]:.1f} after (the load after includes this benchmark's own "
        "server and clients). Each level: the clients send their share of the requests back to back "
        f"(think time {args.think:g} s), streamed chat completions of at most {args.max_tokens} tokens, "
        "temperature 0; prompts: three summaries of 500–1,000-token texts and seven free-writing prompts. "
        "Times as the clients see them; queue time as the server records it. Requests decode one at a time: "
        "at C clients a request waits for up to C − 1 others.",
        "",
        *([BUSY, ""] if loads[0][0] > (os.cpu_count() or 1) else []),
        header, *rows, "",
        *lesson_lines(results, args),
        f"Answers that differ from greedy's answer to the same prompt: {differing(results)} (0 expected: "
        "every strategy is lossless at temperature 0).",
        *([f"Failures: {'; '.join(errors)}."] if errors else []),
    ])


def memory_line(mib: list[float | None]) -> str:
    """The server's resident memory once started and after the last request ("" where it was not read)."""
    if None in mib:
        return ""
    return (f"\nThe server's resident memory: {mib[0]:.0f} MiB once started, {mib[1]:.0f} MiB after the last "
            "request (the request log is on disk).")


# ------------------------------------------------------------------------------ main

def parse_counts(text: str) -> tuple[int, ...]:
    try:
        return client_counts(text, "--concurrency", MAX_CONCURRENCY)
    except ValueError as err:
        raise SystemExit(str(err)) from None


def parse_strategies(text: str) -> tuple[str, ...]:
    names = tuple(text.split(","))
    bad = [n for n in names if n not in ("greedy", "sample", "beam", "speculative", "dspark")]
    if bad or not names:
        raise SystemExit(f"--strategies must be names from greedy, sample, beam, speculative, dspark, got {text!r}")
    return names


def checked(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench serve")
    p.add_argument("--strategies", type=parse_strategies, default=STRATEGIES)
    p.add_argument("--concurrency", type=parse_counts, default=(1, 4, 8))
    p.add_argument("--requests", type=int, default=12, help="requests per strategy and concurrency")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--think", type=float, default=0.0, help="mean think time before each request, seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="default")
    p.add_argument("--no-write", action="store_true", help="print the table, leave BENCHMARKS.md alone")
    args = p.parse_args(argv)
    check_ranges(args, {"--requests": (1, MAX_REQUESTS, ""), "--max-tokens": (1, 1024, ""),
                        "--think": (0, 60, " seconds")})
    return args


def run_levels(args, base_url: str, model: str) -> tuple[list[Result], dict]:
    """Every strategy at every concurrency, in that order, on one server; one warm-up request per strategy."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S)
    names, results, walls = list(prompts()), [], {}
    for strategy in args.strategies:
        ask(client, model, strategy, 0, names[-1], prompts()[names[-1]], 4)      # loads what it needs
        for c in args.concurrency:
            start = time.perf_counter()
            results += level(client, model, strategy, c, plan(args.requests, c, names, args.think, args.seed),
                             args.max_tokens)
            walls[strategy, c] = time.perf_counter() - start
            print(row(results, strategy, c, walls[strategy, c]), flush=True)
    return results, walls


def main(argv=None) -> None:
    args = checked(argv)
    before = os.getloadavg()
    with served(args.model, args.max_tokens, max(args.concurrency)) as (base_url, pid):
        model = served_model(base_url)
        memory = [resident_mib(pid)]
        results, walls = run_levels(args, base_url, model)
        memory.append(resident_mib(pid))
    command = "python -m bench serve " + " ".join(sys.argv[2:] if argv is None else argv)
    body = render(results, walls, args, command.strip(), (before, os.getloadavg())) + memory_line(memory)
    print(body)
    if not args.no_write:
        write_section("serve", body)
