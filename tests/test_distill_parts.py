"""The mixed distillation set grows by a part of its own: --n-extra adds the next varied prompts
(disjoint from the first part's) without regenerating the cached parts, and the held-out split of the
grown set keeps the earlier parts' split."""
from __future__ import annotations

import pytest
import torch

from bench.tiny_model import build_tiny_model_dir
from decoding.core.errors import ConfigError
from decoding.runtime.models import ModelSpec, load
from decoding.train.data import data_split, distill_set
from decoding.train.parallel import TrainSettings
from decoding.train.shallow import DraftSettings

SMALL = {"n_prompts": 24, "n_varied": 12, "answer_tokens": 40, "gen_batch": 12, "heldout_every": 4}


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return load(ModelSpec(str(build_tiny_model_dir(tmp_path_factory.mktemp("tiny")))))


@pytest.mark.slow
def test_extra_part_reuses_the_cached_parts_and_holds_new_prompts(lm, tmp_path, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))
    prompts, data, _ = distill_set(lm, TrainSettings(**SMALL, n_extra=0), progress=False)
    cached = sorted((tmp_path / "distill").glob("*.pt"))
    stamps = [p.stat().st_mtime_ns for p in cached]
    assert data.info["parts"] == [24, 12] and len(cached) == 2

    grown_prompts, grown, source = distill_set(lm, TrainSettings(**SMALL, n_extra=6), progress=False)
    after = sorted((tmp_path / "distill").glob("*.pt"))
    assert grown.info["parts"] == [24, 12, 6] and "18 varied prompts" in source
    assert len(after) == 3 and set(cached) < set(after)                  # one new file: the extra part
    assert len(list((tmp_path / "distill").glob("answers-*.npz"))) == 3   # and each part's answers
    assert [p.stat().st_mtime_ns for p in cached] == stamps              # not written again
    assert grown_prompts[:36] == prompts                                   # the first two parts unchanged
    extra = grown_prompts[36:]
    assert len({tuple(p) for p in extra}) == 6 and not {tuple(p) for p in extra} & {tuple(p) for p in prompts}
    n = int(data.offsets[-1])
    assert grown.tokens[:n].tolist() == data.tokens[:n].tolist()
    train, held = data_split(data, 4)
    grown_train, grown_held = data_split(grown, 4)
    assert grown_held[:len(held)] == held and grown_train[:len(train)] == train
    assert [s for s in grown_held if s >= 36] == [36 + 3]                 # every 4th prompt of the extra part

    # the shallow draft's trainer reads the same grown set from the same cache
    shallow_prompts, shallow, _ = distill_set(lm, DraftSettings(**SMALL, n_extra=6), progress=False)
    assert shallow_prompts == grown_prompts and shallow.tokens.tolist() == grown.tokens.tolist()
    assert sorted((tmp_path / "distill").glob("*.pt")) == after


@pytest.mark.parametrize("settings_type", [TrainSettings, DraftSettings])
def test_negative_extra_names_the_parameter(settings_type):
    with pytest.raises(ConfigError, match="n_extra=-1"):
        settings_type(n_extra=-1)


@pytest.fixture(scope="module")
def talking_lm(tmp_path_factory):
    """The tiny model with an LM head of its own: a random init tied to the embedding answers with
    whitespace only, which leaves no assistant turn to follow up on."""
    model = load(ModelSpec(str(build_tiny_model_dir(tmp_path_factory.mktemp("talking")))))
    head = torch.randn(model.model.lm_head.weight.shape, generator=torch.Generator().manual_seed(0))
    model.model.lm_head.weight = torch.nn.Parameter(head.to(model.model.lm_head.weight))
    return model


@pytest.mark.slow
def test_follow_up_part_holds_conversations_on_training_answers(talking_lm, tmp_path, monkeypatch):
    from decoding.train.prompt_pool import _CODE_FOLLOW_UPS, _FOLLOW_UPS

    lm = talking_lm
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))
    base, base_data, _ = distill_set(lm, TrainSettings(**SMALL, n_extra=6), progress=False)
    prompts, data, source = distill_set(lm, TrainSettings(**SMALL, n_extra=6, n_follow_up=7), progress=False)
    assert data.info["parts"] == [24, 12, 6, 7] and "7 follow-up conversations" in source
    assert prompts[:42] == base and data.tokens[:len(base_data.tokens)].tolist() == base_data.tokens.tolist()
    train, held = data_split(base_data, 4)
    texts = [lm.decode(p) for p in base]
    seen = set()
    for prompt in prompts[42:]:
        chat = lm.decode(prompt)
        assert chat.count("<|im_start|>user") == 2 and chat.endswith("<|im_start|>assistant\n")
        asked = [s for s in range(42) if texts[s].removesuffix("<|im_start|>assistant\n") in chat]
        assert len(asked) == 1 and asked[0] in train                        # one training prompt, never held out
        answer = lm.decode([t for t in base_data.answer(asked[0]) if t not in lm.eos_ids]).strip()
        assert answer in chat and any(r in chat for r in _FOLLOW_UPS + _CODE_FOLLOW_UPS)
        seen.add(asked[0])
    assert len(seen) == 7                                                   # first round: each chat once
    grown = distill_set(lm, TrainSettings(**SMALL, n_extra=6, n_follow_up=9), progress=False)[0]
    assert grown[:49] == prompts


@pytest.mark.slow
def test_too_many_follow_ups_names_the_parameter(lm, tmp_path, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match="n_follow_up=100000"):
        distill_set(lm, TrainSettings(**SMALL, n_extra=0, n_follow_up=100000), progress=False)
    with pytest.raises(ConfigError, match="n_follow_up=-2"):
        TrainSettings(n_follow_up=-2)


def test_encode_chat_takes_turns_in_order(lm):
    one = lm.encode("Why is the sea salty?")
    assert lm.encode_chat(["Why is the sea salty?"]) == one
    chat = lm.decode(lm.encode_chat(["Why is the sea salty?", "Rivers carry salts.", "Say more."]))
    assert chat.index("Why is the sea salty?") < chat.index("Rivers carry salts.") < chat.index("Say more.")
    assert "<|im_start|>assistant\nRivers carry salts.<|im_end|>" in chat
    with pytest.raises(ConfigError, match="turns=2"):
        lm.encode_chat(["Why is the sea salty?", "Rivers carry salts."])
    with pytest.raises(ConfigError, match="prompt="):
        lm.encode_chat(["Why is the sea salty?", "  ", "Say more."])
