"""The benchmark prompt sets share no sentence with the drafters' training prompts (the templated pool
and the fixed texts of the varied pool); negative control: a planted training prompt is caught."""
from __future__ import annotations

import re

from bench.prompts import FRESH_PROMPTS, PROMPTS
from decoding.train import data
from decoding.train import prompt_pool as pool


def sentences(text: str) -> set[str]:
    return {s.strip().lower() for s in re.split(r"(?<=[.?!:])\s+", text) if len(s.strip()) >= 12}


def training_sentences() -> set[str]:
    n = len(data._TEMPLATES) * len(data._TOPICS) * len(data._STYLES) + len(data._CODE) * len(data._STYLES)
    texts = data.distill_prompts(n)
    fixed = [str(x) for name in ("_GOALS", "_ADVICE", "_CODE", "_PAIRS", "_TERMS", "_OTHER", "_WRITING")
             for x in getattr(pool, name)]
    return set().union(*(sentences(t) for t in texts + fixed))


def shared(prompts: dict[str, str], known: set[str]) -> dict[str, set[str]]:
    return {name: sentences(text) & known for name, text in prompts.items() if sentences(text) & known}


def test_benchmark_prompts_are_not_training_prompts():
    known = training_sentences()
    assert len(known) > 1000
    assert shared({**PROMPTS, **FRESH_PROMPTS}, known) == {}
    assert len(FRESH_PROMPTS) >= 6


def test_a_planted_training_prompt_is_caught():
    known = training_sentences()
    planted = data.distill_prompts(5)[3]
    assert shared({"planted": planted + " Then stop."}, known) == {"planted": sentences(planted)}
