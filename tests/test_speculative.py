"""Speculative decoding on tiny models: greedy identity, parity with transformers (ids and target
forwards), KV rollback against fresh recomputation, the metric definitions, the trace, bad input."""
from __future__ import annotations

import copy

import pytest
import torch
from conftest import logit_atol, make_tiny_llama
from spec_helpers import (  # noqa: F401  (draft, target: fixtures)
    PROMPTS,
    N,
    constant_assistant,
    divergence,
    draft,
    hf_generate,
    peaked_lm,
    target,
)

from decoding import runner
from decoding.core.config import GreedyConfig, SpeculativeConfig
from decoding.core.errors import ConfigError
from decoding.core.processors import Pipeline
from decoding.core.trace import DraftPosition, SpecRound, from_json, to_json, without_timings
from decoding.drafters.base import DraftRequest
from decoding.drafters.draft_model import DraftModelDrafter
from decoding.drafters.factory import load_draft
from decoding.drafters.lookup import PromptLookupDrafter, find_lookup
from decoding.runtime.models import LM
from decoding.strategies.adaptive_gamma import heuristic_next
from decoding.strategies.speculative import Speculator, spec_stats

# ---------------------------------------------------------------- temperature 0

@pytest.mark.parametrize("policy", ["fixed", "heuristic", "confidence"])
@pytest.mark.parametrize("draft_name", ["lookup", "model"])
def test_greedy_identity_tiny(target, draft, policy, draft_name):
    for prompt in PROMPTS[:2] if draft_name == "model" else PROMPTS:
        expected = runner.run(target, prompt, GreedyConfig(max_new_tokens=N)).output_ids
        config = SpeculativeConfig(max_new_tokens=N, draft=draft_name, gamma=3, gamma_policy=policy,
                                   confidence_threshold=0.5)
        trace = runner.run(target, prompt, config, drafter=draft)
        assert trace.error is None
        assert not divergence(target, prompt, expected, trace.output_ids)


@pytest.mark.parametrize("gamma,prompt", [(1, PROMPTS[3]), (3, PROMPTS[0]), (5, PROMPTS[2])])
def test_parity_assisted_generation_tiny(target, draft, gamma, prompt):
    trace = runner.run(target, prompt, SpeculativeConfig(max_new_tokens=N, draft="d", gamma=gamma),
                       drafter=draft)
    hf_ids, hf_forwards = hf_generate(target.model, prompt, max_new_tokens=N,
                                      assistant_model=constant_assistant(draft.model, gamma))
    assert list(trace.output_ids) == hf_ids, divergence(target, prompt, hf_ids, trace.output_ids)
    assert trace.stats.target_forwards == hf_forwards


@pytest.mark.parametrize("num_tokens,ngram", [(2, 2), (5, 1), (10, 3)])
def test_parity_prompt_lookup_tiny(target, num_tokens, ngram):
    for prompt in PROMPTS:
        config = SpeculativeConfig(draft="lookup", max_new_tokens=N, gamma=num_tokens, lookup_max_ngram=ngram)
        trace = runner.run(target, prompt, config)
        hf_ids, hf_forwards = hf_generate(target.model, prompt, max_new_tokens=N,
                                          prompt_lookup_num_tokens=num_tokens, max_matching_ngram_size=ngram)
        assert list(trace.output_ids) == hf_ids
        assert trace.stats.target_forwards == hf_forwards


def test_forward_counts_differ_from_greedy(target, draft):
    """The parity check on forwards can fail: plain greedy makes one forward per token."""
    prompt = PROMPTS[0]
    spec = runner.run(target, prompt, SpeculativeConfig(draft="lookup", max_new_tokens=N, gamma=5), drafter=draft)
    _ids, hf_greedy_forwards = hf_generate(target.model, prompt, max_new_tokens=N)
    assert hf_greedy_forwards == N and spec.stats.target_forwards < N


# ---------------------------------------------------------------- prompt lookup search order

def test_lookup_search_order():
    # largest n-gram first; leftmost match that has a continuation
    context = [5, 6, 1, 5, 6, 2, 9, 5, 6]
    match = find_lookup(context, max_ngram=2, max_tokens=3)
    assert match.ngram == (5, 6) and match.match_position == 0 and match.continuation_start == 2
    # n = 3 finds nothing ([9, 5, 6] occurs once), falls back to n = 2
    assert find_lookup(context, 3, 3).ngram == (5, 6)
    # a continuation may run into recent text, cut at the context end
    assert find_lookup([4, 4, 4], 2, 10).continuation_start == 2
    assert find_lookup([1, 2, 3], 2, 10) is None


