"""One drafter protocol: every speculative drafter is a LatticeSource behind the composer (SourceSet, wrapped
as decoding.drafters.source_chain.SourceChainDrafter). The groups it forms, which group drafts a round
(prompt lookup in front declines a context without a long enough match, the last group never does), a chain
source answering a tree request with nothing, and the walked chain's calibration. Exactness of each drafter
is tested with the others' (test_speculative_exact, _chi2, _hybrid; goldens); the training-free
sources' greedy identity in test_lattice_sources."""
from __future__ import annotations

import torch
from spec_helpers import peaked_lm

from decoding.core.lattice import SourceRequest
from decoding.core.processors import Pipeline
from decoding.drafters.base import DraftRequest
from decoding.drafters.draft_model import DraftModelDrafter
from decoding.drafters.factory import make_drafter
from decoding.drafters.lattice_source import LatticeSource, SourceSet, chain_groups
from decoding.drafters.lookup import PromptLookupDrafter
from decoding.drafters.recycling import RecyclingSource, RecyclingTable
from decoding.drafters.source_chain import SourceChainDrafter, composed
from decoding.drafters.suffix import SuffixSource, SuffixStore

GREEDY = DraftRequest(3, Pipeline(()), True, torch.Generator())


def recycling(vocab: int = 16) -> RecyclingSource:
    """A recycling source whose table says 7 follows 5 and 8 follows 7."""
    table = RecyclingTable(vocab)
    logits = torch.full((2, vocab), -9.0)
    logits[0, 7], logits[1, 8] = 9.0, 9.0
    table.update([5, 7], logits)
    return RecyclingSource(table)


def test_every_speculative_drafter_is_a_source():
    target, draft = peaked_lm(0), peaked_lm(1)
    for name in ("lookup", "recycling", "recycling+suffix", "lookup+recycling", "lookup+d", "auto"):
        drafter = composed(make_drafter(name, target, drafter=draft if name == "lookup+d" else None))
        assert drafter.name == {"lookup+d": f"lookup+{draft.name}", "auto": "lookup+recycling"}.get(name, name)
        assert drafter.parts and all(isinstance(s, LatticeSource) for s in drafter.parts)


def test_the_composer_is_itself_a_source_made_of_its_parts():
    """The chain drafter is a LatticeSource (callers type one interface), its parts the sources it composes;
    a single source's parts are itself."""
    rec, lookup = recycling(), PromptLookupDrafter(2)
    both = SourceChainDrafter([lookup, rec])
    assert isinstance(both, LatticeSource) and both.parts == (lookup, rec) and rec.parts == (rec,)
    assert composed(both) is both and composed(rec).parts == (rec,)


def test_groups_keep_the_order_and_join_tree_sources():
    lookup, model = PromptLookupDrafter(2), DraftModelDrafter(peaked_lm(1))
    rec, suf = recycling(), SuffixSource(SuffixStore())
    assert chain_groups([lookup, rec, suf]) == ((lookup,), (rec, suf))
    assert chain_groups([lookup, model]) == ((lookup,), (model,))
    assert chain_groups([rec, model, suf]) == ((rec,), (model,), (suf,))
    assert SourceSet([]).draft([1, 2], SourceRequest(3, 4)).empty          # DSpark with no source


def test_lookup_in_front_declines_and_hands_the_round_on():
    drafter = SourceChainDrafter([PromptLookupDrafter(2, min_ngram=2), recycling()])
    drafter.start([1, 2, 3])
    matched = [5, 9, 7, 3, 5, 9]                   # (5, 9) occurred before: lookup drafts 7, 3, 5
    assert drafter.source_for(matched) == "lookup"
    first = drafter.propose(matched, GREEDY)
    assert first.source == "lookup" and first.tokens == (7, 3, 5) and first.lookup is not None
    assert drafter.sources.pending == () and drafter.rollback(matched + [7]) == 0
    unmatched = [1, 2, 3, 5]                       # no 2-gram match: recycling's walk, 5 -> 7 -> 8
    assert drafter.source_for(unmatched) == "recycling"
    walked = drafter.propose(unmatched, GREEDY)
    assert walked.source == "recycling" and walked.tokens == (7, 8) and walked.q_draft is None
    assert drafter.sources.pending                 # counted against the kept tokens at the rollback
    drafter.rollback(unmatched + [7, 8, 1])
    assert drafter.sources.pending == () and drafter.sources.calibration.counts


def test_the_last_source_drafts_even_without_a_match():
    """Prompt lookup alone is asked whatever the context (its empty chain names no other source)."""
    alone = SourceChainDrafter([PromptLookupDrafter(2, min_ngram=2)])
    proposal = alone.propose([1, 2, 3, 4], GREEDY)
    assert proposal.tokens == () and alone.source_for([1, 2, 3, 4]) == alone.name == "lookup"


def test_a_chain_source_answers_a_tree_request_with_nothing():
    model = DraftModelDrafter(peaked_lm(1))
    model.start([1, 2])
    assert model.propose([1, 2], SourceRequest(3, 4)).empty
    chain = model.propose([1, 2], GREEDY)
    assert len(chain.tokens) == 3 and chain.q_draft.shape == (3, 16) and chain.draft_draws == (None,) * 3


def test_every_source_answers_with_one_type():
    """propose returns a Proposal whatever the source and the request: a chain, a tree (maybe empty), a
    lattice, or nothing (Proposal().empty), never None or another type."""
    from decoding.core.lattice import LookupInput, Proposal
    from decoding.drafters.lattice_bases import LookupChainSource
    from decoding.drafters.model_source import DraftModelSource

    draft = peaked_lm(1)
    sources = [PromptLookupDrafter(2), recycling(), SuffixSource(SuffixStore()), DraftModelDrafter(draft),
               DraftModelSource(DraftModelDrafter(draft)), LookupChainSource()]
    tree = SourceRequest(3, 4, lookup=LookupInput((7, 3), None, (0.5, 0.5)))
    for source in sources:
        source.start([5, 9, 7, 3, 5, 9])
        for request in (GREEDY, tree):
            assert isinstance(source.propose([5, 9, 7, 3, 5, 9], request), Proposal), (source.name, request)
    assert recycling().propose([5], tree).nodes and LookupChainSource().propose([5], tree).lattice is not None
    assert LookupChainSource().propose([5], SourceRequest(3, 4)).empty
