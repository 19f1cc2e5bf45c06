"""Lattice sources: the composer (one cell per token and depth, the best score under each parent, the sources
listed), the online calibration, token recycling's table and tree, the model fingerprint, and exactness of
each source alone (token recycling, suffix matching, a draft model): exact enumeration on a tabular toy
(negative control: the retrospective plan), token identity with plain greedy on a tiny llama, DSpark and
speculative (negative control: a wrong acceptance rule), and "auto" choosing the training-free sources on a
model no shipped drafter fits. Each exactness test also checks that its source proposed."""
from __future__ import annotations

import random
from fractions import Fraction
from types import SimpleNamespace

import pytest
import torch
from dspark_helpers import as_draft_model_source, one_thread, varied_llama
from tree_support import retrospective_branches, toy_pair

from decoding.core.acceptance import RoundOutcome, total_variation
from decoding.core.config import DSparkConfig, GreedyConfig, SpeculativeConfig
from decoding.core.errors import ConfigError
from decoding.core.lattice import ROOT, Lattice, LatticeDraft, Proposal, SourceNode, SourceRequest
from decoding.drafters.lattice_source import OnlineCalibration, compose, labelled, tried
from decoding.drafters.memory import SourceMemory
from decoding.drafters.model_source import DraftModelSource
from decoding.drafters.recycling import RecyclingSource, RecyclingTable
from decoding.drafters.resolve import resolve
from decoding.drafters.suffix import SuffixSource, SuffixStore
from decoding.lab.toy import speculative_sequences, target_sequences
from decoding.runner import run
from decoding.runtime.fingerprint import fingerprint, matches
from decoding.strategies import dspark
from decoding.strategies.dspark_select import best_tree, flat_tree

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)


def tree(source, *nodes):
    return Proposal(source=source, nodes=tuple(SourceNode(*n) for n in nodes))


# ------------------------------------------------------------------------------ composer
def test_compose_merges_sources_per_token_and_depth():
    a = tree("a", (5, ROOT, 0.5, 0.4), (6, 0, 0.5, 0.3), (7, ROOT, 0.2, 0.1))
    b = tree("b", (5, ROOT, 0.9, 0.0), (8, 0, 0.6, 0.2))
    draft = compose(None, [a, b], [[0.5, 0.4, 0.2], [0.9, 0.6]], gamma=4)
    lat = draft.lattice
    assert lat.token_ids == ((5, 7), (6, 8))
    assert draft.sources == ((("a", "b"), ("a",)), (("a",), ("b",)))
    assert lat.scores[0] == ((0.9, 0.2),)                  # the best score any source gave
    assert lat.scores[1] == ((0.4, 0.6), (0.0, 0.0))       # children of 5 only; 7 has none
    assert lat.q_draft[0] == (0.4, 0.1)
    assert draft.own == (0, 0) and len(draft.confidence[1]) == 2


def test_compose_cuts_at_gamma_and_drops_orphans():
    chain = tree("a", (1, ROOT, 0.9), (2, 0, 0.9), (3, 1, 0.9))
    draft = compose(None, [chain], [[0.9, 0.9, 0.9]], gamma=2)
    assert draft.lattice.token_ids == ((1,), (2,))
    assert compose(None, [tree("a")], [[]], gamma=3) is None


def test_compose_keeps_the_base_lattice_and_its_labels():
    base = LatticeDraft(Lattice([[4, 9]], [[0.6, 0.1]], [[[0.6, 0.3]]]), ((0.7,),), (1,), (1,))
    base = labelled(base, "feature")
    assert base.sources == ((("feature",), ("lookup",)),)
    draft = compose(base, [tree("r", (9, ROOT, 0.8), (2, 0, 0.5))], [[0.8, 0.5]], gamma=3)
    assert draft.lattice.token_ids == ((4, 9), (2,))
    assert draft.lattice.scores[0] == ((0.6, 0.8),)
    assert draft.lattice.scores[1] == ((0.0,), (0.5,))
    assert draft.sources[0] == (("feature",), ("lookup", "r"))
    assert draft.extra == (1,) and draft.own == (1, 0)