def test_lookup_cuts_at_eos():
    drafter = PromptLookupDrafter(2, eos_ids=frozenset({0}))
    request = DraftRequest(5, Pipeline(()), True, torch.Generator())
    assert drafter.propose([3, 4, 8, 0, 7, 3, 4], request).tokens == (8,)
    assert drafter.propose([3, 4, 0, 7, 3, 4], request).tokens == ()  # first match starts with EOS


# ---------------------------------------------------------------- KV rollback

def _rounds_with_cache_checks(target, draft, config, skip_crop=False):
    """Run rounds; after each one with a rejection, compare the next target logits from the rolled-back
    cache with a fresh recomputation over the whole context. Returns the largest difference seen."""
    prompt = PROMPTS[0]
    drafter = DraftModelDrafter(draft, target)
    spec = Speculator(target, config, drafter, torch.Generator().manual_seed(1))
    if skip_crop:  # negative control: leave the first rejected draft's K/V in the cache
        def off_by_one(kept):
            removed = spec.cached - (len(kept) - 1)
            if removed > 1:
                spec.cache.crop(-(removed - 1))
            spec.cached -= removed
            return removed
        spec._rollback = off_by_one
    context, worst, rejected = list(prompt), 0.0, 0
    for event in spec.rounds(prompt, []):
        context += list(event.emitted)
        if event.accepted == event.gamma or len(context) >= len(prompt) + config.max_new_tokens:
            continue
        rejected += 1
        assert skip_crop or spec.cached == spec.cache.get_seq_length() == len(context) - 1
        assert drafter.cache.get_seq_length() == len(drafter.fed) <= len(context)
        rolled = target.forward(context[-1:], copy.deepcopy(spec.cache))[-1]  # (V,)
        fresh = target.forward(context, target.new_cache())[-1]  # (V,)
        worst = max(worst, float((rolled - fresh).abs().max()))
    assert rejected >= 3
    return worst


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rollback_matches_fresh_recomputation(target, draft, temperature):
    config = SpeculativeConfig(max_new_tokens=N, draft="d", gamma=4, temperature=temperature)
    assert _rounds_with_cache_checks(target, draft, config) < logit_atol(1e-4)


def test_rollback_negative_control(target, draft):
    config = SpeculativeConfig(max_new_tokens=N, draft="d", gamma=4)
    assert _rounds_with_cache_checks(target, draft, config, skip_crop=True) > 1e-2


# ---------------------------------------------------------------- metrics (vLLM definitions)

def _round(gamma: int, accepted: int, forced=()) -> SpecRound:
    verdicts = ["accepted"] * accepted + ["rejected"] * (accepted < gamma) + \
        ["not_reached"] * max(0, gamma - accepted - 1)
    drafts = tuple(DraftPosition(k, 1, "a", 0.5, 0.5, 1.0, 0.5, None, v) for k, v in enumerate(verdicts))
    emitted = tuple(forced) + (1,) * (accepted + 1)
    return SpecRound(index=0, position=0, drafter="x", gamma=gamma, gamma_policy="fixed", gamma_reason="",
                     drafts=drafts, accepted=accepted, final_kind="bonus", final_id=1, final_draw=None,
                     final_top=(), residual_top=(), emitted=emitted, forced_ids=tuple(forced))


def test_worked_example_metrics():
    # round 1: 3 drafted, 3 accepted (+ bonus) -> 4 tokens; round 2: 3 drafted, 1 accepted -> 2 tokens;
    # round 3: 2 drafted, 0 accepted -> 1 token; round 4: lookup found nothing -> 1 token.
    # forced tokens (2 of them, in round 1) are not counted as emitted by verification.
    events = [_round(3, 3, forced=(5, 5)), _round(3, 1), _round(2, 0), _round(0, 0)]
    stats = spec_stats(events)
    assert stats["mean_accepted_length"] == pytest.approx((4 + 2 + 1 + 1) / 4)
    assert stats["acceptance_rate"] == pytest.approx(4 / 8)
    # position 0: accepted in rounds 1, 2 of the 3 that drafted it; position 1: round 1 of 3;
    # position 2: round 1 of the 2 that drafted it
    assert stats["per_position_acceptance"] == pytest.approx((2 / 3, 1 / 3, 1 / 2))


