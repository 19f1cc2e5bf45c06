"""Monte Carlo chi-square: speculative sampling on tiny random llamas (target and draft from different
seeds, same vocabulary; and a feature drafter over the target's LM-head input) reproduces plain sampling's exact
first-token and two-token distributions.

alpha = 1e-3 for every test: a correct implementation fails with probability 1e-3 over seed sets (the
seeds are fixed, so the outcome is deterministic). Power: each negative control's exact wrong
distribution is computed and its noncentrality lambda = n * sum((p_wrong - p_target)^2 / p_target) is
asserted to be >= 60, which at <= 16 degrees of freedom and alpha = 1e-3 gives power > 0.99
(scipy: ncx2.sf(chi2.ppf(0.999, 16), 16, 60) = 0.995). Here lambda is 83 (ratio rule) and 120
(point-mass rule) at n = 600; the feature drafter's control computes and asserts its own."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy import stats
from spec_helpers import peaked_lm

from decoding.core.config import SpeculativeConfig
from decoding.core.processors import build_pipeline
from decoding.drafters.draft_model import DraftModelDrafter
from decoding.drafters.lookup import LookupThenDraftDrafter, PromptLookupDrafter
from decoding.strategies import speculative

pytestmark = pytest.mark.slow

ALPHA = 1e-3
N_RUNS = 600
PROMPT = [1, 2, 3, 4, 5, 1, 2]   # lookup proposes [3, 4, 5, 1, 2] after the 2-gram (1, 2)
CONFIG = SpeculativeConfig(draft="lookup", max_new_tokens=3, gamma=2, temperature=0.9, top_k=12, top_n=1)


@pytest.fixture(scope="module")
def target():
    return peaked_lm(0)


@pytest.fixture(scope="module")
def draft(target):
    return DraftModelDrafter(peaked_lm(1), target)


def target_probs(lm, ids) -> torch.Tensor:
    pipeline = build_pipeline(CONFIG.temperature, CONFIG.top_k)
    return pipeline(lm.forward(list(ids), lm.new_cache())[-1]).softmax(-1).double()  # (V,)


def exact_pairs(lm) -> dict[tuple[int, int], float]:
    first = target_probs(lm, PROMPT)
    out = {}
    for x1 in torch.nonzero(first).flatten().tolist():
        second = target_probs(lm, PROMPT + [x1])
        for x2 in torch.nonzero(second).flatten().tolist():
            out[(x1, x2)] = float(first[x1] * second[x2])
    return out


def sample_pairs(lm, drafter, n: int = N_RUNS) -> Counter:
    """First two tokens of n seeded runs (gamma 2, 3 tokens: one or two rounds each)."""
    counts: Counter = Counter()
    for seed in range(n):
        gen = torch.Generator().manual_seed(seed)
        events = speculative.decode(lm, PROMPT, CONFIG, generator=gen, drafter=drafter)
        out = [t for e in events for t in e.emitted]
        counts[tuple(out[:2])] += 1
    return counts


def sample_first(lm, drafter, n: int = N_RUNS) -> Counter:
    """First token of n seeded runs (the first round only)."""
    counts: Counter = Counter()
    for seed in range(n):
        gen = torch.Generator().manual_seed(seed)
        first = next(speculative.decode(lm, PROMPT, CONFIG, generator=gen, drafter=drafter))
        counts[(first.emitted[0],)] += 1
    return counts


def chi2_pvalue(counts: Counter, expected: dict, n: int) -> float:
    """Pearson chi-square; cells expected below 5 are pooled into one bin."""
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for cell, prob in expected.items():
        if prob * n >= 5:
            obs.append(counts.get(cell, 0)), exp.append(prob * n)
        else:
            pool_o, pool_e = pool_o + counts.get(cell, 0), pool_e + prob * n
    obs.append(pool_o + sum(c for cell, c in counts.items() if cell not in expected))
    exp.append(pool_e)
    if exp[-1] == 0 and obs[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    total = sum(exp)
    exp = [e * sum(obs) / total for e in exp]  # exact reference, float round-off removed
    return float(stats.chisquare(obs, exp).pvalue)


def first_token(counts: Counter) -> Counter:
    out: Counter = Counter()
    for (x1, _x2), c in counts.items():
        out[(x1,)] += c
    return out


def marginal(pairs: dict) -> dict:
    out: dict = {}
    for (x1, _x2), prob in pairs.items():
        out[(x1,)] = out.get((x1,), 0.0) + prob
    return out


def power_lambda(p_target: torch.Tensor, p_wrong: torch.Tensor, n: int) -> float:
    keep = p_target > 0
    return float(n * ((p_wrong[keep] - p_target[keep]) ** 2 / p_target[keep]).sum())


@pytest.fixture(scope="module")
def reference(target):
    return exact_pairs(target)


def test_draft_model_matches_plain_sampling(target, draft, reference):
    counts = sample_pairs(target, draft)
    assert chi2_pvalue(first_token(counts), marginal(reference), N_RUNS) > ALPHA
    assert chi2_pvalue(counts, reference, N_RUNS) > ALPHA


def test_draft_model_wrong_residual_fails(target, draft, reference, monkeypatch):
    p_target = target_probs(target, PROMPT)
    q_draft = build_pipeline(CONFIG.temperature, CONFIG.top_k)(
        draft.lm.forward(PROMPT, draft.lm.new_cache())[-1]).softmax(-1).double()  # (V,)
    p_wrong = torch.minimum(p_target, q_draft) + (1 - torch.minimum(p_target, q_draft).sum()) * p_target
    assert power_lambda(p_target, p_wrong, N_RUNS) >= 60
    monkeypatch.setattr(speculative, "residual_distribution", lambda p_target, q_draft: p_target)
    assert chi2_pvalue(sample_first(target, draft), marginal(reference), N_RUNS) < ALPHA


def test_lookup_matches_plain_sampling(target, reference):
    counts = sample_pairs(target, PromptLookupDrafter(2))
    assert chi2_pvalue(first_token(counts), marginal(reference), N_RUNS) > ALPHA
    assert chi2_pvalue(counts, reference, N_RUNS) > ALPHA


DRAFTED = 3            # the token the negative controls' first round drafts


def residual_without_zeroing(target, monkeypatch) -> None:
    """The negative controls' wrong rule: a point-mass draft's residual that does not zero the drafted
    token (DRAFTED), after checking that N_RUNS runs have the power to tell its first-token law apart."""
    p_target = target_probs(target, PROMPT)
    p_wrong = (1 - p_target[DRAFTED]) * p_target
    p_wrong[DRAFTED] += p_target[DRAFTED]
    assert power_lambda(p_target, p_wrong, N_RUNS) >= 60
    monkeypatch.setattr(speculative, "point_mass_residual", lambda p_target, token: p_target)


def test_lookup_without_zeroing_fails(target, reference, monkeypatch):
    residual_without_zeroing(target, monkeypatch)
    assert chi2_pvalue(sample_first(target, PromptLookupDrafter(2)), marginal(reference), N_RUNS) < ALPHA


def test_lookup_then_model_matches_plain_sampling(target, draft, reference):
    """Prompt lookup where the context has a match, the draft model elsewhere (both used here)."""
    hybrid = LookupThenDraftDrafter(PromptLookupDrafter(2), draft)
    sources: Counter = Counter()
    counts: Counter = Counter()
    for seed in range(N_RUNS):
        events = list(speculative.decode(target, PROMPT, CONFIG, generator=torch.Generator().manual_seed(seed),
                                         drafter=hybrid))
        sources.update(e.drafter for e in events)
        counts[tuple([t for e in events for t in e.emitted][:2])] += 1
    assert sources["lookup"] > 0 and sources[draft.name] > 0
    assert chi2_pvalue(first_token(counts), marginal(reference), N_RUNS) > ALPHA
    assert chi2_pvalue(counts, reference, N_RUNS) > ALPHA


@pytest.fixture(scope="module")
def feature_net(target):
    """A feature drafter over the target's LM-head input with a random (untrained) output map."""
    from decoding.drafters.feature_net import FeatureNet, FeatureShape

    torch.manual_seed(2)
    net = FeatureNet(FeatureShape(int(target.model.config.hidden_size), width=16, mlp=32, blocks=1),
                     range(target.vocab_size))
    torch.nn.init.normal_(net.out.weight, std=0.5)
    return net.attach(target).eval().requires_grad_(False)


