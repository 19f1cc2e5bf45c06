"""The engine on the embedded SmolLM2-135M-Instruct: greedy equals transformers' generate token for
token; token pieces keep partial UTF-8 bytes visible."""
import pytest
import torch

from decoding import runner
from decoding.core.config import GreedyConfig

pytestmark = pytest.mark.real

PROMPTS = [
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that reverses a string.",
    "List three facts about the Moon.",
    "请用一句话介绍长城。",
]


def _top2_gap(lm, ids) -> float:
    with torch.inference_mode():
        logits = lm.model(torch.tensor([ids])).logits[0, -1]
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_token_identical_to_generate(real_lm, prompt):
    ids = real_lm.encode(prompt)
    ours = runner.run(real_lm, ids, GreedyConfig(max_new_tokens=64, top_n=2)).output_ids
    with torch.inference_mode():
        out = real_lm.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=64)
    theirs = tuple(out[0, len(ids):].tolist())
    if ours != theirs:
        k = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
        gap = _top2_gap(real_lm, list(ids) + list(ours[:k]))
        pytest.fail(f"diverged at new token {k}: ours {ours[k]} vs generate {theirs[k]}; "
                    f"top-2 logit gap there {gap:.3g} (only a numerical tie, gap ~1e-5, is acceptable)")
    assert len(ours) > 0


def test_greedy_negative_control_detects_a_difference(real_lm):
    """The comparison above bites: a run forced to the 2nd candidate at one step differs."""
    ids = real_lm.encode(PROMPTS[0])
    plain = runner.run(real_lm, ids, GreedyConfig(max_new_tokens=8, top_n=2))
    second = plain.steps[3].raw_top[1].token_id
    branched = runner.run(real_lm, ids, GreedyConfig(max_new_tokens=8),
                          forced=list(plain.output_ids[:3]) + [second])
    assert branched.output_ids != plain.output_ids


def test_partial_utf8_pieces_shown_as_bytes(real_lm):
    ids = real_lm.encode("你好，世界", chat_template=False)
    pieces = [real_lm.piece(i) for i in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert any(p.startswith("<0x") for p in pieces), pieces
    assert real_lm.decode(ids) == "你好，世界"