def test_stats_agree_with_trace_verdicts(target, draft):
    config = SpeculativeConfig(max_new_tokens=N, draft="d", gamma=4, temperature=1.0, seed=3)
    trace = runner.run(target, PROMPTS[0], config, drafter=draft)
    verified = [d for r in trace.steps for d in r.drafts if d.verdict != "recorded"]
    accepted = sum(d.verdict == "accepted" for d in verified)
    assert trace.stats.acceptance_rate == pytest.approx(accepted / len(verified))
    assert trace.stats.mean_accepted_length == pytest.approx(N / len(trace.steps))
    assert trace.stats.target_forwards == len(trace.steps)


# ---------------------------------------------------------------- trace contents

def test_trace_round_trip_and_contents(target, draft):
    config = SpeculativeConfig(max_new_tokens=30, draft="d", gamma=3, gamma_max=6, temperature=0.8,
                               top_k=8, seed=2)
    trace = runner.run(target, PROMPTS[0], config, drafter=draft)
    again = from_json(to_json(trace))
    assert without_timings(again) == without_timings(trace)
    assert set(trace.steps[0].timings_ms) >= {"draft", "verify", "accept", "rollback"}
    for event in trace.steps:
        assert event.gamma <= 3 and len(event.drafts) <= 6
        assert all(d.verdict == "recorded" and d.u is None for d in event.drafts[event.gamma:])
        for d in event.drafts[:event.gamma]:
            if d.verdict in ("accepted", "rejected"):
                assert (d.u < min(1.0, d.ratio)) == (d.verdict == "accepted")
            assert 0 <= d.accept_prob <= 1 + 1e-6
        if event.final_kind == "residual":
            rejected = event.drafts[event.accepted]
            assert rejected.verdict == "rejected" and rejected.ratio < 1
            assert event.residual_top and all(e.prob > 0 for e in event.residual_top)
            assert rejected.token_id not in [e.token_id for e in event.residual_top]  # max(0, p - q) = 0
        assert event.kv_cropped_target == len(event.drafts) - event.accepted
    same = runner.run(target, PROMPTS[0], config, drafter=draft)
    assert same.output_ids == trace.output_ids  # seeded: reproducible


def _fresh_probs(lm, ids, rows, pipeline):
    """(logits, probs) of the last `rows` positions of a fresh forward over `ids`, after `pipeline`."""
    processed = pipeline(lm.forward(list(ids), lm.new_cache())[-rows:])      # (rows, V)
    return processed, processed.softmax(-1)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_position_numbers_match_fresh_forwards(target, draft, temperature):
    """Each drafted position's p_target, q_draft, Σ min(p, q), target and draft top-N equal what fresh
    forwards of the target and the draft over the round's context and drafts give (the trace builds
    them for all positions at once)."""
    from decoding.core.processors import build_pipeline

    config = SpeculativeConfig(max_new_tokens=20, draft="d", gamma=3, gamma_max=5, temperature=temperature,
                               top_k=8, seed=4)
    pipeline = Pipeline(()) if temperature == 0 else build_pipeline(temperature, 8)
    trace = runner.run(target, PROMPTS[0], config, drafter=draft)
    sequence = list(PROMPTS[0]) + list(trace.output_ids)
    checked = 0
    for event in trace.steps:
        context, drafted = sequence[:event.position], [d.token_id for d in event.drafts]
        t_logits, p_target = _fresh_probs(target, context + drafted, len(drafted) + 1, pipeline)
        for d in event.drafts:
            _, q_draft = _fresh_probs(draft, context + drafted[:d.index], 1, pipeline)
            q_row, p_row = q_draft[0], p_target[d.index]
            assert d.p_target == pytest.approx(float(p_row[d.token_id]), abs=1e-5)
            assert d.q_draft == pytest.approx(float(q_row[d.token_id]), abs=1e-5)
            assert d.accept_prob == pytest.approx(float(torch.minimum(p_row, q_row).sum()), abs=1e-5)
            assert [c.token_id for c in d.target_top] == torch.topk(p_row, len(d.target_top)).indices.tolist()
            assert [c.logit for c in d.target_top] == pytest.approx(
                t_logits[d.index][[c.token_id for c in d.target_top]].tolist(), abs=1e-4)
            assert [c.token_id for c in d.draft_top] == torch.topk(q_row, len(d.draft_top)).indices.tolist()
            assert [c.logit for c in d.draft_top] == pytest.approx(
                torch.log(q_row[[c.token_id for c in d.draft_top]]).tolist(), abs=1e-4)
            checked += 1
        assert [c.token_id for c in event.final_top] == torch.topk(
            p_target[event.accepted], len(event.final_top)).indices.tolist()
    assert checked >= 10