def feature_wrong_pairs(target, net, reference) -> dict:
    """The exact (x1, x2) distribution when the residual is p_target itself: x1 comes from the first round
    (no drafts), x2 from the feature drafter's first draft after (h, x1), h the head input at the prompt's end."""
    from decoding.runtime.hooks import tap_head_input

    with tap_head_input(target) as tap:
        target.forward(PROMPT, target.new_cache())
    head = tap.hidden[0, -1]
    pipeline = build_pipeline(CONFIG.temperature, CONFIG.top_k)
    out = {}
    for x1 in {a for a, _ in reference}:
        p_second = target_probs(target, PROMPT + [x1])
        q_draft = pipeline(net.full_logits(net.step(head, torch.tensor(x1))).float()).softmax(-1).double()
        overlap = torch.minimum(p_second, q_draft)
        wrong = overlap + (1 - overlap.sum()) * p_second
        p_first = sum(p for (a, _), p in reference.items() if a == x1)
        out.update({(x1, x2): p_first * float(wrong[x2]) for x2 in torch.nonzero(p_second).flatten().tolist()})
    return out


def test_feature_drafter_matches_plain_sampling(target, feature_net, reference):
    """The feature drafter drafts the second token (the first round has no head input yet)."""
    from decoding.drafters.feature import FeatureDrafter

    counts = sample_pairs(target, FeatureDrafter(feature_net))
    assert chi2_pvalue(counts, reference, N_RUNS) > ALPHA


