"""Cost-aware γ for speculative decoding (gamma_policy "cost"): before each round, the γ in 1..gamma
that maximizes expected tokens per millisecond,

    (1 + E[accepted drafts | γ]) / (verify(γ + 1 tokens) + γ · draft token),

with verify() from a cost table (decoding.runtime.cost_table) and the draft token's cost profiled once per draft
model (0 for prompt lookup). E[accepted | γ] = Σ_{k=1..γ} Π_{i≤k} a_i, where a_i estimates
P(position i accepted | positions before it accepted) from this run's earlier rounds of the same
drafter: (accepted at i + 1) / (reached i + 2). γ never goes below 1, so the estimates keep learning.
The choice reads only earlier rounds, so every round stays exact.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from decoding.core.formulas import expected_accepted_by_size, round_ms, survival
from decoding.core.trace import GammaChoiceInfo
from decoding.runtime.cost_table import CostTable


@dataclass
class AcceptanceCounts:
    """Per drafted position i (0-based): rounds that reached it (all before it accepted) and rounds
    that accepted it."""

    reached: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    def estimate(self, i: int) -> float:
        reached = self.reached[i] if i < len(self.reached) else 0
        accepted = self.accepted[i] if i < len(self.accepted) else 0
        return (accepted + 1) / (reached + 2)

    def update(self, drafted: int, accepted: int) -> None:
        """A round that verified `drafted` drafts and accepted the first `accepted` of them."""
        grow = drafted - len(self.reached)
        if grow > 0:
            self.reached.extend([0] * grow)
            self.accepted.extend([0] * grow)
        for i in range(min(drafted, accepted + 1)):
            self.reached[i] += 1
            self.accepted[i] += 1 if i < accepted else 0

    def key(self) -> tuple:
        return tuple(self.reached), tuple(self.accepted)


def choose_gamma(counts: AcceptanceCounts, cost: CostTable, draft_ms: float, max_gamma: int,
                 source: str = "") -> GammaChoiceInfo:
    """The γ in 1..max_gamma with the most expected tokens per ms (ties: the smaller γ)."""
    acceptance = tuple(counts.estimate(i) for i in range(max_gamma))
    expected = expected_accepted_by_size(survival(acceptance), start=1.0)   # 1 + E[accepted] per γ = 1..max
    ms = [round_ms(cost.ms(g + 1), g, draft_ms) for g in range(1, max_gamma + 1)]
    per_token = tuple(m / e for m, e in zip(ms, expected))
    gamma = min(range(max_gamma), key=lambda g: (per_token[g], g)) + 1
    return GammaChoiceInfo(source=source, cost_source=cost.source, verify_ms=tuple(cost.verify_ms[:max_gamma + 1]),
                           draft_ms=float(draft_ms), acceptance=acceptance, expected_tokens=tuple(expected),
                           ms_per_token=per_token, gamma=gamma)


def reason(info: GammaChoiceInfo) -> str:
    g = info.gamma
    return (f"cost: γ={g} has the fewest ms per expected token for {info.source} "
            f"({info.ms_per_token[g - 1]:.1f} ms: {info.expected_tokens[g - 1]:.2f} tokens expected for "
            f"{info.ms_per_token[g - 1] * info.expected_tokens[g - 1]:.1f} ms)")


class CostPolicy:
    """The run's cost-aware γ: a table, each drafter's token cost, and acceptance counts per drafter."""

    def __init__(self, cost: CostTable, draft_ms: dict[str, float], max_gamma: int):
        self.cost, self.draft_ms, self.max_gamma = cost, dict(draft_ms), max_gamma
        self.counts: dict[str, AcceptanceCounts] = {}

    def choose(self, source: str) -> GammaChoiceInfo:
        counts = self.counts.setdefault(source, AcceptanceCounts())
        return choose_gamma(counts, self.cost, self.draft_ms.get(source, 0.0), self.max_gamma, source)

    def update(self, source: str, drafted: int, accepted: int) -> None:
        self.counts.setdefault(source, AcceptanceCounts()).update(drafted, accepted)
