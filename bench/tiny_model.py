"""Tiny random llamas (no download): `tiny_llama` for exhaustive tests, and one with the embedded model's real
tokenizer saved as a model directory, so the app can be driven end to end in a second (DECODESCOPE_MODEL=<dir>;
the browser tests and `python -m bench app` use it)."""
from __future__ import annotations

from pathlib import Path


def tiny_llama(*, vocab_size: int = 64, hidden: int = 32, layers: int = 2, heads: int = 4, seed: int = 0,
               eos_token_id: int | None = None, context: int = 256):
    """A random LlamaForCausalLM (sdpa, float32, on the CPU) in eval mode; the same `seed` gives the same
    weights."""
    import torch
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


def embedded_tokenizer():
    """The embedded SmolLM2 tokenizer from the converted-model cache (converted first if missing)."""
    from transformers import AutoTokenizer

    from decoding.runtime.models import ModelSpec, _gguf_cache_dir, embedded_gguf_path, load

    cached = _gguf_cache_dir(embedded_gguf_path())
    if not (cached / "tokenizer.json").is_file():
        load(ModelSpec())          # first run on a fresh machine: converts the GGUF (~20 s)
    return AutoTokenizer.from_pretrained(str(cached), local_files_only=True)


def build_tiny_model_dir(target: Path, context: int = 1024, seed: int = 0, hidden: int = 32) -> Path:
    """The tiny model; another `seed` gives one of the same shape and tokenizer with other weights (a wider
    `hidden` one whose copies weigh enough to be seen in a process's memory)."""
    tok = embedded_tokenizer()
    model = tiny_llama(vocab_size=49152, hidden=hidden, layers=2, eos_token_id=tok.eos_token_id,
                       context=context, seed=seed)
    model.save_pretrained(target)
    tok.save_pretrained(target)
    return target
