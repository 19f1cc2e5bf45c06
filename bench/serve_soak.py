"""A soak of the endpoint: C streaming clients call `python -m decoding serve` without pause for M minutes,
each picking a seeded prompt and strategy per request. Before the clients start, greedy answers every prompt
once alone: at temperature 0 every strategy is lossless, so each answer must equal greedy's for its prompt,
and a mismatch counts as a lost or mixed-up response. The server's resident memory is read every
`--every` seconds and its request log's size at the end (the server keeps `--log-count` traces at most).

    python -m bench serve-soak [--minutes 10] [--clients 16] [--strategies greedy,speculative,dspark]
                               [--max-tokens 32] [--log-count 100] [--every 15] [--seed 0] [--no-write]

Bounded: at most 60 minutes and 16 clients; the server is stopped at the end.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.procs import check_ranges, client_counts
from bench.report import write_section
from bench.serve import (
    BUSY,
    MAX_CONCURRENCY,
    Result,
    ask,
    parse_strategies,
    prompts,
    resident_mib,
    served,
    served_model,
)
from decoding.runtime.packed_gemm import cpu_name
from decoding.serve.trace_log import default_folder

MAX_MINUTES = 60


@dataclass
class Tally:
    """What the clients saw, shared under a lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    results: list[Result] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)

    def add(self, result: Result, expected: str) -> None:
        with self.lock:
            self.results.append(result)
            if not result.error and result.text != expected:
                self.mismatched.append(f"{result.strategy} on {result.prompt}")


def references(client, model: str, max_tokens: int) -> dict[str, str]:
    """Greedy's answer to every prompt, asked one at a time before the soak."""
    answers = {}
    for name, text in prompts().items():
        result = ask(client, model, "greedy", 1, name, text, max_tokens)
        if result.error:
            sys.exit(f"the reference answer to {name} failed: {result.error}")
        answers[name] = result.text
    return answers


def client_loop(client, model: str, args, seed: int, deadline: float, expected: dict, tally: Tally) -> None:
    rng, texts = random.Random(seed), prompts()
    while time.monotonic() < deadline:
        name, strategy = rng.choice(sorted(texts)), rng.choice(args.strategies)
        tally.add(ask(client, model, strategy, args.clients, name, texts[name], args.max_tokens), expected[name])


def sample_memory(pid: int, every: float, stop: threading.Event, samples: list) -> None:
    while not stop.wait(every):
        samples.append(resident_mib(pid))


def log_size(folder: Path) -> tuple[int, float]:
    files = [p for p in folder.glob("*") if p.is_file()] if folder.is_dir() else []
    return len(files), sum(p.stat().st_size for p in files) / 2**20


def soak(args, base_url: str, model: str, pid: int) -> tuple[Tally, list]:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    expected, tally = references(client, model, args.max_tokens), Tally()
    samples, stop = [resident_mib(pid)], threading.Event()
    watcher = threading.Thread(target=sample_memory, args=(pid, args.every, stop, samples), daemon=True)
    watcher.start()
    deadline = time.monotonic() + args.minutes * 60
    threads = [threading.Thread(target=client_loop, args=(client, model, args, args.seed + c, deadline, expected,
                                                           tally), daemon=True) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=args.minutes * 60 + 900)
    stop.set()
    samples.append(resident_mib(pid))
    return tally, [s for s in samples if s is not None]


def render(tally: Tally, memory: list[float], log: tuple[int, float], args, command: str,
           loads: tuple = ((0.0,), (0.0,))) -> str:
    errors = sorted({r.error for r in tally.results if r.error})
    per = {s: sum(1 for r in tally.results if r.strategy == s) for s in args.strategies}
    tail = len(memory) // 2
    return "\n".join([
        "## The endpoint soaked: streaming clients without pause",
        "",
        f"`{command}`, {time.strftime('%Y-%m-%d')}; {cpu_name()}, {os.cpu_count()} CPU cores. "
        f"{args.clients} clients, each sending streamed chat requests back to back for {args.minutes:g} "
        f"minutes (at most {args.max_tokens} tokens, temperature 0, a seeded prompt and strategy per request); "
        "every answer compared with greedy's answer to the same prompt, asked alone before the soak. Load "
        f"average {loads[0][0]:.1f} before and {loads[1][0]:.1f} after (the load after includes the soak's own "
        "server and clients).",
        "",
        *([BUSY, ""] if loads[0][0] > (os.cpu_count() or 1) else []),
        "| requests | per strategy | failed | answers that differ from greedy's | server MiB: first / largest / "
        "last | largest in the second half vs the first | request log kept |",
        "|---|---|---|---|---|---|---|",
        f"| {len(tally.results)} | {', '.join(f'{s} {n}' for s, n in per.items())} | "
        f"{sum(1 for r in tally.results if r.error)} | {len(tally.mismatched)} | "
        f"{memory[0]:.0f} / {max(memory):.0f} / {memory[-1]:.0f} | "
        f"{max(memory[tail:]) - max(memory[:tail] or memory):+.0f} MiB | "
        f"{log[0]} traces, {log[1]:.1f} MiB (bound {args.log_count} traces) |",
        "",
        *([f"Failures: {'; '.join(errors)}."] if errors else []),
        *([f"Differing answers: {'; '.join(tally.mismatched[:5])}."] if tally.mismatched else []),
    ])


def checked(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench serve-soak")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", default="16")
    p.add_argument("--strategies", type=parse_strategies, default=("greedy", "speculative", "dspark"))
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--log-count", type=int, default=100)
    p.add_argument("--every", type=float, default=15.0, help="seconds between memory readings")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-write", action="store_true", help="print the table, leave BENCHMARKS.md alone")
    args = p.parse_args(argv)
    try:
        counts = client_counts(args.clients, "--clients", MAX_CONCURRENCY)
    except ValueError as err:
        raise SystemExit(str(err).replace("must each be", "must be")) from None
    if len(counts) != 1:
        raise SystemExit(f"--clients must be one number, got {args.clients!r}")
    args.clients = counts[0]
    check_ranges(args, {"--minutes": (0.1, MAX_MINUTES, " minutes"), "--max-tokens": (1, 1024, ""),
                        "--log-count": (1, 100_000, ""), "--every": (1, 600, " seconds")})
    return args


def main(argv=None) -> None:
    args = checked(argv)
    before = os.getloadavg()
    extra = ("--log-count", str(args.log_count))
    with served("default", args.max_tokens, args.clients, extra) as (base_url, pid):
        tally, memory = soak(args, base_url, served_model(base_url), pid)
        log = log_size(default_folder())
    command = "python -m bench serve-soak " + " ".join(sys.argv[2:] if argv is None else argv)
    body = render(tally, memory, log, args, command.strip(), (before, os.getloadavg()))
    print(body)
    if not args.no_write:
        write_section("serve_soak", body)
