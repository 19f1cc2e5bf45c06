"""The losslessness lab: the next token's distribution under each acceptance rule, exactly and sampled.

For the prompt's next position the target gives p_target (its processed distribution) and a draft gives
q_draft (here the same model under the draft's own temperature and top-k: any draft would do, the exact
rules do not care). Over the support of the two (every token either can give), four rules:

- speculative: one draft x ~ q_draft, accepted with min(1, p_target(x) / q_draft(x)), else the residual
  norm(max(0, p_target − q_draft)) — exact: the next token is distributed as p_target.
- dspark: the draft's top `candidates` tokens as the first level of a tree, the tree rule (accept a child
  with its probability under the current residual, else zero it and go on) — exact.
- lossy: DSpark's labelled lossy mode: the first candidate with p_target above the threshold is accepted
  outright, otherwise the tree rule — not exact.
- retrospective: two drafts drawn from q_draft, the plan keeps the one whose ratio p_target / q_draft is
  larger (it has looked at what the target will say), then the speculative rule as if it had drawn that
  one alone — not exact. With p_target (0.7, 0.3) and q_draft (0.5, 0.5) it gives (0.85, 0.15).

Each rule's exact distribution is computed by enumeration (decoding.core.exact_rules; Fractions stay exact), and
`samples` seeded rounds run the engine's own sampling code (decoding.core.acceptance.sample_round for the
tree rules, the speculative ratio rule's functions) for an empirical histogram and a χ² test.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from decoding.core.acceptance import ratio_accepts, residual_distribution, sample_round
from decoding.core.exact_rules import (  # the exact side, torch-free (the view imports it from there)
    RETROSPECTIVE_DRAWS,
    retrospective_exact,
    speculative_exact,
    tree_exact,
)
from decoding.core.formulas import chi_square
from decoding.core.measures import LOSSLESS_RULES, LosslessConfig, LosslessResult, RuleOutcome
from decoding.core.processors import build_pipeline
from decoding.core.token_step import sample_inverse_cdf


# ---------------------------------------------------------------- exact distributions: decoding.core.exact_rules
def total_variation(a: Sequence, b: Sequence):
    return sum(abs(x - y) for x, y in zip(a, b)) / 2


# ---------------------------------------------------------------- sampled: the engine's code, seeded
def _sample_speculative(p: torch.Tensor, q: torch.Tensor, gen: torch.Generator, draws: int = 1) -> int:
    """One round of the ratio rule; draws > 1: the retrospective plan (keep the best ratio)."""
    xs = [sample_inverse_cdf(q, gen)[0] for _ in range(draws)]
    x = max(xs, key=lambda t: float(p[t] / q[t]))
    if ratio_accepts(float(p[x]), float(q[x]), gen)[0]:
        return x
    return sample_inverse_cdf(residual_distribution(p, q), gen)[0]


def _sample_tree(p: torch.Tensor, children: Sequence[int], gen: torch.Generator, threshold=None) -> int:
    tokens = (0, *children)                       # node 0 the root; the children are leaves
    rows = p.expand(len(tokens), -1)
    outcome = sample_round(tokens, (-1,) + (0,) * len(children), rows, gen, threshold)
    return tokens[outcome.accepted[0]] if outcome.accepted else outcome.next_token


def sample_rule(rule: str, p: torch.Tensor, q: torch.Tensor, children: Sequence[int], config: LosslessConfig
                ) -> list[int]:
    """`config.samples` seeded rounds of `rule`; the next token of each (support indices)."""
    gen = torch.Generator().manual_seed(config.seed)
    draw = {"speculative": lambda: _sample_speculative(p, q, gen),
            "retrospective": lambda: _sample_speculative(p, q, gen, RETROSPECTIVE_DRAWS),
            "dspark": lambda: _sample_tree(p, children, gen),
            "lossy": lambda: _sample_tree(p, children, gen, config.lossy_threshold)}[rule]
    return [draw() for _ in range(config.samples)]


def exact_rule(rule: str, p: Sequence, q: Sequence, children: Sequence[int], config: LosslessConfig) -> list:
    return {"speculative": lambda: speculative_exact(p, q),
            "retrospective": lambda: retrospective_exact(p, q),
            "dspark": lambda: tree_exact(p, children),
            "lossy": lambda: tree_exact(p, children, config.lossy_threshold)}[rule]()


# ---------------------------------------------------------------- on the model
def next_token_distributions(lm, prompt_ids: Sequence[int], config: LosslessConfig
                             ) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """(support token ids, p_target, q_draft over the support, float64) at the prompt's next position."""
    logits = lm.forward(list(prompt_ids), lm.new_cache(), logits_to_keep=1)[-1].double()    # (V,)
    p = torch.softmax(build_pipeline(config.temperature, config.top_k)(logits), -1)
    q = torch.softmax(build_pipeline(config.draft_temperature, config.draft_top_k)(logits), -1)
    support = torch.nonzero((p > 0) | (q > 0)).flatten()
    p_s, q_s = p[support], q[support]
    return support.tolist(), p_s / p_s.sum(), q_s / q_s.sum()


def measure_lossless(lm, prompt_ids: Sequence[int], config: LosslessConfig | None = None) -> LosslessResult:
    config = config or LosslessConfig()
    ids, p, q = next_token_distributions(lm, prompt_ids, config)
    children = torch.argsort(q, descending=True, stable=True)[:config.candidates].tolist()
    p_list, q_list = p.tolist(), q.tolist()
    outcomes = []
    for rule in LOSSLESS_RULES:
        exact = exact_rule(rule, p_list, q_list, children, config)
        drawn = sample_rule(rule, p, q, children, config)
        counts = [0] * len(ids)
        for x in drawn:
            counts[x] += 1
        statistic, dof, p_value = chi_square(counts, p_list)
        outcomes.append(RuleOutcome(rule, tuple(float(v) for v in exact), tuple(counts),
                                    float(total_variation(exact, p_list)), statistic, dof, p_value))
    return LosslessResult(tuple(ids), tuple(lm.piece(t) for t in ids), tuple(p_list), tuple(q_list),
                          tuple(children), tuple(outcomes))
