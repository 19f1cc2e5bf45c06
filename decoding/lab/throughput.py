"""Throughput against latency, measured: greedy decoding of b copies of a prompt at once, each step timed.
A bigger batch emits b tokens per step, but every request waits for the whole step."""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import torch

from decoding.core.errors import check
from decoding.core.measures import BatchDecode, ThroughputConfig
from decoding.lab.forward_cost import within_memory


def decode_batch(lm, prompt_ids: Sequence[int], batch: int, steps: int) -> BatchDecode:
    """Greedy decoding of `batch` copies of the prompt for 2 + `steps` tokens (no stop at EOS): the
    prefill and one step untimed, then `steps` timed steps."""
    rows = torch.tensor([list(prompt_ids)] * batch, dtype=torch.long)
    cache = lm.new_cache()
    chosen = lm.forward_rows(rows, cache)[:, -1].argmax(-1, keepdim=True)
    tokens = [int(chosen[0, 0])]
    times = []
    for i in range(steps + 1):
        lm.sync()
        start = time.perf_counter()
        chosen = lm.forward_rows(chosen, cache)[:, -1].argmax(-1, keepdim=True)
        lm.sync()
        if i:                                        # the first step is the warm-up
            times.append((time.perf_counter() - start) * 1000.0)
        tokens.append(int(chosen[0, 0]))
    return BatchDecode(batch, tuple(times), tuple(tokens))


def measure_throughput(lm, prompt_ids: Sequence[int], config: ThroughputConfig | None = None
                       ) -> Iterator[BatchDecode]:
    """One BatchDecode per batch size; a batch beyond the device's memory or a prompt that leaves no room
    for the steps is a ConfigError naming it."""
    config = config or ThroughputConfig()
    check(len(prompt_ids) + config.steps + 2 <= lm.context_length, "steps", config.steps,
          f"with a prompt of {len(prompt_ids)} tokens must fit the model's context of {lm.context_length}")
    points = (decode_batch(lm, prompt_ids, b, config.steps) for b in config.batches)
    yield from within_memory(lm, "batches", config.batches, points)