# ------------------------------------------------------------------------------ calibration
def test_tried_counts_nodes_whose_parent_path_was_emitted():
    t = tree("r", (1, ROOT, 0.5), (2, ROOT, 0.5), (3, 0, 0.5), (4, 1, 0.5), (5, 2, 0.5))
    got = [(n.token, d, hit) for n, d, hit in tried(t, [1, 9])]
    assert got == [(1, 1, True), (2, 1, False), (3, 2, False)]


def test_calibration_moves_from_the_prior_to_the_measured_rate():
    cal = OnlineCalibration.empty()
    t = tree("r", (1, ROOT, 0.9))
    assert cal.score("r", 1, 0.9) == pytest.approx(0.9)
    for _ in range(36):
        cal.update(t, [2])                # never right
    assert cal.score("r", 1, 0.9) == pytest.approx(3.6 / 40)
    assert cal.score("other", 1, 0.9) == pytest.approx(0.9)     # per source
    assert cal.score("r", 2, 0.9) == pytest.approx(0.9)         # per depth


# ------------------------------------------------------------------------------ recycling
def test_table_keeps_the_latest_row_per_token_and_states_its_size():
    table = RecyclingTable(vocab_size=10, k=3)
    logits = torch.tensor([[0.0] * 9 + [5.0], [9.0, 8.0, 7.0] + [0.0] * 7, [0.0, 0.0, 0.0, 9.0] + [0.0] * 6])
    table.update([4, 4, 2], logits)            # token 4 fed twice: its last row counts
    assert [t for t, _ in table.children(4, 3)] == [0, 1, 2]
    assert table.children(2, 1)[0][0] == 3 and table.children(2, 1)[0][1] > 0.9
    assert table.children(7, 3) == [] and table.children(99, 3) == []
    assert table.filled == 2
    assert RecyclingTable(49152).nbytes == 49152 * 8 * 6      # int32 ids + float16 probabilities


def test_recycling_grows_best_first_through_the_table():
    table = RecyclingTable(vocab_size=8, k=2)
    rows = torch.full((8, 8), -9.0)
    rows[0, 1], rows[0, 2] = 2.0, 1.0          # after 0: 1 (likely), then 2
    rows[1, 3] = 9.0                           # after 1: 3, nearly sure
    table.update(list(range(8)), rows)
    got = RecyclingSource(table, children=2).propose([5, 0], SourceRequest(gamma=3, max_nodes=3))
    assert [(n.token, n.parent) for n in got.nodes] == [(1, ROOT), (3, 0), (2, ROOT)]
    assert got.source == "recycling" and got.depths() == [1, 2, 1]


# ------------------------------------------------------------------------------ exactness
def recycling_plan(draft, gamma: int, budget: int):
    """The training-free plan on a toy: a recycling table filled from another model's rows (earlier
    forwards), its tree composed and calibrated, the best `budget` nodes verified."""
    table = RecyclingTable(draft.vocab, k=draft.vocab)
    table.update(list(range(draft.vocab)),
                 torch.log(torch.tensor([[float(p) for p in row] for row in draft.rows])))
    source, cal = RecyclingSource(table, children=2), OnlineCalibration.empty()

    def plan(last: int):
        proposed = source.propose([last], SourceRequest(gamma, 2 * budget))
        lattice = compose(None, [proposed], [cal.scores(proposed)], gamma).lattice
        return flat_tree(last, best_tree(lattice, budget))
    return plan


@pytest.mark.parametrize("gamma,budget", [(2, 3), (3, 5), (4, 6)])
def test_recycled_trees_are_exact_by_enumeration(gamma, budget):
    target, draft = toy_pair(200 + gamma)
    got = speculative_sequences(target, 0, 5, recycling_plan(draft, gamma, budget))
    assert got == target_sequences(target, 0, 5)


def test_recycled_trees_with_the_retrospective_rule_fail():
    target, draft = toy_pair(203)
    got = speculative_sequences(target, 0, 5, recycling_plan(draft, 3, 5), retrospective_branches)
    assert total_variation(got, target_sequences(target, 0, 5)) > Fraction(1, 100)


@pytest.fixture(scope="module")
def lm():
    return varied_llama(seed=3)


PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [9, 40, 17], [33]]


