"""Prompt-lookup candidates in the DSpark lattice (lookup_max_ngram > 0).

- Pieces: the acceptance-rate estimate, the continuation, the boosted chain scores, which plan nodes
  lie on the lookup chain, and build_lattice's extra candidates (inside and outside the drafter's
  vocabulary slice).
- Exactness by enumeration (tabular toy target and drafter, fractions): the plan now depends on the
  whole history (the lookup continuation and the acceptance rate counted over earlier rounds), and
  the first N tokens emitted are still distributed exactly as the target's, chain and tree.
  Negative control: the retrospective rule fails under the same plans.
- Engine: temperature 0 token-identical to plain greedy with lookup nodes both accepted and
  rejected; each round's λ equals the rate recounted from the earlier rounds of the trace; trace
  JSON round trip; the lookup chain raises τ on a model that repeats itself; bad input is one line."""
from __future__ import annotations

import random
from fractions import Fraction

import pytest
import torch
from dspark_helpers import chain_config, one_thread, random_drafter, varied_llama
from tree_support import retrospective_branches

from decoding.core import trace
from decoding.core.acceptance import exact_branches, round_distribution
from decoding.core.config import DSparkConfig, GreedyConfig
from decoding.core.errors import ConfigError
from decoding.core.lattice import Lattice
from decoding.drafters.lattice_lookup import LookupRate, boost_chain, continuation, hits, lookup_nodes
from decoding.drafters.lookup import find_lookup
from decoding.drafters.parallel import build_lattice
from decoding.lab.toy import MarkovTable, random_table, target_sequences
from decoding.runner import run
from decoding.strategies.dspark_select import best_chain, best_tree, flat_tree

F = Fraction
_threads = pytest.fixture(scope="module", autouse=True)(one_thread)


# ------------------------------------------------------------------------------ pieces
def test_rate_is_a_laplace_estimate_per_kind():
    assert LookupRate().scores() == (0.5, 0.5)
    rate = LookupRate().updated([(1, True), (1, False), (2, True), (3, True)])
    assert rate == LookupRate(2, 1, 2, 2)
    assert rate.scores() == (0.5, 0.75)
    assert rate.updated([(1, False)]).scores() == pytest.approx((2 / 5, 0.75))


def test_hits_compare_up_to_the_first_difference():
    assert hits([4, 5, 6], [4, 5, 7, 8]) == [(1, True), (2, True), (3, False)]
    assert hits([4, 5, 6], [3, 5, 6]) == [(1, False)]
    assert hits([4, 5, 6], [4]) == [(1, True)]                    # the round emitted one token only
    assert hits([], [1, 2]) == []


def test_continuation_cuts_at_eos_and_reports_the_match():
    tokens, match = continuation([5, 6, 7, 8, 5], max_ngram=2, max_tokens=3)
    assert tokens == (6, 7, 8) and match.ngram == (5,) and match.continuation_start == 1
    tokens, match = continuation([5, 6, 7, 8, 5, 6], 2, 8)          # the 2-gram (5, 6) wins
    assert tokens == (7, 8, 5, 6) and match.ngram == (5, 6)
    assert continuation([5, 6, 9, 8, 5], 2, 3, eos_ids={9}) == ((6,), match_at(0, 1))
    # the most recent occurrence with a full continuation, not transformers' leftmost one (which the
    # speculative lookup drafter keeps); the leftmost when no recent one has max_tokens after it
    tokens, match = continuation([5, 6, 5, 7, 5], 2, 2)
    assert tokens == (7, 5) and match == match_at(2, 3)
    assert find_lookup([5, 6, 5, 7, 5], 2, 2).match_position == 0
    assert continuation([5, 6, 5, 7, 5], 2, 3) == ((6, 5, 7), match_at(0, 1))
    assert continuation([5, 9, 5], 2, 3, eos_ids={9}) == ((), None)   # nothing before the EOS
    assert continuation([1, 2, 3], 2, 3) == ((), None)
    assert continuation([5, 6, 5], 0, 3) == ((), None)


