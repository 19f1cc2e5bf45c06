"""The varied distillation prompt pool and the mixed (templated + varied) data: prompts are distinct,
drawn evenly from the families, reproducible, free of the benchmark prompts; passages are cut at a
sentence end; concatenated data keeps each sequence's rows; the held-out split of a mixed set keeps the
templated part's split and holds out every k-th varied prompt."""
from __future__ import annotations

import random

import pytest
import torch

from bench.prompts import PROMPTS, SUMMARY_SOURCE
from decoding.core.errors import ConfigError
from decoding.train.data import DistillData, data_split, split_parts, split_sequences
from decoding.train.parallel import TrainSettings
from decoding.train.prompt_pool import (
    _CODE_FOLLOW_UPS,
    _FOLLOW_UPS,
    FAMILIES,
    _family,
    follow_up_chats,
    more_varied_prompts,
    passage,
    varied_prompts,
)

TEXTS = [f"Passage {i}: the river rises in spring and falls in autumn. Farmers plan around it every year. "
         f"Boats carry grain downstream when the water is high enough." for i in range(40)]


def family_of(prompt: str) -> str:
    for name in FAMILIES:
        if prompt in _family(name, TEXTS, random.Random(0)) or (
                name == "text" and any(t in prompt for t in TEXTS)):
            return name
    raise AssertionError(prompt)


@pytest.mark.slow
def test_prompts_are_distinct_reproducible_and_balanced():
    prompts = varied_prompts(120, TEXTS, seed=3)
    assert len(prompts) == len(set(prompts)) == 120
    assert prompts == varied_prompts(120, TEXTS, seed=3)
    assert prompts != varied_prompts(120, TEXTS, seed=4)
    counts = {name: sum(family_of(p) == name for p in prompts) for name in FAMILIES}
    assert counts == dict.fromkeys(FAMILIES, 30), counts


def test_each_text_prompt_has_its_own_passage():
    prompts = [p for p in varied_prompts(160, TEXTS, seed=0) if any(t in p for t in TEXTS)]
    used = [t for p in prompts for t in TEXTS if t in p]
    assert len(used) == len(set(used)) == len(TEXTS)


def test_a_family_that_runs_out_leaves_its_turn_to_the_others():
    prompts = varied_prompts(200, TEXTS[:5], seed=0)
    assert sum(any(t in p for t in TEXTS[:5]) for p in prompts) == 5
    assert len(set(prompts)) == 200


def test_no_benchmark_prompt_or_task_in_the_pool():
    everything = [p for name in FAMILIES for p in _family(name, [SUMMARY_SOURCE], random.Random(0))
                  if SUMMARY_SOURCE not in p]
    assert not set(PROMPTS.values()) & set(everything)
    lowered = " ".join(everything).lower()
    for task in ("palindrome", "working from home", "bicycle lanes"):
        assert task not in lowered
    assert any(SUMMARY_SOURCE in p for p in _family("text", [SUMMARY_SOURCE], random.Random(0)))


def test_bad_size_names_the_parameter():
    with pytest.raises(ConfigError, match="n_varied=0"):
        varied_prompts(0, TEXTS)
    with pytest.raises(ConfigError, match="prompt_pool='web'"):
        TrainSettings(prompt_pool="web")


def test_passage_cuts_at_a_sentence_end():
    text = "First sentence here is long enough. " * 20
    cut = passage(text, max_chars=200)
    assert cut.endswith(".") and len(cut) <= 200 and text.startswith(cut)
    assert passage("Too short.") is None
    assert passage("Here is code:\n```python\ndef f(x):\n    return x\n``` and more words " * 5) is None
    assert passage("  spaced\n\nout   words " * 20, max_chars=1000) == " ".join(("spaced out words " * 20).split())


def _data(lengths, start=0):
    n = sum(lengths)
    tokens = torch.arange(start, start + n)
    return DistillData(tokens, tokens[:, None].repeat(1, 3).half(), tokens[:, None].int().repeat(1, 2),
                       torch.ones(n, 2).half(), torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()]),
                       {"seconds": 1.5})


def test_concat_keeps_every_sequence():
    a, b = _data([3, 2]), _data([4, 1, 2], start=100)
    both = DistillData.concat([a, b])
    assert both.info["parts"] == [2, 3] and both.info["prompts"] == 5 and both.info["seconds"] == 3.0
    assert [both.answer(s) for s in range(5)] == [a.answer(0), a.answer(1), b.answer(0), b.answer(1), b.answer(2)]
    assert both.positions == 12 and torch.equal(both.hidden[:, 0].long(), both.tokens)


def test_mixed_split_keeps_the_templated_split_and_holds_out_every_kth_varied_prompt():
    train, held = split_parts([1024, 64], 16)
    old_train, old_held = split_sequences(1024, 16)
    assert [s for s in held if s < 1024] == old_held and [s for s in train if s < 1024] == old_train
    assert [s - 1024 for s in held if s >= 1024] == [15, 31, 47, 63]
    assert sorted(train + held) == list(range(1088))
    assert data_split(_data([1] * 40), 4) == split_sequences(40, 4)
    # negative control: the plain split over the concatenation holds out other varied prompts
    assert [s for s in split_sequences(1088, 16)[1] if s >= 1024] != [s for s in held if s >= 1024]


def test_more_prompts_are_new_and_complete_the_grown_pool():
    first = varied_prompts(60, TEXTS, seed=2)
    more = more_varied_prompts(50, 60, TEXTS, seed=2)
    assert len(more) == len(set(more)) == 50
    assert not set(first) & set(more)
    assert set(first) | set(more) == set(varied_prompts(110, TEXTS, seed=2))
    assert more == more_varied_prompts(50, 60, TEXTS, seed=2)
    # control: a different seed's first part is not what the grown pool started from
    assert set(varied_prompts(60, TEXTS, seed=5)) & set(more)


def test_more_prompts_than_the_pool_holds_names_n_extra():
    total = sum(len(_family(name, TEXTS, random.Random(0))) for name in FAMILIES)
    with pytest.raises(ConfigError, match=f"n_extra={total}"):
        more_varied_prompts(total, 60, TEXTS)
    with pytest.raises(ConfigError, match="n_extra=-1"):
        TrainSettings(n_extra=-1)


CHATS = [(f"Question {i}: how do rivers shape valleys?", f"Answer {i}: slowly, by erosion.") for i in range(12)] + [
    ("Write a Python function that adds two numbers.", "```python\ndef add(a, b):\n    return a + b\n```")]


def test_follow_ups_visit_every_chat_once_per_round():
    convs = follow_up_chats(CHATS, seed=1)
    assert convs == follow_up_chats(CHATS, seed=1) and convs != follow_up_chats(CHATS, seed=2)
    first_round = convs[:len(CHATS)]
    assert sorted(c[:2] for c in first_round) == sorted(CHATS)
    assert len(set(convs)) == len(convs)                                   # no conversation twice
    for chat in CHATS:                                                     # each chat's requests differ
        asked = [c[2] for c in convs if c[:2] == chat]
        assert len(asked) == len(set(asked)) > 1


def test_code_chats_get_code_follow_ups():
    convs = follow_up_chats(CHATS, seed=0)
    code = {c[2] for c in convs if "def add" in c[1]}
    prose = {c[2] for c in convs if "def add" not in c[1]}
    assert code == set(_CODE_FOLLOW_UPS) and prose == set(_FOLLOW_UPS)
    assert not set(_CODE_FOLLOW_UPS) & set(_FOLLOW_UPS)
