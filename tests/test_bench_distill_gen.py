"""bench/distill_gen.py: both contenders write every prompt's answer, the table reports their rates and
how many answers agree (all of them on a tiny model, where no near-tie parts them)."""
from __future__ import annotations

import argparse

from test_greedy_batch import PROMPTS

from bench import distill_gen


def test_both_contenders_answer_alike_and_the_table_says_so(tiny_lm):
    rates, theirs, ours = distill_gen.measure(tiny_lm, PROMPTS, answer_tokens=6, batch=4, repeats=2)
    assert theirs == ours and len(ours) == len(PROMPTS) and all(len(a) == 6 for a in ours)
    assert all(len(r) == 2 and min(r) > 0 for r in rates.values())
    args = argparse.Namespace(n_prompts=len(PROMPTS), batch=4, answer_tokens=6, repeats=2)
    body = distill_gen.render(rates, theirs, ours, args)
    assert f"Answers alike: {len(PROMPTS)} of {len(PROMPTS)}" in body
    assert "python -m bench distill-gen --n-prompts 10 --batch 4" in body and "| greedy_batch |" in body