@pytest.mark.parametrize("select", ["chain", "tree"])
@pytest.mark.parametrize("lookup", [0, 2])
def test_training_free_dspark_equals_greedy(lm, select, lookup):
    for prompt in PROMPTS:
        greedy = run(lm, prompt, GreedyConfig(max_new_tokens=30)).output_ids
        config = DSparkConfig(max_new_tokens=30, drafter="recycling", select=select, lookup_max_ngram=lookup,
                              cost_table=None, gamma=4)
        tr = run(lm, prompt, config)
        assert tr.error is None and tr.output_ids == greedy


def test_recycled_nodes_are_verified_both_ways(lm):
    """The checks above are not vacuous: recycled nodes get accepted and rejected."""
    memory = SourceMemory()
    for prompt in PROMPTS:
        run(lm, prompt, DSparkConfig(max_new_tokens=30, drafter="recycling", cost_table=None), memory=memory)
    tr = run(lm, PROMPTS[0], DSparkConfig(max_new_tokens=40, drafter="recycling", cost_table=None), memory=memory)
    verdicts = {n.verdict for e in tr.steps for n in e.nodes if "recycling" in n.sources}
    assert {"accepted", "rejected"} <= verdicts
    cells = [c for e in tr.steps for col in e.lattice for c in col.cells]
    assert cells and all(c.sources for c in cells)


def accept_first(tokens, parents, logits):
    """WRONG on purpose: the first child of the root is accepted whatever the target says."""
    kids = [i for i, p in enumerate(parents) if p == 0]
    acc = (kids[0],) if kids else ()
    nxt = int(torch.argmax(logits[acc[-1] if acc else 0]))
    return RoundOutcome(acc, nxt, "bonus", None, (), tuple(tokens[i] for i in acc) + (nxt,))


def test_wrong_rule_with_recycling_diverges(lm, monkeypatch):
    memory, config = SourceMemory(), DSparkConfig(max_new_tokens=30, drafter="recycling", cost_table=None)
    run(lm, PROMPTS[0], config, memory=memory)                       # warm the table
    monkeypatch.setattr(dspark, "greedy_round", accept_first)
    tr = run(lm, PROMPTS[0], config, memory=memory)
    assert tr.output_ids != run(lm, PROMPTS[0], GreedyConfig(max_new_tokens=30)).output_ids


# ------------------------------------------------------------------------------ auto and names
def test_auto_uses_training_free_sources_where_no_shipped_drafter_fits(lm):
    tr = run(lm, PROMPTS[1], DSparkConfig(max_new_tokens=8))
    info = tr.steps[0].drafting
    assert info.sources == ("lookup", "recycling")
    assert "no shipped drafter" in info.reason


def test_naming_a_trained_drafter_for_another_model_names_the_drafter(lm):
    with pytest.raises(ConfigError) as err:
        next(dspark.decode(lm, PROMPTS[1], DSparkConfig(max_new_tokens=8, drafter="feature"),
                           generator=torch.Generator()))
    assert err.value.param == "drafter" and err.value.value == "feature"
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["recycling+recycling", " "])
def test_bad_drafter_names_are_one_line_errors(name):
    with pytest.raises(ConfigError, match="drafter"):
        DSparkConfig(drafter=name)


def test_fingerprint_matches_across_dtypes_and_not_across_models():
    a, b = varied_llama(seed=5), varied_llama(seed=6)
    fa = fingerprint(a)
    a.model.to(torch.bfloat16)
    assert matches(fa, fingerprint(a))
    assert not matches(fa, fingerprint(b))
    assert not matches(None, fa) and not matches({"arch": fa["arch"], "weights": ["x"]}, fa)


# ------------------------------------------------------------------------------ speculative over the sources
@pytest.mark.parametrize("draft", ["recycling", "lookup+recycling", "auto"])
def test_speculative_training_free_equals_greedy(lm, draft):
    from decoding.core.config import SpeculativeConfig
    from decoding.drafters.factory import load_draft

    drafters = set()
    for prompt in PROMPTS:
        config = SpeculativeConfig(max_new_tokens=30, draft=draft, gamma=4)
        assert config.draft_model in (None, "auto")
        kwargs = {"drafter": load_draft(config.draft_model, lm)} if config.draft_model else {}
        tr = run(lm, prompt, config, **kwargs)
        assert tr.error is None and tr.output_ids == run(lm, prompt, GreedyConfig(max_new_tokens=30)).output_ids
        drafters |= {e.drafter for e in tr.steps if e.gamma}
    assert "recycling" in drafters


