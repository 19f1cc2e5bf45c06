"""Speculative decoding with `draft="lookup+MODEL"`: prompt lookup in the rounds where the context has
an n-gram match, the draft model in the others. Greedy identity, which drafter each round used and
why, the draft model's cache after lookup rounds, the trace, and bad input. (Exactness by enumeration
and the chi-square check live with the other strategies': test_speculative_exact, _chi2.)"""
from __future__ import annotations

import pytest
import torch
from spec_helpers import PROMPTS, N, divergence, draft, peaked_lm, target  # noqa: F401  (draft, target: fixtures)

from decoding import runner
from decoding.core.config import GreedyConfig, SpeculativeConfig
from decoding.core.errors import ConfigError
from decoding.core.processors import Pipeline
from decoding.core.trace import from_json, to_json, without_timings
from decoding.drafters.base import DraftRequest
from decoding.drafters.draft_model import DraftModelDrafter
from decoding.drafters.factory import make_drafter
from decoding.drafters.lookup import LookupThenDraftDrafter, PromptLookupDrafter, lookup_continuation


def hybrid_config(**kw) -> SpeculativeConfig:
    return SpeculativeConfig(**{"max_new_tokens": N, "draft": "lookup+d", "gamma": 3, **kw})


@pytest.mark.parametrize("policy", ["fixed", "heuristic", "confidence"])
def test_greedy_identity(target, draft, policy):
    sources = set()
    for prompt in PROMPTS:
        expected = runner.run(target, prompt, GreedyConfig(max_new_tokens=N)).output_ids
        trace = runner.run(target, prompt, hybrid_config(gamma_policy=policy, confidence_threshold=0.5),
                           drafter=draft)
        assert trace.error is None
        assert not divergence(target, prompt, expected, trace.output_ids)
        sources |= {r.drafter for r in trace.steps}
    assert {"lookup", draft.name} <= sources


def test_lookup_drafts_exactly_where_it_matches(target, draft):
    """Each round's drafter is lookup iff the context at the round's start has a match of 2 tokens (a
    round with no room to draft, at the token budget's end, names the hybrid)."""
    for prompt in PROMPTS:
        trace = runner.run(target, prompt, hybrid_config(), drafter=draft)
        context = list(prompt)
        for r in trace.steps:
            if r.index == len(trace.steps) - 1 and not r.drafts:
                assert r.drafter == f"lookup+{draft.name}"
                continue
            cont, match = lookup_continuation(context, 2, 3, min_ngram=2)
            assert (r.drafter == "lookup") == bool(cont)
            if cont:
                drafted = [d.token_id for d in r.drafts]        # the token budget may cap the last rounds
                assert r.lookup == match and drafted and drafted == list(cont)[:len(drafted)]
                assert len(drafted) == len(cont) or "capped" in r.gamma_reason, r.gamma_reason
                assert all(d.q_draft is None for d in r.drafts)
            else:
                assert r.lookup is None and all(d.q_draft is not None for d in r.drafts)
            context += list(r.emitted)


def test_a_one_token_match_leaves_the_round_to_the_model(target, draft):
    """The hybrid drafts by lookup on a match of 2+ tokens only, unless the lookup's max n-gram is 1;
    plain prompt lookup still takes a 1-token match."""
    one_gram = [5, 9, 7, 3, 9]                 # only the last token, 9, occurred before
    two_gram = [5, 9, 7, 3, 5, 9]              # (5, 9) occurred before
    request = DraftRequest(3, Pipeline(()), True, torch.Generator().manual_seed(0))
    hybrid = make_drafter("lookup+model", target, drafter=draft, max_ngram=2)
    assert hybrid.min_ngram == 2
    assert hybrid.source_for(one_gram) == draft.name and hybrid.source_for(two_gram) == "lookup"
    assert hybrid.propose(two_gram, request).tokens == (7, 3, 5)
    assert PromptLookupDrafter(2).propose(one_gram, request).tokens == (7, 3, 9)
    ones = make_drafter("lookup+model", target, drafter=draft, max_ngram=1)
    assert ones.min_ngram == 1 and ones.source_for(one_gram) == "lookup"


def test_model_catches_up_after_lookup_rounds(target, draft):
    """After lookup rounds the draft model's proposal equals a fresh draft model's on that context."""
    request = DraftRequest(3, Pipeline(()), True, torch.Generator().manual_seed(0))
    hybrid = LookupThenDraftDrafter(PromptLookupDrafter(2), DraftModelDrafter(draft))
    prompt = PROMPTS[0]
    hybrid.start(prompt)
    first = hybrid.propose(prompt, request)            # (2, 3) occurred earlier: lookup
    assert first.source == "lookup" and first.tokens == (4, 5, 1)
    context = prompt + [4, 5, 1, 2, 3, 11]             # 11 never occurred: the model drafts
    got = hybrid.propose(context, request)
    fresh = DraftModelDrafter(draft)
    fresh.start(context)
    want = fresh.propose(context, request)
    assert got.source == draft.name and got.tokens == want.tokens
    assert torch.allclose(got.q_draft, want.q_draft, atol=1e-5)


def test_trace_round_trip_and_stats(target, draft):
    trace = runner.run(target, PROMPTS[1], hybrid_config(), drafter=draft)
    assert without_timings(from_json(to_json(trace))) == without_timings(trace)
    emitted = sum(len(r.emitted) for r in trace.steps)
    assert trace.stats.mean_accepted_length == pytest.approx(emitted / len(trace.steps))


def test_names():
    lookup, model = PromptLookupDrafter(2), DraftModelDrafter(peaked_lm(1))
    assert LookupThenDraftDrafter(lookup, model).name == f"lookup+{model.name}"
    config = SpeculativeConfig(draft="lookup+shallow")
    assert config.draft_model == "shallow" and not config.is_lookup
    assert SpeculativeConfig(draft="lookup").draft_model is None
    assert SpeculativeConfig(draft="shallow:x.safetensors").draft_model == "shallow:x.safetensors"


@pytest.mark.parametrize("value", ["lookup+", "lookup+ ", "lookup+lookup"])
def test_bad_draft(value):
    with pytest.raises(ConfigError) as err:
        SpeculativeConfig(draft=value)
    assert err.value.param == "draft" and repr(value) in str(err.value) and "\n" not in str(err.value)


def test_needs_a_loaded_model(target):
    with pytest.raises(ConfigError) as err:
        make_drafter("lookup+d", target)
    assert err.value.param == "draft" and "\n" not in str(err.value)


def test_one_ngram_search_per_round(target, draft, monkeypatch, tmp_path):
    """The cost policy asks which drafter drafts before drafting: the n-gram search runs once per round."""
    import decoding.drafters.lookup as drafters_module

    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))         # the auto cost table is profiled here
    calls = []
    real = drafters_module.find_lookup
    monkeypatch.setattr(drafters_module, "find_lookup", lambda *a, **kw: calls.append(len(a[0])) or real(*a, **kw))
    trace = runner.run(target, PROMPTS[0], hybrid_config(gamma_policy="cost", cost_table=None), drafter=draft)
    assert trace.error is None and len(calls) == len(set(calls)) == len(trace.steps)
