"""The target's LM-head inputs at prompt positions, for drafters that attend over the whole context.

The self-distillation data (decoding.train.data.DistillData) holds, for each answer token x_i, the LM-head
input h_{i-1} that produced it. A drafter that attends over its context also needs the prompt's rows:
h_j for prompt positions j = 0 .. P−2 (h_{P−1}, the row that produced the first answer token, is the
answer's row 0). One batched forward of the target's decoder over the left-padded prompts gives them;
the result is cached next to the distillation data.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import torch

from decoding.runtime.files import load_from_cache, save_to_cache
from decoding.runtime.paths import cache_dir
from decoding.train.data import DISTILL_VERSION, save_tensors
from decoding.train.greedy_batch import left_pad, pad_id, positions_of

ROWS_VERSION = 1


def prompt_rows_path(lm, prompts: Sequence[Sequence[int]]):
    key = hashlib.sha1(json.dumps({"v": DISTILL_VERSION, "rows": ROWS_VERSION, "model": lm.name,
                                   "prompts": [list(p) for p in prompts]}).encode()).hexdigest()[:16]
    return cache_dir("distill") / f"prompt-rows-{key}.pt"


@torch.inference_mode()
def _prompt_pass(lm, prompts: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    ids, mask = left_pad([list(p) for p in prompts], pad_id(lm))
    positions = positions_of(mask)
    hidden = lm.model.get_decoder()(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device),
                                    position_ids=positions.to(lm.device)).last_hidden_state   # (B, L, H)
    width = ids.shape[1]
    return [hidden[b, width - len(p):width - 1].to("cpu", torch.float16) for b, p in enumerate(prompts)]


def prompt_rows(lm, prompts: Sequence[Sequence[int]], *, batch_size: int = 16, use_cache: bool = True,
                progress: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows (R, H) float16, offsets (S + 1,)): prompt s's rows h_0 .. h_{P_s − 2} are
    rows[offsets[s]:offsets[s + 1]]. Prompts are batched by length so padding stays small."""
    path = prompt_rows_path(lm, prompts)
    saved = load_from_cache(lambda p: torch.load(p, weights_only=True), path) if use_cache else None
    if isinstance(saved, dict) and {"rows", "offsets"} <= saved.keys():
        return saved["rows"], saved["offsets"]
    from tqdm import tqdm

    order = sorted(range(len(prompts)), key=lambda s: len(prompts[s]))
    out: list[torch.Tensor | None] = [None] * len(prompts)
    for b0 in tqdm(range(0, len(order), batch_size), desc="prompt rows", unit="batch", disable=not progress):
        seqs = order[b0:b0 + batch_size]
        for s, rows in zip(seqs, _prompt_pass(lm, [prompts[s] for s in seqs])):
            out[s] = rows
    offsets = torch.tensor([0] + [len(r) for r in out]).cumsum(0)
    rows = torch.cat(out) if out else torch.zeros(0, int(lm.model.config.hidden_size), dtype=torch.float16)
    if use_cache:
        save_to_cache(lambda p: save_tensors({"rows": rows, "offsets": offsets}, p), path)
    return rows, offsets
