"""decoding/train/greedy_batch.py: the distillation's batched greedy answers are each prompt's own greedy
answer. Oracles: one prompt at a time through LM.forward (the engine's path), and transformers' generate
on the same batches; prompts of different lengths share a batch and some rows end at EOS while others
go on. Negative controls: positions that ignore the left padding, and a cache that keeps the wrong rows
when a finished row leaves, must each fail the first oracle. The LM-head inputs and soft labels kept from
the decoding steps equal a teacher-forced pass over prompt + answer; control: the rows one step late."""
from __future__ import annotations

import pytest
import torch
from batch_support import PROMPTS
from conftest import make_tiny_llama

from decoding.runtime.models import LM
from decoding.train import data, greedy_batch
from decoding.train.greedy_batch import greedy_answers

N = 14


def one_at_a_time(lm, prompt, n=N):
    """Plain greedy decoding of one prompt through LM.forward and its KV cache."""
    cache, out, feed = lm.new_cache(), [], list(prompt)
    for _ in range(n):
        token = int(lm.forward(feed, cache, logits_to_keep=1)[-1].argmax())
        out.append(token)
        if token in lm.eos_ids:
            break
        feed = [token]
    return out


@pytest.fixture(scope="module")
def lm():
    """A tiny llama whose answers depend on the context and on positions, whose EOS ends some answers
    early and not others. A random init attends almost uniformly (blind to positions) and, with the
    embedding tied to the LM head, repeats the last token: the head gets weights of its own and the
    query and key projections are scaled up."""
    tiny = make_tiny_llama(seed=0)
    head = torch.randn(tiny.lm_head.weight.shape, generator=torch.Generator().manual_seed(0))
    tiny.lm_head.weight = torch.nn.Parameter(head.to(tiny.lm_head.weight))
    with torch.no_grad():
        for name, param in tiny.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                param.mul_(10.0)
    model = LM(tiny, tokenizer=None, name="tiny-eos")
    model.eos_ids = frozenset()
    free = [one_at_a_time(model, p) for p in PROMPTS]
    assert sum(len(set(a)) >= 4 for a in free) >= len(PROMPTS) // 2
    for token in range(model.vocab_size):
        ends = [a.index(token) for a in free if token in a[:-1]]
        if len(set(ends)) >= 2 and len(ends) <= len(PROMPTS) - 2:
            model.eos_ids = frozenset({token})
            return model
    raise AssertionError("no token ends some answers early and not others")


@pytest.mark.slow
def test_each_answer_is_its_prompts_own_greedy_answer(lm):
    expected = [one_at_a_time(lm, p) for p in PROMPTS]
    lengths = {len(a) for a in expected}
    assert len(lengths) >= 3 and N in lengths                  # rows leave the batch at different steps
    for batch_size in (1, 3, len(PROMPTS)):
        assert greedy_answers(lm, PROMPTS, N, batch_size) == expected


def test_same_tokens_as_transformers_generate(lm):
    answers = greedy_answers(lm, PROMPTS, N, batch_size=4)
    for b0 in range(0, len(PROMPTS), 4):
        ids, mask = greedy_batch.left_pad(PROMPTS[b0:b0 + 4], greedy_batch.pad_id(lm))
        out = data._generate(lm, ids, mask, N, temperature=0.0, seed=0)
        for i, n in enumerate(data._answer_lengths(out, lm.eos_ids)):
            assert out[i, :n].tolist() == answers[b0 + i]


def test_control_positions_that_ignore_the_padding_fail(lm, monkeypatch):
    expected = [one_at_a_time(lm, p) for p in PROMPTS]
    monkeypatch.setattr(greedy_batch, "positions_of",
                        lambda mask: torch.arange(mask.shape[1]).expand_as(mask).clone())
    assert greedy_answers(lm, PROMPTS, N, batch_size=len(PROMPTS)) != expected


def test_control_a_cache_that_keeps_the_wrong_rows_fails(lm, monkeypatch):
    expected = [one_at_a_time(lm, p) for p in PROMPTS]
    fresh = lm.new_cache

    def wrong_rows_cache():
        cache = fresh()
        keep = cache.batch_select_indices
        cache.batch_select_indices = lambda rows: keep(rows.flip(0))
        return cache

    monkeypatch.setattr(lm, "new_cache", wrong_rows_cache)
    assert greedy_answers(lm, PROMPTS, N, batch_size=len(PROMPTS)) != expected


@pytest.mark.slow
def test_real_model_answers_equal_plain_greedy(real_lm):
    texts = ["Explain gravity in one sentence.", "Write a haiku about tea.", "What is 12 times 7?",
             "List three colours of the rainbow, then say which one you like best and why."]
    prompts = [real_lm.encode(t) for t in texts]
    answers = greedy_answers(real_lm, prompts, 20, batch_size=4)
    for prompt, answer in zip(prompts, answers):
        assert answer == one_at_a_time(real_lm, prompt, 20)


def teacher_rows(lm, answers, soft_k=4):
    """The oracle for the kept rows: one teacher-forced pass over every prompt + its answer at a time."""
    return data._teacher_rows(lm, PROMPTS, answers, 1, soft_k, progress=False)


def test_kept_rows_equal_a_teacher_forced_pass(lm):
    answers = greedy_answers(lm, PROMPTS, N, batch_size=len(PROMPTS))
    tokens, hidden, soft_ids, soft_probs = teacher_rows(lm, answers)
    for batch_size in (1, 4):
        rows = greedy_batch.greedy_rows(lm, PROMPTS, N, batch_size, soft_k=4)
        assert [r.tokens for r in rows] == answers
        kept = greedy_batch.stacked(rows)
        assert torch.equal(kept[0], tokens) and kept[1].shape == hidden.shape
        assert torch.allclose(kept[1].float(), hidden.float(), atol=2e-3, rtol=2e-3)
        assert torch.equal(kept[2], soft_ids)
        assert torch.allclose(kept[3].float(), soft_probs.float(), atol=1e-3)


def test_control_rows_one_step_late_fail(lm):
    """The state after the chosen token instead of the one that chose it: the oracle must notice."""
    answers = greedy_answers(lm, PROMPTS, N, batch_size=len(PROMPTS))
    _, hidden, soft_ids, _ = teacher_rows(lm, answers)
    rows = greedy_batch.greedy_rows(lm, PROMPTS, N, len(PROMPTS), soft_k=4)
    late = torch.cat([torch.cat([r.hidden[1:], r.hidden[-1:]]) for r in rows])
    late_ids = torch.cat([torch.cat([r.soft_ids[1:], r.soft_ids[-1:]]) for r in rows])
    assert not torch.allclose(late.float(), hidden.float(), atol=2e-3, rtol=2e-3)
    assert not torch.equal(late_ids, soft_ids)
