"""bench/dspark_sources.py: its contenders, and each run starts from the memory it names (warm or cold)."""
from __future__ import annotations

import argparse

import pytest
import torch

from bench import dspark_sources
from decoding.drafters.recycling import table_for
from decoding.drafters.suffix import store_for
from tests.dspark_helpers import varied_llama


def test_contenders_run_from_the_memory_they_name(monkeypatch):
    lm = varied_llama(seed=4)
    monkeypatch.setattr(dspark_sources, "WARM_PROMPTS", 2)
    monkeypatch.setattr(lm, "encode", lambda text: [1, 2, 3, len(text) % 50 + 4])
    memory = dspark_sources.Memory(lm, 6)
    table, store = table_for(lm), store_for(lm)
    warm_rows, warm_tokens = table.filled, store.tokens
    assert warm_rows > 0 and warm_tokens > 0
    args = argparse.Namespace(max_new_tokens=6, temperature=0.0, budgets=())
    runs, reference = dspark_sources.contenders(lm, None, args, memory)
    assert reference == "greedy (ours)" and list(runs)[0] == reference
    assert dspark_sources.TRAINING_FREE in runs and dspark_sources.DEFAULTS in runs
    table.update([60], torch.zeros(1, lm.vocab_size))        # a row the warm state does not have
    runs[dspark_sources.TRAINING_FREE]([7, 8, 9])
    assert store.tokens == warm_tokens                        # the recycling contender keeps no text
    runs["DSpark recycling + suffix + lookup, warm"]([7, 8, 9])
    assert store.tokens > warm_tokens                         # started from the warm store, then added its own
    tokens, _, trace = runs["DSpark token recycling + lookup, cold"]([7, 8, 9])
    fed = {7, 8, 9} | set(trace.output_ids) | {node.token_id for step in trace.steps for node in step.nodes}
    assert tokens == 6 and 0 < table.filled <= len(fed)      # rows only for tokens this run fed the target
    assert 60 in fed or table.next_ids[60, 0] < 0             # the row set before it was forgotten
    memory.warm()
    assert (table.filled, store.tokens) == (warm_rows, warm_tokens)


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
