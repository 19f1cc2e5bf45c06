"""Sampling with temperature, top-k, top-p and min-p, by inverse CDF so the draw u is recorded."""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from decoding.core.config import SampleConfig
from decoding.core.processors import build_pipeline
from decoding.core.token_step import sample_inverse_cdf
from decoding.runtime.models import LM
from decoding.strategies.autoregressive import decode_loop


def choose_sample(applied, raw: torch.Tensor, generator: torch.Generator) -> tuple[int, float]:
    return sample_inverse_cdf(applied.logits.softmax(-1), generator)


def decode(lm: LM, prompt_ids: Sequence[int], config: SampleConfig, *, generator: torch.Generator,
           forced: Sequence[int] = ()) -> Iterator:
    pipeline = build_pipeline(config.temperature, config.top_k, config.top_p, config.min_p)
    return decode_loop(lm, prompt_ids, config, pipeline=pipeline, choose=choose_sample,
                       generator=generator, forced=forced)
