"""bench/dspark_sources.py: its contenders, and each run starts from the memory it names (warm or cold)."""
from __future__ import annotations

import argparse

import pytest
from dspark_helpers import varied_llama

from bench import dspark_sources


def test_contenders_run_from_the_memory_they_name(monkeypatch):
    lm = varied_llama(seed=4)
    monkeypatch.setattr(dspark_sources, "WARM_PROMPTS", 2)
    monkeypatch.setattr(lm, "encode", lambda text: [1, 2, 3, len(text) % 50 + 4])
    memory = dspark_sources.Memory(lm, 6)
    table, store = memory.warm_state.recycling_table(lm.vocab_size), memory.warm_state.suffix_store()
    warm_rows, warm_tokens = table.filled, store.tokens
    assert warm_rows > 0 and warm_tokens > 0
    args = argparse.Namespace(max_new_tokens=6, temperature=0.0, budgets=())
    runs, reference = dspark_sources.contenders(lm, None, args, memory)
    assert reference == "greedy (ours)" and list(runs)[0] == reference
    assert dspark_sources.TRAINING_FREE in runs and dspark_sources.DEFAULTS in runs
    started = {}
    for name in (dspark_sources.TRAINING_FREE, "DSpark recycling + suffix + lookup, warm",
                 "DSpark token recycling + lookup, cold", "speculative lookup+recycling cost-aware γ≤8, warm"):
        tokens, _, trace = runs[name]([7, 8, 9])
        assert tokens == 6
        started[name] = trace.steps[0].drafting.memory
    assert started == {dspark_sources.TRAINING_FREE: "2 earlier runs",
                       "DSpark recycling + suffix + lookup, warm": "2 earlier runs",
                       "DSpark token recycling + lookup, cold": "empty",
                       "speculative lookup+recycling cost-aware γ≤8, warm": "2 earlier runs"}
    assert (table.filled, store.tokens) == (warm_rows, warm_tokens)     # each run wrote into its own copy


def test_budgets_add_larger_recycling_trees(monkeypatch):
    lm = varied_llama(seed=4)
    monkeypatch.setattr(dspark_sources, "WARM_PROMPTS", 1)
    monkeypatch.setattr(lm, "encode", lambda text: [1, 2, 3, len(text) % 50 + 4])
    memory = dspark_sources.Memory(lm, 4)
    args = argparse.Namespace(max_new_tokens=4, temperature=0.0, budgets=(12,))
    runs, _ = dspark_sources.contenders(lm, None, args, memory)
    tokens, _, trace = runs["DSpark token recycling + lookup, warm, fixed tree of 12"]([7, 8, 9])
    assert tokens == 4 and trace.config["budget"] == 12 and trace.config["drafter"] == "recycling"
    assert "DSpark token recycling + lookup, warm, tree ≤ 12" in runs
    with pytest.raises(SystemExit):
        dspark_sources.main(["--budgets", "0"])