def test_feature_drafter_wrong_residual_fails(target, feature_net, reference, monkeypatch):
    from decoding.drafters.feature import FeatureDrafter

    wrong = feature_wrong_pairs(target, feature_net, reference)
    cells = list(reference)
    p_ref = torch.tensor([reference[c] for c in cells], dtype=torch.float64)
    p_bad = torch.tensor([wrong.get(c, 0.0) for c in cells], dtype=torch.float64)
    assert power_lambda(p_ref, p_bad, N_RUNS) >= 60
    monkeypatch.setattr(speculative, "residual_distribution", lambda p_target, q_draft: p_target)
    assert chi2_pvalue(sample_pairs(target, FeatureDrafter(feature_net)), reference, N_RUNS) < ALPHA


def recycling_drafter(target):
    """Token recycling's chain with its table warmed by one run (then filled by every run's forwards)."""
    from decoding.drafters.recycling import RecyclingSource, RecyclingTable
    from decoding.drafters.source_chain import SourceChainDrafter

    drafter = SourceChainDrafter([RecyclingSource(RecyclingTable(target.vocab_size))])
    list(speculative.decode(target, PROMPT, CONFIG, generator=torch.Generator().manual_seed(0), drafter=drafter))
    return drafter


def test_recycling_chain_matches_plain_sampling(target, reference):
    drafter = recycling_drafter(target)
    counts = sample_pairs(target, drafter)
    assert chi2_pvalue(first_token(counts), marginal(reference), N_RUNS) > ALPHA
    assert chi2_pvalue(counts, reference, N_RUNS) > ALPHA
    first = next(speculative.decode(target, PROMPT, CONFIG, generator=torch.Generator(), drafter=drafter))
    assert first.gamma >= 1 and first.drafter == "recycling"


def test_recycling_chain_without_zeroing_fails(target, reference, monkeypatch):
    drafter = recycling_drafter(target)
    p_target = target_probs(target, PROMPT)
    drafted = drafter.sources.sources[0].table.children(PROMPT[-1], 1)[0][0]
    p_wrong = (1 - p_target[drafted]) * p_target
    p_wrong[drafted] += p_target[drafted]
    assert power_lambda(p_target, p_wrong, N_RUNS) >= 60
    monkeypatch.setattr(speculative, "point_mass_residual", lambda p_target, token: p_target)
    assert chi2_pvalue(sample_first(target, drafter), marginal(reference), N_RUNS) < ALPHA


def suffix_drafter():
    """Suffix matching's chain over a store of its own: the prompt's (1, 2) repeats, so the first round
    matches it and walks the continuation 3, 4 (then every run's text is matched too)."""
    from decoding.drafters.source_chain import SourceChainDrafter
    from decoding.drafters.suffix import SuffixSource, SuffixStore

    return SourceChainDrafter([SuffixSource(SuffixStore())])


def test_suffix_chain_matches_plain_sampling(target, reference):
    drafter = suffix_drafter()
    counts = sample_pairs(target, drafter)
    assert chi2_pvalue(first_token(counts), marginal(reference), N_RUNS) > ALPHA
    assert chi2_pvalue(counts, reference, N_RUNS) > ALPHA
    first = next(speculative.decode(target, PROMPT, CONFIG, generator=torch.Generator(), drafter=drafter))
    assert first.gamma >= 1 and first.drafter == "suffix"
    assert next(speculative.decode(target, PROMPT, CONFIG, generator=torch.Generator(),
                                   drafter=suffix_drafter())).drafts[0].token_id == 3


def test_suffix_chain_without_zeroing_fails(target, reference, monkeypatch):
    residual_without_zeroing(target, monkeypatch)
    counts: Counter = Counter()
    for seed in range(N_RUNS):            # a fresh store each run: the first round drafts 3, 4 every time
        gen = torch.Generator().manual_seed(seed)
        first = next(speculative.decode(target, PROMPT, CONFIG, generator=gen, drafter=suffix_drafter()))
        assert first.drafts[0].token_id == DRAFTED
        counts[(first.emitted[0],)] += 1
    assert chi2_pvalue(counts, marginal(reference), N_RUNS) < ALPHA
