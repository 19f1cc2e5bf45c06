"""Tiny llamas and drafters for the dspark tests (no download, built in a few ms)."""
from __future__ import annotations

import torch

from decoding.models import LM
from decoding.parallel import DrafterShape, ParallelDrafter


def varied_llama(seed: int = 0, vocab: int = 64, hidden: int = 32, init: float = 0.3,
                 eos_token_id: int | None = None) -> LM:
    """A random 2-layer llama whose greedy output does not collapse into a repeated token
    (large init, untied head), so a random drafter is often wrong."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=None, eos_token_id=eos_token_id, pad_token_id=None,
                      initializer_range=init, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = eos_token_id
    return LM(model, tokenizer=None, name=f"varied-{seed}")


def random_drafter(lm: LM, gamma_max: int = 8, seed: int = 0, vocab_ids=None) -> ParallelDrafter:
    hidden = lm.model.config.hidden_size
    shape = DrafterShape(hidden, lm.vocab_size, gamma_max=gamma_max, rank=8, trunk=32, width=16)
    drafter = ParallelDrafter(shape, vocab_ids=vocab_ids, seed=seed)
    with torch.no_grad():       # make the random drafter confidently wrong, not near-silent
        drafter.w2.normal_(0, 0.5, generator=torch.Generator().manual_seed(seed))
        drafter.seq_in.normal_(0, 0.3, generator=torch.Generator().manual_seed(seed + 1))
        drafter.conf_w.normal_(0, 0.3, generator=torch.Generator().manual_seed(seed + 2))
    return drafter.eval().attach(lm)


def one_thread():
    """Generator for a module fixture: tiny models run fastest on one thread (and far faster than
    on two when other processes load the CPU); restores the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
