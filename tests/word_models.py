"""Tiny model directories with a 64-word tokenizer ("w0" … "w63"), built in a second with no download:
targets and drafts for the bad-input cases (another vocabulary, another tokenizer, NaN weights)."""
from __future__ import annotations

from pathlib import Path

import torch
from dspark_helpers import varied_llama

PROMPT = "w1 w2 w3"                  # ids [1, 2, 3]


def word_tokenizer(vocab: int = 64, prefix: str = "w"):
    """A whitespace word-level tokenizer whose token i is f"{prefix}{i}" (no chat template)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"{prefix}{i}": i for i in range(vocab)}
    backend = Tokenizer(models.WordLevel(words, unk_token=f"{prefix}0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=f"{prefix}0")


def build_word_model_dir(target: Path, vocab: int = 64, prefix: str = "w", seed: int = 0) -> Path:
    model = varied_llama(seed=seed, vocab=vocab).model
    model.save_pretrained(target)
    word_tokenizer(vocab, prefix).save_pretrained(target)
    return target


def build_nan_model_dir(target: Path) -> tuple[Path, int]:
    """A word model whose embedding of one token is NaN: the token the clean model emits greedily at
    some step k >= 2 after PROMPT (and not before, nor in the prompt). Decoding PROMPT greedily then
    records steps 0..k and meets NaN logits at step k + 1. Returns (directory, k + 1)."""
    from decoding.core.config import GreedyConfig
    from decoding.runner import run

    lm = varied_llama(seed=0, vocab=64)
    prompt = [1, 2, 3]
    out = list(run(lm, prompt, GreedyConfig(max_new_tokens=12)).output_ids)
    step = next(k for k in range(2, len(out)) if out[k] not in prompt + out[:k])
    with torch.no_grad():
        lm.model.model.embed_tokens.weight[out[step]] = float("nan")
    lm.model.save_pretrained(target)
    word_tokenizer().save_pretrained(target)
    return target, step + 1
