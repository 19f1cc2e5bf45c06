"""A tiny random llama with the embedded model's real tokenizer, saved as a model directory, so the app
can be driven end to end in a second (DECODESCOPE_MODEL=<dir>)."""
from __future__ import annotations

from pathlib import Path

from conftest import make_tiny_llama


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
    model = make_tiny_llama(vocab_size=49152, hidden=hidden, layers=2, eos_token_id=tok.eos_token_id,
                            context=context, seed=seed)
    model.save_pretrained(target)
    tok.save_pretrained(target)
    return target
