"""Interleaved timing, the benchmarks' speed rule: every contender runs on every prompt in one process,
in the listed order on even repeats and in reverse on odd ones, so that a slow spell of the machine falls
on all of them alike; a contender's speed is its tokens/s over the reference's (plain greedy, ours) on
the same prompt in the same repeat.

    for results in interleaved(runs, encoded_prompts, repeats, lm.device):
        results["dspark chain γ=8"].speed        # tokens/s ÷ greedy's, this prompt and repeat
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from bench.memory import peak_memory
from decoding.core.formulas import speed_vs

REFERENCE = "greedy (ours)"


@dataclass(frozen=True)
class Timed:
    """One contender's call on one prompt."""

    tokens: int
    seconds: float
    extra: object                  # what the contender returned after (tokens, seconds): a trace, stats or None
    peak_mib: float | None         # memory held above the call's start (bench/memory.py)
    speed: float                   # tokens/s ÷ the reference's tokens/s (same prompt, same repeat)


def interleaved(runs: Mapping[str, Callable], encoded: Sequence[Sequence[int]], repeats: int, device,
                reference: str = REFERENCE) -> Iterator[dict[str, Timed]]:
    """Per repeat × prompt, {name: Timed} in the order the contenders ran. Each run maps prompt ids to
    (tokens, seconds, extra)."""
    for rep in range(repeats):
        for ids in encoded:
            names = list(runs) if rep % 2 == 0 else list(reversed(runs))
            results, peaks = {}, {}
            for name in names:
                with peak_memory(device) as mem:
                    results[name] = runs[name](ids)
                peaks[name] = mem.above_mib
            base = results[reference][0] / results[reference][1]
            yield {name: Timed(tokens, wall, extra, peaks[name], speed_vs(tokens / wall, base))
                   for name, (tokens, wall, extra) in results.items()}
