"""dspark on the embedded SmolLM2-135M with an untrained drafter: token-identical to plain greedy
(chain and tree). A divergence reports the target's top-2 logit gap at the first differing token
(only a numerical tie may explain one)."""
from __future__ import annotations

import pytest
import torch

from decoding.config import DSparkConfig, GreedyConfig
from decoding.parallel import DrafterShape, ParallelDrafter
from decoding.runner import run

pytestmark = pytest.mark.real
N = 32


def top2_gap(lm, prompt, out, at: int) -> float:
    logits = lm.forward(list(prompt) + list(out[:at]), lm.new_cache())[-1]  # (V,)
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def test_untrained_drafter_equals_greedy(real_lm, select="tree", k=3, budget=8):
    hidden = real_lm.model.config.hidden_size
    drafter = ParallelDrafter(DrafterShape(hidden, real_lm.vocab_size, gamma_max=8, rank=16, trunk=64, width=64),
                              vocab_ids=range(8000)).attach(real_lm).eval()
    prompt = real_lm.encode("Name three colours of the rainbow.")
    ref = run(real_lm, prompt, GreedyConfig(max_new_tokens=N)).output_ids
    tr = run(real_lm, prompt, DSparkConfig(max_new_tokens=N, gamma=6, top_k_candidates=k, select=select,
                                           budget=budget), drafter=drafter)
    assert tr.error is None
    if tr.output_ids != ref:
        at = next(i for i, (a, b) in enumerate(zip(tr.output_ids, ref)) if a != b)
        pytest.fail(f"diverged at token {at}; target top-2 logit gap there {top2_gap(real_lm, prompt, ref, at):.3g}")
    assert tr.stats.target_forwards == len(tr.steps)
