"""Speculative decoding's chain request, and how a source with a distribution draws its chain.

Every drafter is a source (decoding.drafters.lattice_source.LatticeSource) behind one composer
(decoding.drafters.source_chain). A round asks for a chain: up to `max_tokens` tokens drawn like the target
chooses (its pipeline, or the argmax when greedy, with the run's generator). A source with a distribution
answers with its chain and the q_draft rows it drew from (processed by the same pipeline as the target),
prompt lookup with a point-mass chain, and a tree source with its tree, walked by the composer."""
from __future__ import annotations

import torch

from decoding.core.lattice import ChainDraw, SourceRequest
from decoding.core.processors import Pipeline
from decoding.core.token_step import sample_inverse_cdf

CHAIN_NODES = 24            # tree nodes the sources propose per chain request before the composer's walk


class DraftRequest(SourceRequest):
    """A chain request: up to max_tokens tokens drawn like the target (pipeline/greedy/generator), stopping
    after a token whose q_draft is below stop_below; tree sources read it as any request (γ = max_tokens,
    CHAIN_NODES nodes)."""

    def __init__(self, max_tokens: int, pipeline: Pipeline, greedy: bool, generator: torch.Generator,
                 stop_below: float | None = None):
        super().__init__(max_tokens, CHAIN_NODES, chain=ChainDraw(pipeline, greedy, generator, stop_below))


def draft_probs(logits: torch.Tensor, draw: ChainDraw) -> torch.Tensor:
    """q_draft (V,): the draft logits under the request's pipeline (plain softmax when greedy)."""
    if draw.greedy:
        return logits.softmax(-1)  # (V,)
    return draw.pipeline(logits).softmax(-1)  # (V,)


def pick(logits: torch.Tensor, q_draft: torch.Tensor, draw: ChainDraw) -> tuple[int, float | None]:
    """(token, u): the argmax when greedy, else a draw from q_draft (u, the uniform that drew it)."""
    if draw.greedy:
        return int(torch.argmax(logits)), None
    return sample_inverse_cdf(q_draft, draw.generator)