def test_greedy_walk_follows_the_best_child():
    from decoding.drafters.source_chain import greedy_walk

    lat = Lattice([[1, 2], [3, 4]], [[0.5, 0.5], [0.5, 0.5]], [[[0.4, 0.6]], [[0.9, 0.1], [0.2, 0.3]]])
    assert greedy_walk(lat, 2) == [1, 1]          # 2 (0.6), then under 2: 4 (0.3)
    assert greedy_walk(lat, 1) == [1]
    dead = Lattice([[1], [3]], [[0.5], [0.5]], [[[0.4]], [[0.0]]])
    assert greedy_walk(dead, 2) == [0]


# ------------------------------------------------------------------------------ suffix matching
LEAD = 0            # the toy's round context is (LEAD, last): a 2-gram, the shortest suffix matched


def suffix_plan(draft, gamma: int, budget: int, proposed: dict):
    """The suffix plan on a toy: a store holding text another model wrote (earlier runs), its tree for the
    context (LEAD, last) composed and calibrated, the best `budget` nodes verified; `proposed` gets each
    round's tree. The store is restored before each round, so the plan is a function of `last`."""
    rng, store = random.Random(gamma), SuffixStore()
    for _ in range(8):
        text = [LEAD]
        while len(text) < 12:
            text.append(rng.choices(range(draft.vocab), [float(p) for p in draft.rows[text[-1]]])[0])
        store.extend(store.open(), text)
    state, cal = store.snapshot(), OnlineCalibration.empty()

    def plan(last: int):
        store.restore(state)
        proposed[last] = SuffixSource(store).propose([LEAD, last], SourceRequest(gamma, 2 * budget))
        lattice = compose(None, [proposed[last]], [cal.scores(proposed[last])], gamma).lattice
        return flat_tree(last, best_tree(lattice, budget))
    return plan


def branched(tree: Proposal) -> bool:
    """Some node of the tree has a sibling (several continuations were matched)."""
    parents = [n.parent for n in tree.nodes]
    return len(set(parents)) < len(parents)


@pytest.mark.parametrize("gamma,budget", [(2, 3), (3, 5), (4, 6)])
def test_suffix_trees_are_exact_by_enumeration(gamma, budget):
    target, draft = toy_pair(300 + gamma)
    proposed: dict = {}
    got = speculative_sequences(target, 0, 5, suffix_plan(draft, gamma, budget, proposed))
    assert got == target_sequences(target, 0, 5)
    assert sorted(proposed) == list(range(target.vocab)) and all(t.nodes for t in proposed.values())
    assert any(branched(t) for t in proposed.values())


def test_suffix_trees_with_the_retrospective_rule_fail():
    target, draft = toy_pair(303)
    proposed: dict = {}
    got = speculative_sequences(target, 0, 5, suffix_plan(draft, 3, 5, proposed), retrospective_branches)
    assert total_variation(got, target_sequences(target, 0, 5)) > Fraction(1, 100)
    assert all(t.nodes for t in proposed.values())


@pytest.mark.parametrize("select", ["chain", "tree"])
@pytest.mark.parametrize("lookup", [0, 2])
def test_suffix_dspark_equals_greedy(lm, select, lookup):
    """Each prompt twice: the second run matches the first one's text in the memory they share."""
    suffix_nodes, memory = 0, SourceMemory()
    for prompt in PROMPTS * 2:
        greedy = run(lm, prompt, GreedyConfig(max_new_tokens=30)).output_ids
        config = DSparkConfig(max_new_tokens=30, drafter="suffix", select=select, lookup_max_ngram=lookup,
                              cost_table=None, gamma=4)
        tr = run(lm, prompt, config, memory=memory)
        assert tr.error is None and tr.output_ids == greedy
        suffix_nodes += sum("suffix" in n.sources for e in tr.steps for n in e.nodes)
    assert suffix_nodes > 0


@pytest.mark.parametrize("config", [
    DSparkConfig(max_new_tokens=20, drafter="suffix", cost_table=None, gamma=4),
    SpeculativeConfig(max_new_tokens=20, draft="suffix", gamma=4)], ids=["dspark", "speculative"])
