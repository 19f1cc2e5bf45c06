"""The target's greedy answers to many prompts, batched for distillation. Prompts of similar length share
a batch (sorted by length: little padding), only the last position's logits are computed, and a row that
reached EOS leaves the batch with its cache rows, so the remaining rows' steps cost less. Each answer is
the one plain greedy decoding of its prompt gives (tests/test_greedy_batch.py), up to the rounding of
batched arithmetic on near-ties."""
from __future__ import annotations

from collections.abc import Sequence

import torch


def greedy_answers(lm, prompts: Sequence[Sequence[int]], answer_tokens: int, batch_size: int,
                   progress: bool = False) -> list[list[int]]:
    """Per prompt (in the given order) its greedy answer: up to `answer_tokens` tokens, ending at the
    first EOS (included) when one comes sooner."""
    from tqdm import tqdm

    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    answers: list[list[int]] = [[] for _ in prompts]
    for chunk in tqdm(chunks, desc="answers", unit="batch", disable=not progress):
        for i, answer in zip(chunk, _greedy_batch(lm, [list(prompts[i]) for i in chunk], answer_tokens)):
            answers[i] = answer
    return answers


def pad_id(lm) -> int:
    """The token that pads a batch (left of prompts, right of answers): the smallest EOS id, else 0."""
    return min(lm.eos_ids) if lm.eos_ids else 0


def positions_of(mask: torch.Tensor) -> torch.Tensor:
    """(B, L) position ids of a left-padded batch: 0 at each row's first real token (padding: 0)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def left_pad(batch: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)          # (B, L)
    mask = torch.zeros((len(batch), width), dtype=torch.long)             # (B, L)
    for i, p in enumerate(batch):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids, mask


@torch.inference_mode()
def _greedy_batch(lm, prompts: list[list[int]], answer_tokens: int) -> list[list[int]]:
    eos = set(lm.eos_ids)
    ids, mask = left_pad(prompts, pad_id(lm))
    cache = lm.new_cache()
    logits = _last_logits(lm, ids, mask, positions_of(mask), cache)       # (B, V)
    answers: list[list[int]] = [[] for _ in prompts]
    live = torch.arange(len(prompts))                                      # batch row -> prompt
    for step in range(answer_tokens):
        chosen = logits.argmax(-1).cpu()                                   # (b,)
        ended = []
        for row, token in enumerate(chosen.tolist()):
            answers[int(live[row])].append(token)
            ended.append(token in eos)
        if step == answer_tokens - 1 or all(ended):
            break
        keep = torch.tensor([not e for e in ended])
        if not bool(keep.all()):
            rows = keep.nonzero().squeeze(1)
            cache.batch_select_indices(rows.to(lm.device))
            live, mask, chosen = live[rows], mask[rows], chosen[rows]
        mask = torch.cat([mask, torch.ones((len(live), 1), dtype=mask.dtype)], 1)   # (b, L + step + 1)
        logits = _last_logits(lm, chosen[:, None], mask, mask.sum(-1, keepdim=True) - 1, cache)
    return answers


def _last_logits(lm, ids, mask, positions, cache) -> torch.Tensor:
    """The next token's logits (B, V) after `ids` (B, T), which follow what `cache` holds."""
    out = lm.model(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device),
                   position_ids=positions.to(lm.device), **{lm.cache_kw: cache}, use_cache=True,
                   logits_to_keep=1)
    return out.logits[:, -1]
