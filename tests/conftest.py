"""Shared fixtures: tiny random llamas (built here, no download) and the embedded model (loaded once)."""
from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def make_tiny_llama(vocab_size: int = 64, hidden: int = 32, layers: int = 2, heads: int = 4,
                    seed: int = 0, eos_token_id: int | None = None, context: int = 256):
    """A random LlamaForCausalLM small enough for exhaustive tests (fp32, eager-free sdpa)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=context, eos_token_id=eos_token_id,
                      bos_token_id=None, pad_token_id=None, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = eos_token_id if eos_token_id is not None else 0
    return model


@pytest.fixture(scope="session")
def tiny_lm():
    from decoding.models import LM

    return LM(make_tiny_llama(), tokenizer=None, name="tiny")


@pytest.fixture(scope="session")
def real_lm():
    """The embedded SmolLM2-135M-Instruct (first load converts the GGUF, later loads are fast)."""
    from decoding.models import ModelSpec, load

    return load(ModelSpec())
