"""Greedy search: always the target's argmax."""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from decoding.core.config import GreedyConfig
from decoding.core.processors import Pipeline
from decoding.runtime.models import LM
from decoding.strategies.autoregressive import decode_loop


def choose_argmax(applied, raw: torch.Tensor, generator) -> tuple[int, None]:
    return int(torch.argmax(raw)), None


def decode(lm: LM, prompt_ids: Sequence[int], config: GreedyConfig, *, generator: torch.Generator,
           forced: Sequence[int] = ()) -> Iterator:
    return decode_loop(lm, prompt_ids, config, pipeline=Pipeline(()), choose=choose_argmax,
                       generator=generator, forced=forced)
