"""decoding/train/answer_store.py: the target's answers as a compact file, and distillation that reads them
instead of generating: same tokens and offsets, the same hidden states and soft labels up to float16, no
call to generate; answers to other prompts are not used (negative control: generation is asked for); a
shipped file is found before the cache's."""
from __future__ import annotations

import pytest
import torch

from decoding.train import answer_store, data
from decoding.train.answer_store import AnswerSet

PROMPTS = [[5, 9, 2, 7], [11, 3], [8, 8, 1, 4, 6], [2], [30, 31, 32]]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))
    monkeypatch.setattr(answer_store, "SHIPPED", tmp_path / "shipped")
    return tmp_path


@pytest.mark.parametrize("top", [60_000, 100_000])          # uint16, then uint32
def test_round_trip(tmp_path, top):
    answers = AnswerSet(((1, 2, 3), (top,)), ((4, 5), (top - 1, 0, 7)), {"model": "m", "seconds": 1.5})
    path = tmp_path / "a.npz"
    answers.save(path)
    assert AnswerSet.load(path) == answers


def generate(lm, prompts=PROMPTS):
    return data.generate_distill(lm, prompts, answer_tokens=12, batch_size=2, soft_k=4, progress=False)


def test_stored_answers_replace_generation(tiny_lm, cache, monkeypatch):
    fresh = generate(tiny_lm)
    assert fresh.info["answers"] == "generated"
    key = data.distill_key(tiny_lm, PROMPTS, 12, 0.0, 4, 0)
    stored = cache / "distill" / answer_store.file_name(key)
    assert AnswerSet.load(stored).answers == tuple(tuple(fresh.answer(s)) for s in range(len(PROMPTS)))
    (cache / "distill" / f"{key}.pt").unlink()                    # a new machine: only the answers file

    def no_generation(*args, **kwargs):
        raise AssertionError("generate was called")

    monkeypatch.setattr(data, "_answers", no_generation)
    again = generate(tiny_lm)
    assert again.info["answers"] == f"stored ({stored.name})"
    assert torch.equal(again.tokens, fresh.tokens) and torch.equal(again.offsets, fresh.offsets)
    assert torch.allclose(again.hidden.float(), fresh.hidden.float(), atol=2e-3)
    assert (again.soft_ids == fresh.soft_ids).float().mean() > 0.99
    with pytest.raises(AssertionError, match="generate was called"):              # other prompts: generate
        generate(tiny_lm, PROMPTS[:4] + [[30, 31, 33]])


def test_a_shipped_file_comes_first(cache):
    key = "0123456789abcdef"
    cached = AnswerSet(((1,),), ((2,),), {"model": "m"})
    shipped = AnswerSet(((1,),), ((3,),), {"model": "m"})
    cached.save(cache / "distill" / answer_store.file_name(key))
    assert answer_store.load_matching(key, [[1]]).answers == ((2,),)
    shipped.save(cache / "shipped" / answer_store.file_name(key))
    assert answer_store.load_matching(key, [[1]]).answers == ((3,),)
    assert answer_store.load_matching(key, [[4]]) is None


@pytest.mark.slow
def test_the_answers_command_ships_each_part(tmp_path, monkeypatch, capsys):
    from bench.tiny_model import build_tiny_model_dir
    from decoding.train.answers_cli import main_answers

    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path / "cache"))
    model = str(build_tiny_model_dir(tmp_path / "tiny"))
    out = tmp_path / "ship"
    flags = ["--model", model, "--n-prompts", "6", "--n-varied", "3", "--n-extra", "2", "--answer-tokens", "6",
             "--heldout-every", "3", "--no-progress", "--out", str(out)]
    assert main_answers(flags) == 0
    shipped = sorted(out.glob("answers-*.npz"))
    assert len(shipped) == 3 and f"answers in {out}" in capsys.readouterr().out
    assert sorted(len(AnswerSet.load(p).prompts) for p in shipped) == [2, 3, 6]
    assert main_answers(["--model", model, "--n-prompts", "0", "--no-progress"]) == 2
    assert "n_prompts=0 is invalid" in capsys.readouterr().err