def match_at(position: int, start: int):
    from decoding.core.trace import LookupMatch

    return LookupMatch(ngram=(5,), match_position=position, continuation_start=start)


def test_boost_raises_only_the_lookup_chain_given_its_lookup_parent():
    lat = Lattice([[1, 2], [3, 4, 5], [6, 7]], [[F(1, 2)] * 2, [F(1, 3)] * 3, [F(1, 2)] * 2],
                  [[[F(1, 10), F(9, 10)]],
                   [[F(1, 10)] * 3, [F(1, 10), F(1, 10), F(1, 5)]],
                   [[F(1, 10)] * 2, [F(1, 10)] * 2, [F(1, 10)] * 2]])
    out = boost_chain(lat, at=[0, 2, 1], first=F(3, 5), later=F(7, 10))
    expect = [[[F(3, 5), F(9, 10)]],
              [[F(1, 10), F(1, 10), F(7, 10)], [F(1, 10), F(1, 10), F(1, 5)]],
              [[F(1, 10)] * 2, [F(1, 10)] * 2, [F(1, 10), F(7, 10)]]]
    assert out.scores == tuple(tuple(tuple(r) for r in pos) for pos in expect)
    assert boost_chain(lat, [1], F(1, 2), F(1, 2)).scores == lat.scores     # 9/10 > 1/2 stays


def test_lookup_nodes_follow_the_chain_from_the_root():
    at = (1, 0, 2)
    # chain: candidates 1, 0, 2 from the root -> all on the chain
    assert lookup_nodes([1, 0, 2], [-1, 0, 1], at) == (True, True, True)
    # chain leaving the lookup path at depth 2 never comes back to it
    assert lookup_nodes([1, 1, 2], [-1, 0, 1], at) == (True, False, False)
    # tree: node 2 (cand 0 at depth 2) under a non-lookup parent is not on the chain; depth beyond
    # the continuation is not either
    assert lookup_nodes([1, 0, 0, 0, 2, 5], [-1, -1, 0, 1, 2, 4], at) == (True, False, True, False, True, False)
    assert lookup_nodes([0, 0], [-1, 0], ()) == (False, False)


