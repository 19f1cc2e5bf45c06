"""One parse of a GGUF file per conversion. transformers reads a GGUF file three times when it converts
one (the tokenizer, the config, then the weights), each time building gguf's reader again (its field
parsing is pure Python over every token of the vocabulary) and, for the weights, gguf's tensor-name map
once per submodule (hundreds of times). Within `parsed_once()` the reader of a path is built once, the
metadata read once (a deep copy handed to each caller, who may change it) and each name map built once;
outside it, transformers is as it was. Measured on the embedded model: see docs/experiments.md."""
from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()          # one conversion patches the loader at a time


@contextmanager
def parsed_once() -> Iterator[None]:
    """transformers' GGUF loader with the reader, the metadata and the name maps built once per file;
    a no-op where this transformers or gguf lacks the functions patched (another version)."""
    try:
        import gguf
        from transformers import modeling_gguf_pytorch_utils as loader
    except ImportError:
        yield
        return
    if not all(hasattr(module, name) for module, name in ((loader, "load_gguf_checkpoint"), (gguf, "GGUFReader"),
                                                         (gguf, "get_tensor_name_map"))):
        yield
        return
    with _lock:
        saved = (loader.load_gguf_checkpoint, gguf.get_tensor_name_map, gguf.GGUFReader)
        gguf.GGUFReader = functools.lru_cache(maxsize=2)(saved[2])
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=8)(saved[1])
        loader.load_gguf_checkpoint = _metadata_once(saved[0])
        try:
            yield
        finally:
            loader.load_gguf_checkpoint, gguf.get_tensor_name_map, gguf.GGUFReader = saved


def _metadata_once(load):
    """`load` (load_gguf_checkpoint) whose metadata-only reads of a path are made once (copies after)."""
    seen: dict = {}

    @functools.wraps(load)
    def wrapper(path, return_tensors=False, **kwargs):
        if return_tensors or kwargs:
            return load(path, return_tensors, **kwargs)
        if str(path) not in seen:
            seen[str(path)] = load(path)
        return copy.deepcopy(seen[str(path)])

    return wrapper
