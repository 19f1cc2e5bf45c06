"""Tiny drafters' targets and nets: a 4-layer llama with varied logits, and a random feature net."""
from __future__ import annotations

import torch

from decoding.drafters.feature_net import FeatureNet, FeatureShape
from decoding.runtime.models import LM


def tiny4_lm(layers: int = 4, seed: int = 3) -> LM:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None, initializer_range=0.3,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    return LM(model, tokenizer=None, name=f"tiny4-{seed}")


def random_net(lm: LM, seed: int = 0, vocab=None, **shape) -> FeatureNet:
    """An untrained net with a random (not zero) output map, so its drafts vary with the features."""
    torch.manual_seed(seed)
    hidden = int(lm.model.config.hidden_size)
    net = FeatureNet(FeatureShape(hidden, **{"width": 16, "mlp": 32, "blocks": 1, **shape}),
                     vocab or range(lm.vocab_size))
    torch.nn.init.normal_(net.out.weight, std=0.5)
    return net.attach(lm).eval().requires_grad_(False)