def test_the_suffix_store_keeps_each_run_whole(lm, config):
    """A run's text goes into the store to its last token: the last round's tokens, which no later round
    proposes after, included (else each run's ending stays a match with nothing after it)."""
    memory, prompt = SourceMemory(), PROMPTS[0]
    tr = run(lm, prompt, config, memory=memory)
    assert tr.error is None and len(tr.output_ids) > 4
    assert list(memory.suffix_store().sequences.values())[-1] == list(prompt) + list(tr.output_ids)


def test_suffix_nodes_are_verified_both_ways(lm):
    """The checks above are not vacuous: suffix nodes get accepted (text seen before) and rejected (the
    prompt's own repeat, which greedy does not follow)."""
    verdicts, memory = set(), SourceMemory()
    for prompt in PROMPTS * 2:
        tr = run(lm, prompt, DSparkConfig(max_new_tokens=30, drafter="suffix", cost_table=None, lookup_max_ngram=0),
                 memory=memory)
        verdicts |= {n.verdict for e in tr.steps for n in e.nodes if "suffix" in n.sources}
        assert tr.steps[0].drafting.sources == ("suffix",)
    assert {"accepted", "rejected"} <= verdicts


def test_wrong_rule_with_suffix_diverges(lm, monkeypatch):
    """A cold store: the prompt's repeat (…, 2, 3 matches 2, 3 -> 4, 5) is proposed; the wrong rule takes it."""
    monkeypatch.setattr(dspark, "greedy_round", accept_first)
    tr = run(lm, PROMPTS[0], DSparkConfig(max_new_tokens=30, drafter="suffix", cost_table=None, lookup_max_ngram=0))
    assert any("suffix" in n.sources for e in tr.steps for n in e.nodes)
    assert tr.output_ids != run(lm, PROMPTS[0], GreedyConfig(max_new_tokens=30)).output_ids


@pytest.mark.parametrize("draft", ["suffix", "lookup+suffix", "recycling+suffix"])
def test_speculative_suffix_equals_greedy(lm, draft):
    """Each prompt twice, so that suffix matching finds text that prompt lookup (this context only) cannot."""
    from decoding.core.config import SpeculativeConfig

    drafters, memory = set(), SourceMemory()
    for prompt in PROMPTS * 2:
        tr = run(lm, prompt, SpeculativeConfig(max_new_tokens=30, draft=draft, gamma=4), memory=memory)
        assert tr.error is None and tr.output_ids == run(lm, prompt, GreedyConfig(max_new_tokens=30)).output_ids
        drafters |= {e.drafter for e in tr.steps if e.gamma}
    assert draft.removeprefix("lookup+") in drafters


# ------------------------------------------------------------------------------ a draft model as a source
@pytest.fixture(scope="module")
def draft_dirs(tmp_path_factory):
    """A tiny llama with the embedded tokenizer (the target), a twin of it, another of its vocabulary and
    one with a smaller vocabulary, saved as model directories."""
    from conftest import make_tiny_llama

    from bench.tiny_model import embedded_tokenizer

    root, tok = tmp_path_factory.mktemp("draft_models"), embedded_tokenizer()
    for name, seed, vocab in (("target", 0, 49152), ("same", 0, 49152), ("other", 5, 49152), ("wide", 0, 64)):
        make_tiny_llama(vocab_size=vocab, seed=seed, eos_token_id=tok.eos_token_id).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root


@pytest.fixture(scope="module")
def tok_lm(draft_dirs):
    from decoding.runtime.models import ModelSpec, load

    return load(ModelSpec(str(draft_dirs / "target")))


@pytest.mark.parametrize("which", ["same", "other"])
@pytest.mark.slow
def test_a_draft_model_source_is_exact_and_proposes_its_path(tok_lm, draft_dirs, which):
    name = f"model:{draft_dirs / which}"
    for prompt in ([1, 2, 3, 4, 5], [900, 17, 4000]):
        tr = run(tok_lm, prompt, DSparkConfig(max_new_tokens=20, drafter=name, cost_table=None, lookup_max_ngram=0))
        assert tr.error is None
        assert tr.output_ids == run(tok_lm, prompt, GreedyConfig(max_new_tokens=20)).output_ids
        assert tr.steps[0].drafting.sources == ("model",)
    nodes = [n for e in tr.steps for n in e.nodes]
    assert nodes and all(n.sources == ("model",) for n in nodes)
    if which == "same":                  # the target's own greedy path: every path node is accepted
        assert tr.stats.mean_accepted_length > 3


