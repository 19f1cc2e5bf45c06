"""bench/dspark_sources.py: its contenders, and the cold contender clears the recycling table first."""
from __future__ import annotations

import argparse

import torch

from bench import dspark_sources
from decoding.drafters.recycling import table_for
from tests.dspark_helpers import varied_llama


def test_contenders_and_the_cold_table():
    lm = varied_llama(seed=4)
    runs, reference = dspark_sources.contenders(lm, None, argparse.Namespace(max_new_tokens=6, temperature=0.0))
    assert reference == "greedy (ours)" and list(runs)[0] == reference
    assert dspark_sources.TRAINING_FREE in runs and dspark_sources.DEFAULTS in runs
    table = table_for(lm)
    prompt = [1, 2, 3]
    runs[dspark_sources.TRAINING_FREE](prompt)
    assert table.filled > 0
    unfed = next(t for t in range(lm.vocab_size) if table.children(t, 1) == [])
    table.update([unfed], torch.zeros(1, lm.vocab_size))          # a row no run of this prompt writes
    tokens, _, trace = runs["DSpark training-free, table cleared before each run"](prompt)
    fed = set(prompt) | set(trace.output_ids)
    assert unfed in fed or table.children(unfed, 1) == []
    assert table.filled <= len(fed)             # only rows this run wrote
    assert tokens == 6
