"""The target's greedy answers to many prompts, batched for distillation. Prompts of similar length share
a batch (sorted by length: little padding), only the last position's logits are computed, and a row that
reached EOS leaves the batch with its cache rows, so the remaining rows' steps cost less. Each answer is
the one plain greedy decoding of its prompt gives (tests/test_greedy_batch.py), up to the rounding of
batched arithmetic on near-ties. greedy_rows also keeps, from the same steps, the LM-head inputs and top-k
soft labels that distillation needs, so no teacher-forced pass has to compute them again."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from decoding.runtime.hooks import tap_head_input


def greedy_answers(lm, prompts: Sequence[Sequence[int]], answer_tokens: int, batch_size: int,
                   progress: bool = False) -> list[list[int]]:
    """Per prompt (in the given order) its greedy answer: up to `answer_tokens` tokens, ending at the
    first EOS (included) when one comes sooner."""
    return [a.tokens for a in greedy_rows(lm, prompts, answer_tokens, batch_size, soft_k=0, progress=progress)]


@dataclass(frozen=True)
class Answer:
    tokens: list[int]
    hidden: torch.Tensor | None = None      # (n, H) float16: the LM-head input that chose each token
    soft_ids: torch.Tensor | None = None    # (n, k) int32: the target's top-k tokens there
    soft_probs: torch.Tensor | None = None  # (n, k) float16: their probabilities


def greedy_rows(lm, prompts: Sequence[Sequence[int]], answer_tokens: int, batch_size: int, soft_k: int,
                progress: bool = False) -> list[Answer]:
    """greedy_answers, and with soft_k >= 1 what a teacher-forced pass over prompt + answer would give at
    each answer position (LM-head input, top-k soft labels), kept from the decoding steps themselves."""
    from tqdm import tqdm

    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    answers: list[Answer] = [Answer([]) for _ in prompts]
    for chunk in tqdm(chunks, desc="answers", unit="batch", disable=not progress):
        for i, answer in zip(chunk, _greedy_batch(lm, [list(prompts[i]) for i in chunk], answer_tokens, soft_k)):
            answers[i] = answer
    return answers


def stacked(answers: Sequence[Answer]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """All answers' (tokens (N,), hidden (N, H), soft ids (N, k), soft probs (N, k)), answer after answer."""
    return (torch.tensor([t for a in answers for t in a.tokens], dtype=torch.long),
            *(torch.cat([getattr(a, name) for a in answers]) for name in ("hidden", "soft_ids", "soft_probs")))


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
def _greedy_batch(lm, prompts: list[list[int]], answer_tokens: int, soft_k: int) -> list[Answer]:
    eos = set(lm.eos_ids)
    ids, mask = left_pad(prompts, pad_id(lm))
    cache = lm.new_cache()
    rows = _StepRows(len(prompts), soft_k)
    with tap_head_input(lm) as tap:
        logits = _last_logits(lm, ids, mask, positions_of(mask), cache)   # (B, V)
        live = torch.arange(len(prompts))                                  # batch row -> prompt
        for step in range(answer_tokens):
            chosen = logits.argmax(-1).cpu()                               # (b,)
            rows.add(live, chosen, tap, logits)
            ended = [token in eos for token in chosen.tolist()]
            if step == answer_tokens - 1 or all(ended):
                break
            keep = torch.tensor([not e for e in ended])
            if not bool(keep.all()):
                kept = keep.nonzero().squeeze(1)
                cache.batch_select_indices(kept.to(lm.device))
                live, mask, chosen = live[kept], mask[kept], chosen[kept]
            mask = torch.cat([mask, torch.ones((len(live), 1), dtype=mask.dtype)], 1)   # (b, L + step + 1)
            logits = _last_logits(lm, chosen[:, None], mask, mask.sum(-1, keepdim=True) - 1, cache)
    return rows.answers()


class _StepRows:
    """Per prompt: its chosen tokens and, with soft_k >= 1, the step's LM-head input and top-k labels."""

    def __init__(self, n: int, soft_k: int):
        self.soft_k = soft_k
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.parts: list[list[tuple[torch.Tensor, ...]]] = [[] for _ in range(n)]

    def add(self, live: torch.Tensor, chosen: torch.Tensor, tap, logits: torch.Tensor) -> None:
        for row, token in zip(live.tolist(), chosen.tolist()):
            self.tokens[row].append(token)
        if self.soft_k:
            top = torch.topk(torch.softmax(logits.float(), -1), self.soft_k, -1)          # (b, k)
            hidden = tap.hidden[:, -1].half().cpu()                                        # (b, H)
            ids, probs = top.indices.int().cpu(), top.values.half().cpu()
            for b, row in enumerate(live.tolist()):
                self.parts[row].append((hidden[b], ids[b], probs[b]))

    def answers(self) -> list[Answer]:
        if not self.soft_k:
            return [Answer(t) for t in self.tokens]
        return [Answer(t, *(torch.stack(x) for x in zip(*p))) for t, p in zip(self.tokens, self.parts)]


def _last_logits(lm, ids, mask, positions, cache) -> torch.Tensor:
    """The next token's logits (B, V) after `ids` (B, T), which follow what `cache` holds."""
    out = lm.model(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device),
                   position_ids=positions.to(lm.device), **{lm.cache_kw: cache}, use_cache=True,
                   logits_to_keep=1)
    return out.logits[:, -1]
