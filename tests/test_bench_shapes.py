"""bench/shapes.py (the GPU check's timing table), tried on the CPU with the 2-layer model: every
contender decodes the full length, the greedy-exact ones (and transformers' generate) reproduce our
greedy's tokens, and the table is written row by row (a run stopped at a time limit keeps its rows)."""
from __future__ import annotations

import pytest
import torch

from bench import shapes


def test_every_contender_runs_and_the_exact_ones_match_greedy():
    lm = shapes.random_model(shapes.TINY_SHAPES, torch.device("cpu"), torch.float32)
    lines: list[str] = []
    rows = shapes.measure_all(lm, shapes.prompt_ids(lm.vocab_size), 12, 1, emit=lines.append)
    labels = [r.strategy for r in rows]
    assert labels[:2] == ["greedy", shapes.GENERATE] and len(labels) == 9
    assert all(r.tokens == 12 and r.tokens_per_s > 0 for r in rows)
    exact = [r for r in rows if r.strategy.startswith(shapes.GREEDY_EXACT) or r.strategy == shapes.GENERATE]
    assert len(exact) == 7 and all(r.same_as_greedy is True for r in exact)
    assert all(r.same_as_greedy is None for r in rows if r not in exact)      # sample, beam: not claimed
    assert lines[-len(rows):] == [shapes.row_line(r, rows[0].tokens_per_s) for r in rows]
    assert "| 1.00 |" in lines[-len(rows)]


def test_a_row_whose_tokens_differ_is_flagged():
    row = shapes.Row("speculative, x", 12, 100.0, 1.0, 2.0, None, same_as_greedy=False)
    assert shapes.row_line(row, 50.0).endswith("| 2.00 | 1.00 | 2.00 | 1.00 | – | **no** |")   # step cost τ / 2.0


@pytest.mark.slow
def test_the_fast_path_rows_match_greedy_and_report_the_ratio():
    """--fast-path: the one-sequence strategies again on the fast path (emulated graphs on the CPU), each
    greedy-exact one with our greedy's tokens, and a last line with fast greedy over generate."""
    lm = shapes.random_model(shapes.TINY_SHAPES, torch.device("cpu"), torch.float32)
    lines: list[str] = []
    rows = shapes.measure_all(lm, shapes.prompt_ids(lm.vocab_size), 12, 1, emit=lines.append, fast=True)
    fast = [r for r in rows if r.strategy.startswith("fast path: ")]
    assert [r.strategy.removeprefix("fast path: ").split(" ")[0] for r in fast] == \
        ["greedy", "sample", "speculative,", "speculative,", "dspark,", "dspark,"]
    assert all(r.tokens == 12 for r in fast)
    assert all(r.same_as_greedy is True for r in fast if not r.strategy.startswith("fast path: sample"))
    assert lines[-1].startswith("Fast path: static caches (1 slot of 512 positions, up to 1024) and ")
    assert "same tokens: yes" in lines[-1]
    assert lm.fast is None                               # the baseline rows ran on the dynamic cache
