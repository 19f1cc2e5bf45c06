"""Training and evaluation of an attending feature drafter (decoding.drafters.feature_net, shape.heads > 0).

Each sequence is laid out as the drafter reads a context: index t holds the input pair (f_t, x_{t+1}),
f_t the target's LM-head input at position t, over the prompt (decoding.train.context_rows) and then the
answer (the distillation rows), so T = P − 1 + N pairs for a P-token prompt and an N-token answer. The
prediction at index t is for f_{t+1} and x_{t+2}. Anchors are indices t ≥ P − 1, where drafting can
start (the first answer token comes from the prefill, never from a draft).

decoding.drafters.feature_net.unrolled computes every draft step from every anchor at once, the cache each step
reads included; training uses the true tokens (under greedy verification a draft only counts when every
token before it was the target's) and the net's own features, evaluation its own tokens too.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from decoding.drafters.feature_net import FeatureNet, unrolled
from decoding.train.common import lead_metrics
from decoding.train.data import DistillData
from decoding.train.feature_loss import position_loss


@dataclass(frozen=True)
class Layout:
    """Sequences as input pairs; sequence s is pairs[offsets[s]:offsets[s + 1]], its prompt P = prompt_len[s]."""

    features: torch.Tensor      # (R, H) float16: f_t
    tokens: torch.Tensor        # (R,) long: x_{t+1}
    answer_row: torch.Tensor    # (R,) long: the DistillData row of the token predicted at t (x_{t+2}); −1 none
    offsets: torch.Tensor       # (S + 1,)
    prompt_len: torch.Tensor    # (S,)


def layout(data: DistillData, prompts: Sequence[Sequence[int]], rows: torch.Tensor, row_offsets: torch.Tensor
           ) -> Layout:
    """Pairs for every sequence of `data` (answers to `prompts`, prompt rows from context_rows)."""
    feats, toks, ans, lengths = [], [], [], []
    for s, prompt in enumerate(prompts):
        a0, a1 = int(data.offsets[s]), int(data.offsets[s + 1])
        p_rows = rows[int(row_offsets[s]):int(row_offsets[s + 1])]                  # (P − 1, H)
        feats += [p_rows, data.hidden[a0:a1]]
        toks += [torch.as_tensor(list(prompt[1:]), dtype=torch.long), data.tokens[a0:a1]]
        n, p = a1 - a0, len(prompt)
        # index t predicts x_{t+2}: answer row t + 2 − P, for t = P − 2 .. P + N − 3
        ans.append(torch.cat([torch.full((p - 2,), -1), torch.arange(a0, a1), torch.full((1,), -1)])[:p - 1 + n])
        lengths.append(p - 1 + n)
    offsets = torch.tensor([0] + lengths).cumsum(0)
    return Layout(torch.cat(feats), torch.cat(toks), torch.cat(ans), offsets,
                  torch.tensor([len(p) for p in prompts]))


def subset(lay: Layout, seqs: Sequence[int]) -> Layout:
    spans = [torch.arange(int(lay.offsets[s]), int(lay.offsets[s + 1])) for s in seqs]
    idx = torch.cat(spans)
    offsets = torch.tensor([0] + [len(x) for x in spans]).cumsum(0)
    return Layout(lay.features[idx], lay.tokens[idx], lay.answer_row[idx], offsets, lay.prompt_len[list(seqs)])


@dataclass(frozen=True)
class SeqBatch:
    features: torch.Tensor      # (B, T, H) float32
    tokens: torch.Tensor        # (B, T)
    answer_row: torch.Tensor    # (B, T) −1: no label
    first_anchor: torch.Tensor  # (B,) P − 1
    base: int                   # indices computed: ≥ base (the smallest first anchor)


def seq_batch(lay: Layout, seqs: Sequence[int]) -> SeqBatch:
    spans = [(int(lay.offsets[s]), int(lay.offsets[s + 1])) for s in seqs]
    width = max(b - a for a, b in spans)
    B, H = len(spans), lay.features.shape[1]
    feats = torch.zeros(B, width, H)
    toks = torch.zeros(B, width, dtype=torch.long)
    ans = torch.full((B, width), -1, dtype=torch.long)
    for i, (a, b) in enumerate(spans):
        feats[i, :b - a], toks[i, :b - a], ans[i, :b - a] = (lay.features[a:b].float(), lay.tokens[a:b],
                                                              lay.answer_row[a:b])
    first = lay.prompt_len[list(seqs)] - 1
    return SeqBatch(feats, toks, ans, first, int(first.min()))


def step_masks(batch: SeqBatch, steps: int) -> list[torch.Tensor]:
    """Per step s: (B, n) where step s at index t is a draft from a real anchor with a label."""
    t = torch.arange(batch.base, batch.features.shape[1])
    labelled = batch.answer_row[:, batch.base:] >= 0
    return [labelled & ((t - s + 1)[None, :] >= batch.first_anchor[:, None]) for s in range(1, steps + 1)]


def attending_loss(net: FeatureNet, data: DistillData, batch: SeqBatch, slice_of: torch.Tensor,
                   settings) -> torch.Tensor:
    """The plain drafter's loss per unrolled step (train.feature_loss.position_loss), weighted decay^(s−1)."""

    outs = unrolled(net, batch.features, batch.tokens, settings.unroll, batch.base)
    rows = batch.answer_row[:, batch.base:].clamp(min=0)                          # (B, n): x_{t+2}, f_{t+1}
    total = batch.features.new_zeros(())
    for s, (pred, mask) in enumerate(zip(outs, step_masks(batch, settings.unroll)), start=1):
        total = total + position_loss(net, pred, data, rows, mask, slice_of, settings) * settings.decay ** (s - 1)
    return total


