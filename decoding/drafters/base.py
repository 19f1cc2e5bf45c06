"""The draft-source interface of speculative decoding. The verifier does not care which drafter proposed a
chain: each drafter returns up to `max_tokens` tokens, with their q_draft distributions where it has them
(processed by the same pipeline as the target), and rolls its own state back after a round."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from decoding.core.processors import Pipeline
from decoding.core.token_step import sample_inverse_cdf
from decoding.core.trace import LookupMatch
from decoding.runtime.models import LM


@dataclass(frozen=True)
class Proposal:
    tokens: tuple[int, ...]
    q_draft: torch.Tensor | None = None        # (n, V) processed draft probabilities; None: point mass
    draft_draws: tuple[float | None, ...] = ()  # u that sampled each token (None for argmax)
    lookup: LookupMatch | None = None
    source: str = ""                            # which drafter proposed it ("" = the run's drafter)

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class DraftRequest:
    """What the verifier asks for: up to max_tokens, chosen like the target chooses (pipeline/greedy)."""

    max_tokens: int
    pipeline: Pipeline
    greedy: bool
    generator: torch.Generator
    stop_below: float | None = None  # stop after a token whose q_draft is below this


class Drafter(ABC):
    name: str = "drafter"
    has_distributions: bool = False
    reads_target: bool = False       # wants the target's LM-head input after each round (`observe`)

    def start(self, prompt_ids: Sequence[int]) -> None:  # noqa: B027 - optional hook, no state by default
        """Forget any state from an earlier run."""

    @abstractmethod
    def propose(self, context: Sequence[int], request: DraftRequest) -> Proposal:
        """Propose up to request.max_tokens tokens to follow `context`."""

    def rollback(self, context: Sequence[int]) -> int:
        """Drop state beyond the longest prefix of `context` it holds; return positions removed."""
        return 0

    def source_for(self, context: Sequence[int]) -> str:
        """The name of the drafter that will draft after `context` (Proposal.source)."""
        return self.name

    def draft_models(self) -> dict[str, LM]:
        """The draft models it drafts with, by source name (none for prompt lookup)."""
        return {}

    def observe(self, head_input: torch.Tensor, context_length: int) -> None:  # noqa: B027 - optional hook
        """For a drafter that reads_target: the target's LM-head input (H,) that produced the last token of
        the context of `context_length` tokens (taken from the verification forward)."""

    def observe_rows(self, rows: torch.Tensor, first_position: int) -> None:
        """For a drafter that reads_target: the target's LM-head inputs (m, H) at positions first_position
        .. first_position + m − 1 of the kept context, every row of the verification forward up to the
        one that produced the context's last token. By default only that last row is kept (`observe`)."""
        self.observe(rows[-1], first_position + len(rows) + 1)

    def observe_logits(self, tokens: Sequence[int], logits: torch.Tensor) -> None:  # noqa: B027 - optional hook
        """The target's logits (n, V) after each of the last n tokens a verification forward fed (a
        training-free source fills its table from them)."""

    def token_ms(self, target: LM) -> dict[str, float]:
        """ms per drafted token, by source name (the cost-aware γ policy's draft cost; lookup is free)."""
        from decoding.runtime.cost_table import draft_token_ms

        return {name: draft_token_ms(target, model)[0] for name, model in self.draft_models().items()}


def draft_probs(logits: torch.Tensor, request: DraftRequest) -> torch.Tensor:
    """q_draft (V,): the draft logits under the request's pipeline (plain softmax when greedy)."""
    if request.greedy:
        return logits.softmax(-1)  # (V,)
    return request.pipeline(logits).softmax(-1)  # (V,)


def pick(logits: torch.Tensor, q_draft: torch.Tensor, request: DraftRequest) -> tuple[int, float | None]:
    """(token, u): the argmax when greedy, else a draw from q_draft (u, the uniform that drew it)."""
    if request.greedy:
        return int(torch.argmax(logits)), None
    return sample_inverse_cdf(q_draft, request.generator)
