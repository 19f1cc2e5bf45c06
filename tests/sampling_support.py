"""The χ² check of dspark's sampling: exact marginals of the processed target against many seeded runs."""
from __future__ import annotations

import torch
from scipy.stats import chisquare

from decoding.core.config import DSparkConfig
from decoding.core.processors import build_pipeline
from decoding.runner import run

PROMPT = [3, 1, 4, 1, 5]


VOCAB = 12


RUNS = 1000


PROCESSING = {"temperature": 0.8, "top_p": 0.95}


@torch.inference_mode()
def exact_marginals(lm, depth: int) -> list[torch.Tensor]:
    """P(t_1), P(t_2), ... under the processed target, by enumerating every prefix (batched)."""
    pipeline = build_pipeline(**PROCESSING)
    seqs = torch.tensor([PROMPT], device=lm.device)                                   # (S, L)
    weights = torch.ones(1, dtype=torch.float64, device=lm.device)  # (S,)
    out = []
    for _ in range(depth):
        logits = lm.model(input_ids=seqs).logits[:, -1].float()     # (S, V)
        probs = torch.softmax(pipeline(logits), -1).double()        # (S, V)
        joint = weights[:, None] * probs                            # (S, V)
        out.append(joint.sum(0).cpu())
        seqs = torch.cat([seqs.repeat_interleave(VOCAB, 0),
                          torch.arange(VOCAB, device=lm.device).repeat(len(seqs))[:, None]], 1)
        weights = joint.flatten()
    return out


def pvalues(lm, loaded, memory=lambda: None, **kwargs) -> list[float]:
    """χ² p-values of the first three tokens over RUNS seeds; `loaded`: a drafter object (None: the config's);
    `memory()` gives each seed's run the memory it starts from (None: an empty one)."""
    counts = torch.zeros(3, VOCAB)
    for seed in range(RUNS):
        config = DSparkConfig(max_new_tokens=3, gamma=2, seed=seed, **PROCESSING, **kwargs)
        ids = run(lm, PROMPT, config, drafter=loaded, memory=memory()).output_ids
        for i, t in enumerate(ids[:3]):
            counts[i, t] += 1
    out = []
    for i, p in enumerate(exact_marginals(lm, 3)):
        expected = p * RUNS
        big = expected >= 5
        obs = torch.cat([counts[i][big], counts[i][~big].sum()[None]]).double()
        exp = torch.cat([expected[big], expected[~big].sum()[None]])
        keep = exp > 0
        out.append(float(chisquare(obs[keep], exp[keep] * obs.sum() / exp[keep].sum()).pvalue))
    return out
