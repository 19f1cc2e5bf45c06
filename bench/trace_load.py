"""Loading a large trace: `from_json` on ~40 MiB traces built from the shipped tour traces (their steps
repeated, each step's index renumbered), the median of a few loads each, with the share that is
`json.loads` alone. Writes the `trace_load` section of BENCHMARKS.md."""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

from bench.report import machine, write_section
from decoding.core.trace import from_json, recounted, to_json
from decoding.runtime.paths import TOUR_DIR as TOUR

SOURCES = ("sampling", "beam", "speculative", "dspark")


def _copy(step, index: int, repeated: bool):
    """`step` at `index`; a repeated speculative round without the first round's `drafting` (the loader refuses
    it on later rounds)."""
    later = repeated and step.kind == "spec_round"
    return dataclasses.replace(step, index=index, **({"drafting": None} if later else {}))


def grown(name: str, mib: float) -> bytes:
    """The tour trace `name` with its steps repeated until the JSON is about `mib` MiB, its output and
    counts recomputed from those steps (the loader checks them against the steps)."""
    text = (TOUR / f"{name}.json").read_text(encoding="utf-8")
    small = from_json(text)
    first = small.steps[:1] if small.strategy == "dspark" else ()      # DSpark's prefill comes once
    body = small.steps[len(first):]
    count = int(mib * 2 ** 20 / (len(json.dumps(json.loads(text)["steps"][len(first):])) / len(body)))
    steps = first + tuple(_copy(body[i % len(body)], len(first) + i, i >= len(body)) for i in range(count))
    return to_json(recounted(dataclasses.replace(small, steps=steps))).encode()


def seconds(call, payload: bytes, repeats: int) -> float:
    """Median wall time of call(payload)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call(payload)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench trace_load")
    p.add_argument("--mib", type=float, default=40.0)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    rows = []
    for name in SOURCES:
        payload = grown(name, args.mib)
        steps = len(from_json(payload).steps)
        rows.append((name, len(payload) / 2 ** 20, steps, seconds(from_json, payload, args.repeats),
                     seconds(json.loads, payload, args.repeats)))
    lines = ["## Loading a large trace", "",
             f"Command: `python -m bench trace_load --mib {args.mib:g} --repeats {args.repeats}`  ",
             f"Machine: {machine()}.  ",
             "`decoding.core.trace.from_json` (parse, type every field, check every cross-reference and cap) on a "
             "tour trace (assets/tour) whose steps are repeated to the size shown; the median of the repeats.",
             "", "| trace | MiB | steps | from_json s | of which json.loads s |", "|---|---|---|---|---|"]
    lines += [f"| {n} | {mib:.1f} | {steps} | {load:.2f} | {parse:.2f} |" for n, mib, steps, load, parse in rows]
    body = "\n".join(lines)
    print(body)
    write_section("trace_load", body)
