"""Temperature > 0: the first tokens dspark emits follow the target's processed distribution (χ²
against exact marginals computed from the model, over many seeds; chain and tree, random drafter, and
with prompt-lookup candidates in the lattice; each training-free source alone, and a draft model alone).
Negative control: the lossy threshold mode must fail the same test."""
from __future__ import annotations

import pytest
from dspark_helpers import as_draft_model_source, one_thread, random_drafter, varied_llama
from sampling_support import PROCESSING, PROMPT, VOCAB, pvalues

from decoding.core.config import DSparkConfig
from decoding.drafters.memory import SourceMemory
from decoding.runner import run

pytestmark = pytest.mark.slow   # χ² tests: `make test-fast` leaves them out

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)
@pytest.fixture(scope="module")
def lm():
    return varied_llama(seed=2, vocab=VOCAB, init=0.1)


@pytest.fixture(scope="module")
def drafter(lm):
    return random_drafter(lm, gamma_max=4, seed=1)


@pytest.mark.parametrize("select,k,budget", [("chain", 3, 1), ("tree", 3, 5)])
def test_first_tokens_follow_the_target(lm, drafter, select, k, budget):
    values = pvalues(lm, drafter, select=select, top_k_candidates=k, budget=budget)
    assert min(values) > 1e-3, values


def test_lossy_mode_fails_the_same_test(lm, drafter):
    values = pvalues(lm, drafter, select="tree", top_k_candidates=3, budget=5, lossy_threshold=0.05)
    assert values[0] > 1e-3                # the prefill token is plain sampling
    assert min(values[1:]) < 1e-6, values  # the drafted positions are biased


def test_lookup_candidates_keep_the_target_distribution(lm, drafter):
    """Prompt lookup's continuation in the lattice (the prompt repeats a token, so it matches often)."""
    config = {"select": "tree", "top_k_candidates": 1, "budget": 4, "lookup_max_ngram": 1}
    values = pvalues(lm, drafter, **config)
    assert min(values) > 1e-3, values
    verified = sum(n.lookup for seed in range(50)
                   for e in run(lm, PROMPT, DSparkConfig(max_new_tokens=3, gamma=2, seed=seed, **PROCESSING,
                                                         **config), drafter=drafter).steps
                   for n in e.nodes)
    assert verified >= 10, verified


def test_recycled_candidates_keep_the_target_distribution(lm):
    """Token recycling alone (no trained drafter): its table fills from the runs' own forwards."""
    config = {"drafter": "recycling", "select": "tree", "budget": 4, "cost_table": None}
    values = pvalues(lm, None, **config)
    assert min(values) > 1e-3, values
    verified = sum("recycling" in n.sources for seed in range(50)
                   for e in run(lm, PROMPT, DSparkConfig(max_new_tokens=3, gamma=2, seed=seed, **PROCESSING,
                                                         **config)).steps
                   for n in e.nodes)
    assert verified >= 20, verified


def test_recycled_candidates_fail_the_test_in_the_lossy_mode(lm):
    values = pvalues(lm, None, drafter="recycling", select="tree", budget=4, cost_table=None,
                     lossy_threshold=0.05)
    assert min(values[1:]) < 1e-6, values


def verified_from(lm, source: str, config: dict, memory=lambda: None) -> int:
    """Plan nodes `source` proposed over the first 50 seeds' runs (each from `memory()`, None: empty)."""
    total = 0
    for seed in range(50):
        steps = run(lm, PROMPT, DSparkConfig(max_new_tokens=3, gamma=2, seed=seed, **PROCESSING, **config),
                    memory=memory()).steps
        total += sum(source in n.sources for e in steps for n in e.nodes)
    return total


SUFFIX_ALONE = {"drafter": "suffix", "select": "tree", "budget": 4, "cost_table": None, "lookup_max_ngram": 0}


@pytest.fixture(scope="module")
def warm_store(lm):
    """Suffix matching's memory after 20 longer runs from the prompt; each run starts from a copy of it, which
    keeps the draft side fixed. (Left to grow, the runs' own 3-token texts soon fill the latest places kept per
    n-gram with matches at a text's end, which continue with nothing, and the source stops proposing.)"""
    memory = SourceMemory()
    for seed in range(20):
        run(lm, PROMPT, DSparkConfig(max_new_tokens=12, gamma=2, seed=10_000 + seed, **PROCESSING, **SUFFIX_ALONE),
            memory=memory)
    return memory.copy


def test_suffix_candidates_keep_the_target_distribution(lm, warm_store):
    """Suffix matching alone: the prompt's end (and the first token after it) match text of the earlier
    runs, which continues in several ways, counted."""
    values = pvalues(lm, None, warm_store, **SUFFIX_ALONE)
    assert min(values) > 1e-3, values
    assert verified_from(lm, "suffix", SUFFIX_ALONE, warm_store) >= 20


def test_suffix_candidates_fail_the_test_in_the_lossy_mode(lm, warm_store):
    values = pvalues(lm, None, warm_store, **SUFFIX_ALONE, lossy_threshold=0.05)
    assert min(values[1:]) < 1e-6, values


@pytest.fixture(scope="module")
def model_alone(lm):
    """A draft model alone (another varied llama of the same vocabulary) as DSpark's source."""
    name = as_draft_model_source(lm, varied_llama(seed=5, vocab=VOCAB, init=0.1))
    return {"drafter": name, "select": "tree", "budget": 4, "cost_table": None, "lookup_max_ngram": 0}


def test_draft_model_candidates_keep_the_target_distribution(lm, model_alone):
    values = pvalues(lm, None, **model_alone)
    assert min(values) > 1e-3, values
    assert verified_from(lm, "model", model_alone) >= 20


def test_draft_model_candidates_fail_the_test_in_the_lossy_mode(lm, model_alone):
    values = pvalues(lm, None, **model_alone, lossy_threshold=0.05)
    assert min(values[1:]) < 1e-6, values
