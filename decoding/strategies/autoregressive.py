"""The single-sequence loop shared by greedy and sampling: one target forward per new token with a
KV cache, a choice rule, and a TokenStep per position."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence

import torch

from decoding.core.config import BaseConfig
from decoding.core.processors import Applied, Pipeline, apply_tracked
from decoding.core.token_step import Choice, Scored, token_step
from decoding.runtime.models import LM, Timer, kv_memory

# choose(applied, raw, generator) -> (token, draw or None)
Chooser = Callable[[Applied, torch.Tensor, torch.Generator], tuple[int, float | None]]


def decode_loop(lm: LM, prompt_ids: Sequence[int], config: BaseConfig, *, pipeline: Pipeline, choose: Chooser,
                generator: torch.Generator, forced: Sequence[int] = ()) -> Iterator:
    """Yield one TokenStep per new token until EOS, config.max_new_tokens or the context end (config.top_n
    candidates per step).
    Tokens in `forced` are imposed first (the choice rule still runs, so random draws stay aligned
    with an unforced run)."""
    cache = lm.sequence_cache()
    feed = list(prompt_ids)
    position = len(feed)
    for index in range(config.max_new_tokens):
        if position >= lm.context_length:
            return
        timer = Timer(lm)
        raw = lm.forward(feed, cache, logits_to_keep=1)[-1]  # (V,)
        timer.lap("prefill" if index == 0 else "forward")
        applied = apply_tracked(pipeline, raw)
        timer.lap("processing")
        token, draw = choose(applied, raw, generator)
        is_forced = index < len(forced)
        if is_forced:
            token = int(forced[index])
        timer.lap("sampling")
        step = token_step(lm, index=index, position=position, scored=Scored(raw, pipeline, applied),
                          choice=Choice(token, draw, is_forced), top_n=config.top_n)
        yield dataclasses.replace(step, timings_ms=timer.done(), kv=kv_memory(cache))
        if token in lm.eos_ids:
            return
        feed = [token]
        position += 1
