"""Logits processors: temperature, top-k, top-p, min-p.

Each processor is pure (logits in, new logits out; the input is never changed) and validated in
`__init__` with a message naming the parameter and the bad value. They act on the last dimension, so
(V,) and (B, V) inputs both work, and they match transformers' warpers of the same name, applied in
transformers' order: temperature -> top-k -> top-p -> min-p.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from decoding.core.errors import check

NEG_INF = float("-inf")


class Temperature:
    name = "temperature"

    def __init__(self, temperature: float):
        check(isinstance(temperature, (int, float)) and temperature > 0, "temperature", temperature,
              "must be a number > 0 (use greedy for temperature 0)")
        self.value = float(temperature)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return logits / self.value


class TopK:
    name = "top_k"

    def __init__(self, top_k: int, min_tokens_to_keep: int = 1):
        check(isinstance(top_k, int) and top_k >= 1, "top_k", top_k, "must be an integer >= 1 (0 disables it)")
        self.value = top_k
        self.min_keep = min_tokens_to_keep

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        k = min(max(self.value, self.min_keep), logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)
        return logits.masked_fill(logits < kth, NEG_INF)


class TopP:
    name = "top_p"

    def __init__(self, top_p: float, min_tokens_to_keep: int = 1):
        check(isinstance(top_p, (int, float)) and 0 < top_p <= 1, "top_p", top_p, "must be in (0, 1]")
        self.value = float(top_p)
        self.min_keep = min_tokens_to_keep

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=False)  # ascending, as transformers
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1 - self.value)
        remove_sorted[..., -self.min_keep:] = False
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        return logits.masked_fill(remove, NEG_INF)


class MinP:
    name = "min_p"

    def __init__(self, min_p: float, min_tokens_to_keep: int = 1):
        check(isinstance(min_p, (int, float)) and 0 <= min_p <= 1, "min_p", min_p, "must be in [0, 1]")
        self.value = float(min_p)
        self.min_keep = min_tokens_to_keep

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        probs = logits.softmax(dim=-1)
        floor = self.value * probs.amax(dim=-1, keepdim=True)
        remove = probs < floor
        keep = torch.topk(probs, min(self.min_keep, probs.shape[-1]), dim=-1).indices
        remove = remove.scatter(-1, keep, False)
        return logits.masked_fill(remove, NEG_INF)


@dataclass(frozen=True)
class Pipeline:
    """The processors of one sampling configuration, in transformers' order."""

    steps: tuple

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        for proc in self.steps:
            logits = proc(logits)
        return logits


def build_pipeline(temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                   min_tokens_to_keep: int = 1) -> Pipeline:
    """Processors enabled by these values, skipping the neutral ones as transformers does."""
    steps = []
    if temperature != 1.0:
        steps.append(Temperature(temperature))
    if top_k != 0:
        steps.append(TopK(top_k, min_tokens_to_keep))
    if top_p < 1.0:
        steps.append(TopP(top_p, min_tokens_to_keep))
    if min_p > 0.0:
        steps.append(MinP(min_p, min_tokens_to_keep))
    return Pipeline(tuple(steps))


@dataclass(frozen=True)
class Applied:
    """Result of a pipeline on one (V,) row, with who removed what."""

    logits: torch.Tensor        # (V,) processed logits, -inf where removed
    removed_by: torch.Tensor    # (V,) int8: 0 kept, i+1 removed by steps[i]
    scaled: torch.Tensor        # (V,) logits after temperature only (what the filters cut from)
    stages: tuple = ()          # (V,) logits after each step, in order (stages[-1] is `logits`)


def apply_tracked(pipeline: Pipeline, logits: torch.Tensor) -> Applied:
    """Run `pipeline` on a (V,) row, recording which filter removed each token first."""
    removed_by = torch.zeros(logits.shape, dtype=torch.int8, device=logits.device)
    scaled, stages = logits, []
    for i, proc in enumerate(pipeline.steps):
        out = proc(logits)
        if isinstance(proc, Temperature):
            scaled = out
        else:
            newly = (out == NEG_INF) & (logits != NEG_INF)
            removed_by[newly] = i + 1
        stages.append(out)
        logits = out
    return Applied(logits, removed_by, scaled, tuple(stages))
