"""Helpers for the speculative tests: peaked tiny llamas (random ones are nearly uniform) and a
divergence report that shows the top-2 logit gap."""
from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_llama

from decoding.runtime.models import LM


def peaked_llama(seed: int, vocab_size: int = 16, scale: float = 8.0, eos_token_id: int | None = None):
    """A tiny random llama whose weight matrices are scaled up so its next-token distributions are
    peaked (max prob ~0.2-0.7) and two seeds disagree often (acceptance ~0.5)."""
    model = make_tiny_llama(vocab_size=vocab_size, seed=seed, eos_token_id=eos_token_id)
    # transformers' assistant infers its attention mask from pad_token_id (its kwargs carry none), so
    # a real token equal to the pad id would be masked out of the draft's context: use no pad id.
    model.generation_config.pad_token_id = eos_token_id
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.mul_(scale)
    return model


def peaked_lm(seed: int, **kwargs) -> LM:
    return LM(peaked_llama(seed, **kwargs), tokenizer=None, name=f"peaked{seed}")


def divergence(lm: LM, prompt_ids, expected, got) -> str:
    """Empty if equal; else where the outputs part and the target's top-2 logit gap there."""
    expected, got = list(expected), list(got)
    if expected == got:
        return ""
    k = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    logits = lm.forward(list(prompt_ids) + expected[:k], lm.new_cache())[-1]  # (V,)
    top = torch.topk(logits, 2)
    gap = float(top.values[0] - top.values[1])
    return (f"outputs differ at new token {k} (lengths {len(expected)}/{len(got)}): expected "
            f"{expected[k:k + 3]} got {got[k:k + 3]}; target top-2 {top.indices.tolist()} logit gap {gap:.3g}")


def heldout_prompts(n: int) -> list[str]:
    """Prompts of the shipped drafters' training distribution that training held out (decoding.train.parallel's
    split of distill_prompts(1024, seed 0))."""
    from decoding.train.data import distill_prompts, split_sequences

    texts = distill_prompts(1024, 0)
    return [texts[i] for i in split_sequences(1024, 16)[1][:n]]


PROMPTS = ([1, 2, 3, 4, 5, 1, 2, 3], [7, 7, 7, 7], [9, 3, 12, 5, 9, 3, 12, 5, 9, 3], [0, 15, 2])


N = 24


@pytest.fixture(scope="module")
def target():
    return peaked_lm(0, eos_token_id=None)


@pytest.fixture(scope="module")
def draft():
    return peaked_lm(1, eos_token_id=None)


def hf_generate(target_model, ids, **kwargs) -> tuple[list[int], int]:
    """transformers' generate on a batch of one; returns (new ids, target forwards counted by a hook)."""
    x = torch.tensor([ids], device=target_model.device)  # (1, T)
    counter = ForwardCounter(target_model)
    try:
        out = target_model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, **kwargs)
    finally:
        counter.close()
    return out[0, len(ids):].tolist(), counter.calls


def constant_assistant(draft_model, gamma: int):
    gc = draft_model.generation_config
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = gamma, "constant"
    gc.assistant_confidence_threshold = 0.0
    return draft_model


class ForwardCounter:
    def __init__(self, model):
        self.calls = 0
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, *_args):
        self.calls += 1

    def close(self):
        self.handle.remove()