def test_heuristic_gamma_in_trace(target, draft):
    config = SpeculativeConfig(max_new_tokens=40, draft="d", gamma=2, gamma_policy="heuristic")
    rounds = runner.run(target, PROMPTS[2], config, drafter=draft).steps
    checked = 0
    for prev, cur in zip(rounds, rounds[1:]):
        assert cur.gamma_reason.startswith("heuristic: last round")
        if "capped" not in prev.gamma_reason + cur.gamma_reason:
            assert cur.gamma == heuristic_next(prev.gamma, prev.accepted, prev.gamma)
            checked += 1
    gammas = [r.gamma for r in rounds]
    assert checked >= 3 and max(gammas) > 2 and min(gammas) < max(gammas)


def test_confidence_stop_in_trace(target, draft):
    config = SpeculativeConfig(max_new_tokens=40, draft="d", gamma=6, gamma_policy="confidence",
                               confidence_threshold=0.2)
    rounds = runner.run(target, PROMPTS[0], config, drafter=draft).steps
    stopped = 0
    for r in rounds:
        q_own = [d.q_draft for d in r.drafts[:r.gamma]]
        assert all(q >= 0.2 for q in q_own[:-1])
        if "stopped after" in r.gamma_reason:
            stopped += 1
            assert q_own[-1] < 0.2
    assert stopped >= 3 and any(r.gamma > 1 for r in rounds)


def test_lookup_trace_shows_match(target):
    trace = runner.run(target, [4, 5, 6, 7, 4, 5], SpeculativeConfig(draft="lookup", max_new_tokens=5, gamma=3))
    first = trace.steps[0]
    assert first.lookup is not None and first.lookup.ngram == (4, 5) and first.lookup.match_position == 0
    assert [d.token_id for d in first.drafts] == [6, 7, 4]
    assert all(d.q_draft is None for d in first.drafts)
    assert without_timings(from_json(to_json(trace))) == without_timings(trace)


def test_forced_tokens_come_first(target, draft):
    forced = [3, 3]
    config = SpeculativeConfig(max_new_tokens=12, draft="d", gamma=3)
    trace = runner.run(target, PROMPTS[1], config, forced=forced, drafter=draft)
    assert list(trace.output_ids[:2]) == forced and trace.steps[0].forced_ids == (3, 3)
    greedy = runner.run(target, PROMPTS[1], GreedyConfig(max_new_tokens=12), forced=forced)
    assert trace.output_ids == greedy.output_ids


def test_stops_at_eos():
    lm = peaked_lm(0, eos_token_id=5)
    greedy = runner.run(lm, PROMPTS[0], GreedyConfig(max_new_tokens=N))
    spec = runner.run(lm, PROMPTS[0], SpeculativeConfig(draft="lookup", max_new_tokens=N, gamma=4),
                      drafter=peaked_lm(1, eos_token_id=5))
    assert spec.output_ids == greedy.output_ids and spec.stop_reason == greedy.stop_reason


def test_other_strategies_unaffected(tiny_lm):
    trace = runner.run(tiny_lm, [1, 2, 3], GreedyConfig(max_new_tokens=3))
    assert trace.stats.mean_accepted_length is None and len(trace.output_ids) == 3


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("field,value", [("gamma", 0), ("gamma", 33), ("gamma", 2.5), ("gamma_policy", "x"),
                                         ("confidence_threshold", 1.5), ("gamma_max", 2),
                                         ("lookup_max_ngram", 0), ("draft", "")])
def test_bad_config(field, value):
    with pytest.raises(ConfigError) as err:
        SpeculativeConfig(**{"gamma": 3, field: value})
    assert err.value.param == field and "\n" not in str(err.value)


def test_draft_with_other_vocabulary(target):
    other = LM(make_tiny_llama(vocab_size=32), tokenizer=None, name="other")
    with pytest.raises(ConfigError) as err:
        runner.run(target, [1, 2], SpeculativeConfig(draft="other"), drafter=other)
    assert err.value.param == "draft" and "32" in str(err.value) and "\n" not in str(err.value)


def test_missing_draft(target, tmp_path):
    with pytest.raises(ConfigError) as err:
        runner.run(target, [1, 2], SpeculativeConfig(draft=str(tmp_path / "nope")))
    assert err.value.param == "draft"
    with pytest.raises(ConfigError) as err:
        load_draft(str(tmp_path / "nope"), target)
    assert err.value.param == "draft" and "\n" not in str(err.value)