@pytest.mark.slow
def test_a_draft_model_source_is_verified_both_ways(lm):
    """A draft model that often disagrees with the target (two varied llamas): still greedy's output, and
    its nodes are accepted and rejected."""
    name, verdicts = as_draft_model_source(lm, varied_llama(seed=4)), set()
    for prompt in PROMPTS:
        tr = run(lm, prompt, DSparkConfig(max_new_tokens=30, drafter=name, cost_table=None, lookup_max_ngram=0))
        assert tr.error is None and tr.output_ids == run(lm, prompt, GreedyConfig(max_new_tokens=30)).output_ids
        verdicts |= {n.verdict for e in tr.steps for n in e.nodes if n.sources == ("model",)}
    assert {"accepted", "rejected"} <= verdicts


def test_wrong_rule_with_a_draft_model_source_diverges(lm, monkeypatch):
    name = as_draft_model_source(lm, varied_llama(seed=4))
    monkeypatch.setattr(dspark, "greedy_round", accept_first)
    tr = run(lm, PROMPTS[0], DSparkConfig(max_new_tokens=30, drafter=name, cost_table=None, lookup_max_ngram=0))
    assert any(n.sources == ("model",) for e in tr.steps for n in e.nodes)
    assert tr.output_ids != run(lm, PROMPTS[0], GreedyConfig(max_new_tokens=30)).output_ids


class MarkovDrafter:
    """A tabular toy's draft model behind DraftModelSource: its greedy path from the last token, with the
    rows it drew each token from (what DraftModelDrafter returns for a greedy chain request)."""

    def __init__(self, draft):
        self.draft = draft

    def propose(self, context, request):
        tokens, rows, last = [], [], context[-1]
        for _ in range(request.gamma):
            rows.append([float(p) for p in self.draft.rows[last]])
            last = self.draft.top(self.draft.rows[last], 1)[0]
            tokens.append(last)
        return SimpleNamespace(tokens=tuple(tokens), q_draft=torch.tensor(rows))


def model_plan(draft, gamma: int, budget: int, proposed: dict):
    """The draft model's plan on a toy: its greedy path with the top 2 of each step, composed and
    calibrated, the best `budget` nodes verified; `proposed` gets each round's tree."""
    source, cal = DraftModelSource(MarkovDrafter(draft), top_k=2), OnlineCalibration.empty()

    def plan(last: int):
        proposed[last] = source.propose([last], SourceRequest(gamma, 2 * budget))
        lattice = compose(None, [proposed[last]], [cal.scores(proposed[last])], gamma).lattice
        return flat_tree(last, best_tree(lattice, budget))
    return plan


@pytest.mark.parametrize("gamma,budget", [(2, 3), (3, 5), (4, 6)])
def test_draft_model_trees_are_exact_by_enumeration(gamma, budget):
    target, draft = toy_pair(400 + gamma)
    proposed: dict = {}
    got = speculative_sequences(target, 0, 5, model_plan(draft, gamma, budget, proposed))
    assert got == target_sequences(target, 0, 5)
    assert all(len(t.nodes) == min(2 * gamma, 2 * budget) and branched(t) for t in proposed.values())


def test_draft_model_trees_with_the_retrospective_rule_fail():
    target, draft = toy_pair(403)
    got = speculative_sequences(target, 0, 5, model_plan(draft, 3, 5, {}), retrospective_branches)
    assert total_variation(got, target_sequences(target, 0, 5)) > Fraction(1, 100)


def test_a_draft_model_source_must_be_a_model_of_the_targets_vocabulary(tok_lm, draft_dirs, tmp_path):
    for name, message in ((tmp_path / "none", "no such file"), (draft_dirs / "wide", "vocabulary")):
        with pytest.raises(ConfigError, match=message) as err:
            next(dspark.decode(tok_lm, [1, 2], DSparkConfig(drafter=f"model:{name}"), generator=torch.Generator()))
        assert err.value.param == "drafter" and str(err.value.value).startswith("model:")


