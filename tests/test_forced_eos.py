"""A forced EOS ends the answer under every strategy: the output is the forced tokens up to and
including the first EOS, and nothing follows (negative control: without the EOS the run goes on). Beam
search then takes one step without a forward."""
from __future__ import annotations

import pytest
from conftest import make_tiny_llama

from decoding.core.config import BeamConfig, DSparkConfig, GreedyConfig, SampleConfig, SpeculativeConfig
from decoding.runner import run, strategy_for, until_eos
from decoding.runtime.models import LM

PROMPT = [3, 4, 5, 3, 4, 5, 3]
EOS = 5


@pytest.fixture(scope="module")
def lm():
    return LM(make_tiny_llama(eos_token_id=EOS), tokenizer=None, name="tiny-eos")


def _configs(lm):
    from dspark_helpers import random_drafter

    draft = LM(make_tiny_llama(seed=7, eos_token_id=EOS), tokenizer=None, name="tiny-draft")
    return {
        "greedy": (GreedyConfig(max_new_tokens=8), {}),
        "sample": (SampleConfig(max_new_tokens=8, temperature=1.0, seed=3), {}),
        "beam": (BeamConfig(max_new_tokens=8, num_beams=3), {}),
        "speculative": (SpeculativeConfig(draft="lookup", max_new_tokens=8, gamma=3, temperature=1.0, seed=2),
                        {"drafter": draft}),
        "dspark": (DSparkConfig(max_new_tokens=8, gamma=3), {"drafter": random_drafter(lm, gamma_max=3, seed=1)}),
    }


def _output(lm, config, kwargs, forced):
    trace = run(lm, PROMPT, config, forced=forced, **kwargs)
    assert trace.error is None, trace.error
    assert list(trace.output_ids) == strategy_for(config).output_ids(trace.steps)
    return list(trace.output_ids)


@pytest.mark.parametrize("name", ["greedy", "sample", "beam", "speculative", "dspark"])
def test_a_forced_eos_ends_the_answer(lm, name):
    config, kwargs = _configs(lm)[name]
    assert _output(lm, config, kwargs, [7, EOS, 9, 9]) == [7, EOS]
    free = _output(lm, config, kwargs, [7, 8])                     # negative control: no EOS, the run goes on
    assert free[:2] == [7, 8] and len(free) > 2


def test_until_eos_cuts_after_the_first_eos():
    assert until_eos([1, 5, 2, 5], {5}) == [1, 5]
    assert until_eos([1, 2], {5}) == [1, 2] and until_eos([], {5}) == []


def test_beam_with_a_forced_eos_is_one_step_without_a_forward(lm):
    trace = run(lm, PROMPT, BeamConfig(max_new_tokens=3, num_beams=2), forced=[7, EOS])
    assert list(trace.output_ids) == [7, EOS] and trace.stats.target_forwards == 0
    assert len(trace.steps) == 1 and trace.steps[0].done and not trace.steps[0].pool