def test_build_lattice_adds_extra_tokens_inside_and_outside_the_slice(lm):
    slice_ids = list(range(0, 40))
    drafter = random_drafter(lm, gamma_max=8, seed=3, vocab_ids=slice_ids)
    hidden = torch.randn(lm.model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    plain = build_lattice(drafter, hidden, root=7, gamma=4, top_k=2)
    top0 = plain.lattice.token_ids[0][0]
    inside = next(t for t in slice_ids if t not in plain.lattice.token_ids[1])
    outside = 50                                                # not in the drafter's slice
    draft = build_lattice(drafter, hidden, root=7, gamma=4, top_k=2, extra=[top0, inside, outside])
    lat = draft.lattice
    assert draft.extra == (0, 2, 2)                             # already there; added; added
    assert lat.token_ids[0] == plain.lattice.token_ids[0]
    assert lat.token_ids[1][:2] == plain.lattice.token_ids[1] and lat.token_ids[1][2] == inside
    assert lat.token_ids[2][2] == outside and len(lat.token_ids[3]) == 2
    assert all(row[2] == 0 for row in lat.scores[2]) and lat.q_draft[2][2] == 0   # the drafter cannot propose it
    assert all(row[2] > 0 for row in lat.scores[1])
    assert len(lat.scores[2]) == 3 and len(lat.scores[3]) == 3   # the extra token is a parent too
    with pytest.raises(ConfigError, match="extra"):
        build_lattice(drafter, hidden, root=7, gamma=2, top_k=2, extra=[1, 2, 3])


# ------------------------------------------------------------------------------ exactness by enumeration
def toy_lattice(draft: MarkovTable, last: int, gamma: int, k: int, extra) -> tuple[Lattice, tuple[int, ...]]:
    """Top-k of the drafter's marginal per position plus the extra (lookup) token, scored
    ŝ(x | parent) = draft(x | parent's token), like decoding.toy.draft_lattice."""
    marginal, tokens, q_draft, at = list(draft.rows[last]), [], [], []
    for pos in range(gamma):
        cands = draft.top(marginal, k)
        if pos < len(extra):
            if extra[pos] not in cands:
                cands = cands + [extra[pos]]
            at.append(cands.index(extra[pos]))
        tokens.append(cands)
        q_draft.append([marginal[t] for t in cands])
        marginal = [sum(marginal[a] * draft.rows[a][b] for a in range(draft.vocab)) for b in range(draft.vocab)]
    scores = [[[draft.rows[last][x] for x in tokens[0]]]]
    scores += [[[draft.rows[p][x] for x in tokens[pos]] for p in tokens[pos - 1]] for pos in range(1, gamma)]
    return Lattice(tokens, q_draft, scores), tuple(at)


def lookup_plan(draft, history, gamma, k, select, budget):
    """The engine's plan from the history alone: lookup continuation, λ from earlier rounds, boost,
    DP or best-first. -> (tokens, parents, the continuation)."""
    context, rate = history
    extra, _ = continuation(context, 2, gamma)
    lattice, at = toy_lattice(draft, context[-1], gamma, k, extra)
    if at:
        lattice = boost_chain(lattice, at, *(F(s).limit_denominator(1000) for s in rate.scores()))
    plan = best_chain(lattice) if select == "chain" else best_tree(lattice, budget)
    tokens, parents = flat_tree(context[-1], plan)
    return tokens, parents, extra


def lookup_sequences(target, draft, prompt, length, gamma, k, select, budget, rule=exact_branches):
    """Exact distribution of the first `length` tokens over repeated rounds whose plans depend on
    the history (context and the lookup rate)."""
    def rounds(context: tuple, rate: LookupRate, left: int) -> dict:
        if left == 0:
            return {(): F(1)}
        tokens, parents, extra = lookup_plan(draft, (context, rate), gamma, k, select, budget)
        one = round_distribution(tokens, parents, lambda i: target.rows[tokens[i]], rule)
        out: dict = {}
        for emitted, w in one.items():
            head = emitted[:left]
            for tail, v in rounds(context + head, rate.updated(hits(extra, head)), left - len(head)).items():
                out[head + tail] = out.get(head + tail, 0) + w * v
        return out

    return rounds(tuple(prompt), LookupRate(), length)


CASES = [("chain", 1, 1, 1), ("chain", 2, 2, 1), ("chain", 3, 1, 1), ("tree", 2, 2, 3), ("tree", 3, 2, 4)]


@pytest.mark.parametrize("select,gamma,k,budget", CASES)
def test_lookup_plans_are_exact(select, gamma, k, budget):
    rng = random.Random(7)
    target, draft = random_table(rng, 3), random_table(rng, 3)
    prompt = (0, 1, 2, 0, 1)
    want = target_sequences(target, prompt[-1], 5)
    got = lookup_sequences(target, draft, prompt, 5, gamma, k, select, budget)
    assert got == want


@pytest.mark.parametrize("select,gamma,k,budget", CASES[1:4])
def test_retrospective_rule_fails_under_lookup_plans(select, gamma, k, budget):
    rng = random.Random(7)
    target, draft = random_table(rng, 3), random_table(rng, 3)
    prompt = (0, 1, 2, 0, 1)
    got = lookup_sequences(target, draft, prompt, 5, gamma, k, select, budget, rule=retrospective_branches)
    assert got != target_sequences(target, prompt[-1], 5)


def test_the_enumeration_visits_lookup_nodes():
    """Not vacuous: with a good record the plan follows the lookup continuation off the drafter's
    top candidates; with a bad one it does not."""
    rng = random.Random(7)
    _, draft = random_table(rng, 3), random_table(rng, 3)
    context = (0, 1, 2, 0, 1)
    top = toy_lattice(draft, context[-1], 3, 1, ())[0].token_ids
    tokens, _, extra = lookup_plan(draft, (context, LookupRate(9, 9, 9, 9)), 3, 1, "chain", 1)
    assert tokens[1:] == extra == (2, 0, 1) and extra != tuple(t[0] for t in top)
    tokens, _, extra = lookup_plan(draft, (context, LookupRate(9, 0, 9, 0)), 3, 1, "chain", 1)
    assert tokens[1:] == tuple(t[0] for t in top)


# ------------------------------------------------------------------------------ engine
@pytest.fixture(scope="module")
def drafter(lm):
    return random_drafter(lm, gamma_max=16)


LOOP_PROMPT = [5, 9, 12, 5, 9, 12, 5, 9, 12, 5, 9]


@pytest.mark.parametrize("select,gamma,k,budget", [("chain", 4, 2, 1), ("chain", 8, 1, 1), ("tree", 6, 2, 10)])
@pytest.mark.slow
def test_temperature_zero_equals_greedy_with_lookup(lm, drafter, select, gamma, k, budget):
    seen = set()
    for prompt in ([1, 2, 3, 4, 5], [9, 40, 17], LOOP_PROMPT):
        config = chain_config(max_new_tokens=40, gamma=gamma, top_k_candidates=k, select=select, budget=budget,
                              lookup_max_ngram=2)
        tr = run(lm, prompt, config, drafter=drafter)
        assert tr.error is None
        assert tr.output_ids == run(lm, prompt, GreedyConfig(max_new_tokens=40)).output_ids
        seen |= {n.verdict for e in tr.steps for n in e.nodes if n.lookup}
    assert {"accepted", "rejected"} <= seen


def test_rates_are_recounted_from_earlier_rounds(lm, drafter):
    tr = run(lm, LOOP_PROMPT, chain_config(max_new_tokens=48, gamma=6, top_k_candidates=2, select="tree",
                                           budget=8, lookup_max_ngram=3), drafter=drafter)
    rate, matched = LookupRate(), 0
    for event in tr.steps[1:]:
        if not event.lattice:                                   # the last round had room for no draft
            assert event.lookup_scores is None
            continue
        assert event.lookup_scores == pytest.approx(rate.scores())
        lookup_cells = [c for col in event.lattice for c in col.cells if c.lookup]
        if event.lookup is not None:
            matched += 1
            start = event.lookup.continuation_start
            context = list(LOOP_PROMPT) + [t for e in tr.steps[:event.index] for t in e.emitted]
            assert [c.token_id for c in lookup_cells] == context[start:start + len(lookup_cells)]
        else:
            assert not lookup_cells
        rate = rate.updated(hits([c.token_id for c in lookup_cells], event.emitted))
    assert matched >= 3 and rate != LookupRate()


def test_lookup_off_records_nothing_and_json_round_trips(lm, drafter):
    off = run(lm, LOOP_PROMPT, chain_config(max_new_tokens=16, gamma=4), drafter=drafter)
    assert all(e.lookup is None and e.lookup_scores is None for e in off.steps)
    assert not any(c.lookup for e in off.steps for col in e.lattice for c in col.cells)
    on = run(lm, LOOP_PROMPT, chain_config(max_new_tokens=16, gamma=4, lookup_max_ngram=2, temperature=0.7,
                                           seed=2), drafter=drafter)
    assert any(e.lookup is not None for e in on.steps)
    assert trace.from_json(trace.to_json(on)) == on


def test_lookup_raises_tau_when_the_model_repeats_itself():
    """This tiny model's greedy text soon loops (two tokens in turn); copying from the context then
    beats a random drafter, and the output stays greedy's."""
    looping = varied_llama(seed=1, init=0.05)
    drafter = random_drafter(looping, gamma_max=8)
    runs = {n: run(looping, LOOP_PROMPT, chain_config(max_new_tokens=60, gamma=8, top_k_candidates=1,
                                                      lookup_max_ngram=n), drafter=drafter) for n in (0, 2)}
    assert runs[0].output_ids == runs[2].output_ids
    assert runs[2].stats.mean_accepted_length > runs[0].stats.mean_accepted_length + 2


@pytest.mark.parametrize("value", [-1, 17, 1.5, "2"])
def test_bad_lookup_max_ngram_is_one_line(value):
    with pytest.raises(ConfigError, match="lookup_max_ngram") as err:
        DSparkConfig(lookup_max_ngram=value)
    assert "\n" not in str(err.value)