def length_batches(lay: Layout, seqs: Sequence[int], size: int, gen: torch.Generator, bucket: int = 64) -> list[int]:
    """`size` random sequences from one of the buckets of `bucket` similar prompt lengths (so little is
    computed below the batch's base, while a batch still mixes prompt families)."""
    order = sorted(seqs, key=lambda s: int(lay.prompt_len[s]))
    start = int(torch.randint(max(1, len(order) - bucket + 1), (), generator=gen))
    pool = order[start:start + bucket]
    return [pool[int(i)] for i in torch.randperm(len(pool), generator=gen)[:size]]


@torch.no_grad()
def attending_leads(net: FeatureNet, data: DistillData, lay: Layout, gamma: int, size: int = 8):
    """Per anchor: leading greedy drafts (own tokens and features) equal to the answer, whether the γ
    window lies inside the answer, whether the first draft hit. -> ((N,), (N,), (N,))."""
    leads, fulls, firsts = [], [], []
    seqs = list(range(len(lay.offsets) - 1))
    for i in range(0, len(seqs), size):
        batch = seq_batch(lay, seqs[i:i + size])
        outs = unrolled(net, batch.features, batch.tokens, gamma, batch.base, own_tokens=True)
        n = batch.features.shape[1] - batch.base
        drafted = torch.stack([net.vocab_ids[net.slice_logits(o).argmax(-1)] for o in outs])      # (γ, B, n)
        truth = data.tokens[batch.answer_row[:, batch.base:].clamp(min=0)]                        # (B, n)
        has = batch.answer_row[:, batch.base:] >= 0
        hits = []
        for k in range(1, gamma + 1):           # draft k from anchor a sits at index a + k − 1
            at = torch.arange(n) + k - 1
            inside = at < n
            at = at.clamp(max=n - 1)
            hits.append((drafted[k - 1][:, at] == truth[:, at]) & has[:, at] & inside[None, :])
        hit = torch.stack(hits)                                                                   # (γ, B, n)
        lead = hit.long().cumprod(0).sum(0)                                                       # (B, n)
        anchor = (torch.arange(batch.base, batch.base + n)[None, :] >= batch.first_anchor[:, None]) & has
        end = torch.arange(n) + gamma - 1                                                      # last draft's index
        full = (end < n)[None, :] & has[:, end.clamp(max=n - 1)]
        leads.append(lead[anchor]), fulls.append(full[anchor]), firsts.append(hit[0][anchor])
    return torch.cat(leads), torch.cat(fulls), torch.cat(firsts)


def attending_metrics(net: FeatureNet, data: DistillData, lay: Layout, gammas: Sequence[int]) -> dict:
    net.eval()
    lead, full, first = attending_leads(net.float(), data, lay, max(gammas))
    return lead_metrics(lead[full], gammas, float(first.float().mean()) if len(first) else math.nan, int(len(first)))
