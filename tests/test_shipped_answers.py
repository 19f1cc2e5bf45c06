"""The answers shipped in assets/distill/ are the parts of the largest distillation set the project ships
(three first parts and seven of follow-up conversations), at least 3× the first parts' positions: walking
that set part by part on the embedded model (prompts rebuilt from the templates, the passages and the
conversations, each from the parts before), every part's key and prompts find their shipped file, so a
new machine generates no answer. Negative control: another seed asks for answers nobody shipped. A change
to a template, a follow-up request or the chat template fails here instead of silently regenerating."""
from __future__ import annotations

import pytest
import torch

from decoding.train import answer_store, data
from decoding.train.data import DataSettings, DistillData, distill_set

SHIPPED_SET = {"n_follow_up": 7168}     # `python -m decoding train answers --n-follow-up 7168` ships it
FIRST_PARTS = 3 * 1024                  # the templated, varied and extra prompts before the follow-ups


class NotShipped(AssertionError):
    pass


def from_shipped_answers(lm, prompts, *, answer_tokens, temperature, soft_k, seed, **_):
    """generate_distill from the shipped answers file alone (tokens and offsets; no rows)."""
    key = data.distill_key(lm, prompts, answer_tokens, temperature, soft_k, seed)
    stored = answer_store.load_matching(key, prompts)
    if stored is None or not str(answer_store.find(key)).startswith(str(answer_store.SHIPPED)):
        raise NotShipped(key)
    lengths = [len(a) for a in stored.answers]
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.tensor(lengths).cumsum(0)])
    tokens = torch.tensor([t for a in stored.answers for t in a], dtype=torch.long)
    return DistillData(tokens, torch.empty(0), torch.empty(0), torch.empty(0), offsets,
                       {"key": key, "prompts": len(prompts)})


@pytest.mark.slow
def test_every_part_of_the_shipped_set_is_shipped(real_lm, monkeypatch):
    monkeypatch.setattr(data, "generate_distill", from_shipped_answers)
    prompts, walked, _ = distill_set(real_lm, DataSettings(**SHIPPED_SET), progress=False)
    shipped = {p.name for p in answer_store.SHIPPED.glob("answers-*.npz")}
    assert {answer_store.file_name(k) for k in walked.info["keys"]} == shipped
    assert len(prompts) == FIRST_PARTS + SHIPPED_SET["n_follow_up"] == len(walked.offsets) - 1
    positions, first = int(walked.offsets[-1]), int(walked.offsets[FIRST_PARTS])
    assert positions >= 3 * first, f"{positions} answer positions, {positions / first:.2f}x the first parts'"


@pytest.mark.slow                      # loads the embedded model
def test_control_another_seed_is_not_shipped(real_lm, monkeypatch):
    monkeypatch.setattr(data, "generate_distill", from_shipped_answers)
    with pytest.raises(NotShipped):
        distill_set(real_lm, DataSettings(**SHIPPED_SET, seed=1), progress=False)

