"""bench/distill_gen.py: every contender writes every prompt's answer, the table reports their rates and
how many answers agree (all of them on a tiny model, where no near-tie parts them)."""
from __future__ import annotations

import argparse

from batch_support import PROMPTS

from bench import distill_gen


def test_every_contender_answers_alike_and_the_table_says_so(tiny_lm):
    rates, answers = distill_gen.measure(tiny_lm, PROMPTS, answer_tokens=6, batch=4, repeats=2)
    ours = answers[distill_gen.BATCHED]
    assert len(answers) == 4 and all(a == ours for a in answers.values())
    assert len(ours) == len(PROMPTS) and all(len(a) == 6 for a in ours)
    assert all(len(r) == 2 and min(r) > 0 for r in rates.values())
    args = argparse.Namespace(n_prompts=len(PROMPTS), batch=4, answer_tokens=6, repeats=2)
    body = distill_gen.render(rates, answers, args)
    assert f"Answers alike: {len(PROMPTS)} of {len(PROMPTS)}" in body and "equal greedy_batch's: True" in body
    assert "python -m bench distill-gen --n-prompts 10 --batch 4" in body and "| greedy_batch |" in body
    assert "| generate + teacher pass |" in body and "| greedy_rows (rows kept) |" in body


def test_answers_that_differ_are_counted(tiny_lm):
    rates, answers = distill_gen.measure(tiny_lm, PROMPTS, answer_tokens=6, batch=4, repeats=1)
    answers[distill_gen.ROWS] = answers[distill_gen.ROWS][:-1] + [[0]]
    answers[distill_gen.GENERATE] = [[0]] + answers[distill_gen.GENERATE][1:]
    body = distill_gen.render(rates, answers, argparse.Namespace(n_prompts=10, batch=4, answer_tokens=6, repeats=1))
    assert f"Answers alike: {len(PROMPTS) - 1} of {len(PROMPTS)}" in body and "equal greedy_batch's: False" in body
