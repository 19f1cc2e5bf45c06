"""γ policies for speculative decoding (the config's gamma_policy): before each round a policy says how many
drafts to verify and why (`pick`), after it learns what the round accepted (`update`). One small interface,
four policies:

- fixed: γ = gamma every round;
- heuristic: transformers' schedule, +2 after a fully accepted round, −1 otherwise (at least 1);
- confidence: γ = gamma, and drafting stops after the first token whose own q_draft is below the
  threshold (`threshold`, `cut`; transformers' ConfidenceCriteria);
- cost: the γ in 1..gamma that maximizes expected tokens per millisecond,

    (1 + E[accepted drafts | γ]) / (verify(γ + 1 tokens) + γ · draft token),

with verify() from a cost table (decoding.runtime.cost_table) and the draft token's cost profiled once per draft
model (0 for prompt lookup). E[accepted | γ] = Σ_{k=1..γ} Π_{i≤k} a_i, where a_i estimates
P(position i accepted | positions before it accepted) from this run's earlier rounds of the same
drafter: (accepted at i + 1) / (reached i + 2). γ never goes below 1, so the estimates keep learning.

Every policy reads only earlier rounds (and the draft's own q_draft), so every round stays exact.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from decoding.core.config import COST_POLICY, SPEC_MAX_GAMMA
from decoding.core.formulas import expected_accepted_by_size, round_ms, survival
from decoding.core.trace import GammaChoiceInfo
from decoding.runtime.cost_table import AUTO, CostTable, load_table


@dataclass(frozen=True)
class GammaPick:
    """A policy's answer before a round: γ, why (the trace's gamma_reason), and the cost policy's choice."""

    gamma: int
    reason: str
    choice: GammaChoiceInfo | None = None


class GammaPolicy:
    """The interface, and the fixed policy: γ = gamma every round. `threshold`: the confidence stop's q_draft
    (None: drafting does not stop early)."""

    name = "fixed"
    threshold: float | None = None

    def __init__(self, gamma: int):
        self.gamma = gamma
        self.reason = f"{self.name}: start at gamma={gamma}"

    @classmethod
    def for_run(cls, config, lm, drafter) -> GammaPolicy:
        """The policy a SpeculativeConfig names, for a run of `lm` drafted by `drafter`."""
        return cls(config.gamma)

    def pick(self, source: str) -> GammaPick:
        """γ for the next round, which `source` (the drafter's name for it) will draft."""
        return GammaPick(self.gamma, self.reason)

    def update(self, source: str, drafted: int, accepted: int) -> None:
        """A round of `source` verified `drafted` drafts and accepted the first `accepted`."""
        self.reason = f"fixed: gamma={self.gamma}"

    def cut(self, q_own: Sequence[float]) -> tuple[int, str]:
        """Drafts to verify of those drafted, given each one's q_draft of its own token, and a note why."""
        return len(q_own), ""


def heuristic_next(gamma: int, accepted: int, drafted: int) -> int:
    """transformers' "heuristic" schedule: +2 after a fully accepted round, -1 otherwise (min 1)."""
    return min(SPEC_MAX_GAMMA, gamma + 2) if accepted == drafted else max(1, gamma - 1)


class HeuristicPolicy(GammaPolicy):
    name = "heuristic"

    def update(self, source: str, drafted: int, accepted: int) -> None:
        gamma = self.gamma
        self.gamma = heuristic_next(gamma, accepted, drafted)
        how = f"all {drafted} drafts accepted: {gamma}+2" if accepted == drafted \
            else f"{accepted}/{drafted} accepted: {gamma}-1"
        self.reason = f"heuristic: last round {how} -> {self.gamma}"


def confidence_cut(q_own: Sequence[float], threshold: float) -> int:
    """Drafts kept by the confidence stop: up to and including the first token whose q_draft of its
    own token is below `threshold` (as transformers' ConfidenceCriteria)."""
    for i, q in enumerate(q_own):
        if q < threshold:
            return i + 1
    return len(q_own)


class ConfidencePolicy(GammaPolicy):
    name = "confidence"

    def __init__(self, gamma: int, threshold: float):
        super().__init__(gamma)
        self.threshold = threshold

    @classmethod
    def for_run(cls, config, lm, drafter) -> ConfidencePolicy:
        return cls(config.gamma, config.confidence_threshold)

    def update(self, source: str, drafted: int, accepted: int) -> None:
        self.reason = f"confidence: up to {self.gamma}, stop below q_draft {self.threshold}"

    def cut(self, q_own: Sequence[float]) -> tuple[int, str]:
        cut = confidence_cut(q_own, self.threshold)
        if cut < len(q_own) or q_own[cut - 1] < self.threshold:
            return cut, f"; stopped after {cut} (q_draft={q_own[cut - 1]:.3f} < {self.threshold})"
        return cut, ""


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


class CostPolicy(GammaPolicy):
    """The run's cost-aware γ: a table, each drafter's token cost, and acceptance counts per drafter."""

    name = COST_POLICY

    def __init__(self, cost: CostTable, draft_ms: dict[str, float], max_gamma: int):
        super().__init__(max_gamma)
        self.cost, self.draft_ms, self.max_gamma = cost, dict(draft_ms), max_gamma
        self.counts: dict[str, AcceptanceCounts] = {}

    @classmethod
    def for_run(cls, config, lm, drafter) -> CostPolicy:
        """The verify table (config.cost_table; None = auto) and each draft's token cost (profiled once per
        device and cached; prompt lookup costs nothing): make it where the steps run."""
        cost = load_table(lm, config.cost_table or AUTO, config.cost_need())
        return cls(cost, drafter.token_ms(lm), config.gamma)

    def pick(self, source: str) -> GammaPick:
        choice = self.choose(source)
        return GammaPick(choice.gamma, reason(choice), choice)

    def choose(self, source: str) -> GammaChoiceInfo:
        counts = self.counts.setdefault(source, AcceptanceCounts())
        return choose_gamma(counts, self.cost, self.draft_ms.get(source, 0.0), self.max_gamma, source)

    def update(self, source: str, drafted: int, accepted: int) -> None:
        self.counts.setdefault(source, AcceptanceCounts()).update(drafted, accepted)


POLICIES: dict[str, type[GammaPolicy]] = {"fixed": GammaPolicy, "heuristic": HeuristicPolicy,
                                          "confidence": ConfidencePolicy, COST_POLICY: CostPolicy}


def make_policy(config, lm, drafter) -> GammaPolicy:
    """The γ policy `config.gamma_policy` names (decoding.core.config.GAMMA_POLICIES)."""
    return POLICIES[config.gamma_policy].for_run(config, lm, drafter)