def test_recycling_reads_the_prompt_positions_at_the_prefill():
    """The prefill keeps the logits of the prompt's last positions for token recycling (one head product), so
    the table knows what followed each of those prompt tokens; without it, only the last."""
    from decoding.drafters import recycling

    fresh = varied_llama(seed=11)
    prompt = [3, 9, 27, 81 % 64]
    memory = SourceMemory()
    run(fresh, prompt, DSparkConfig(max_new_tokens=1, drafter="recycling", cost_table=None), memory=memory)
    assert all(memory.recycling_table(fresh.vocab_size).children(t, 1) for t in prompt)
    memory.clear()
    saved, recycling.RecyclingSource.prompt_rows = recycling.RecyclingSource.prompt_rows, 0
    try:
        run(fresh, prompt, DSparkConfig(max_new_tokens=1, drafter="recycling", cost_table=None), memory=memory)
    finally:
        recycling.RecyclingSource.prompt_rows = saved
    table = memory.recycling_table(fresh.vocab_size)
    assert [bool(table.children(t, 1)) for t in prompt] == [False, False, False, True]


# ------------------------------------------------------------------------------ bounds and names
def test_suffix_store_stays_bounded_and_matches_the_latest_text():
    from decoding.drafters.suffix import MAX_HITS, SuffixSource, SuffixStore, continuation_tree

    store = SuffixStore(max_tokens=300)
    for run_ in range(40):
        sid = store.open()
        seq = [(run_ * 7 + i) % 97 for i in range(60)]
        store.extend(sid, seq[:30])
        store.extend(sid, seq)
    assert store.tokens <= 300 + 60 and len(store.sequences) <= 6
    assert len(store.index) <= 2 * 3 * store.tokens and all(len(v) <= MAX_HITS for v in store.index.values())
    state = store.snapshot()
    source = SuffixSource(store)
    source.start([5, 6, 7, 8, 5, 6])                    # the prompt is indexed at once: 5, 6 -> 7 matches in it
    tree = source.propose([5, 6, 7, 8, 5, 6], SourceRequest(gamma=2, max_nodes=4))
    assert tree.nodes and tree.nodes[0].token == 7
    store.restore(state)
    assert store.tokens == state[3] and set(store.sequences) == {sid for sid, _ in state[0]}
    nodes = continuation_tree([(1, 2), (1, 3), (4,)], max_nodes=3)
    assert [(n.token, n.parent) for n in nodes] == [(1, ROOT), (4, ROOT), (2, 0)]
    assert nodes[0].prior == pytest.approx(2 / 3) and nodes[2].prior == pytest.approx(1 / 2)


def test_long_and_repeated_drafter_names(lm, tmp_path):
    with pytest.raises(ConfigError, match="more than one draft model"):
        DSparkConfig(drafter="model:a+model:b")
    long_path = str(tmp_path / ("d" * 200) / ("e" * 200) / "x.safetensors")
    info = resolve(lm, DSparkConfig(drafter=long_path + "+recycling"), random_head(lm)).info
    assert len(info.reason) <= 300 and info.reason.endswith("+recycling' as set")


def random_head(lm):
    from dspark_helpers import random_drafter

    return random_drafter(lm, gamma_max=8)


def test_a_source_name_from_a_trace_is_escaped_in_the_calibration_legend():
    import pandas as pd

    from ui.views import calibration

    table = pd.DataFrame([{"round": 1, "node": 1, "position": 1, "source": "<a href='x'>l</a>", "score": 0.5,
                           "accepted": True}], columns=calibration.SAMPLE_COLUMNS)
    names = [t.name for t in calibration.reliability_figure(table, "source").data]
    assert not any("<a" in name for name in names) and any("&lt;a" in name for name in names)


def test_auto_is_no_match_when_the_embedding_cannot_be_read(lm, monkeypatch):
    from decoding.runtime import fingerprint

    def offloaded(lm):
        raise NotImplementedError("Cannot copy out of meta tensor")
    monkeypatch.setattr(fingerprint, "cached_fingerprint", offloaded)
    assert fingerprint.shipped_fits(lm) is False
