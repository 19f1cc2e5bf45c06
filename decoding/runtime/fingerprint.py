"""A model's fingerprint: what a trained drafter must match to be used on it by default ("auto").

Two parts. `arch`: a hash of the architecture (model type, vocabulary, hidden size, layers) and of the
tokenizer's vocabulary. `weights`: 64 numbers sampled from the input embedding (8 rows spread over the
vocabulary, their first 8 values), compared with a tolerance, so the same weights match whether they
were loaded in float32, bfloat16 or float16 and on any device.
"""
from __future__ import annotations

import hashlib
import json

import torch

from decoding.runtime.paths import DRAFTER_TARGETS

SAMPLE_ROWS = 8
SAMPLE_COLS = 8
RTOL, ATOL = 2e-2, 2e-3          # bfloat16 keeps about 3 significant digits


def _tokenizer_hash(tokenizer) -> str:
    if tokenizer is None:
        return "none"
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=True).encode()).hexdigest()[:16]


def fingerprint(lm) -> dict:
    """{"arch": hex digest, "weights": [64 floats]} of a loaded decoding.runtime.models.LM."""
    config = lm.model.config
    arch = {"model_type": getattr(config, "model_type", ""), "vocab_size": int(lm.vocab_size),
            "hidden_size": int(getattr(config, "hidden_size", 0)),
            "layers": int(getattr(config, "num_hidden_layers", 0)), "tokenizer": _tokenizer_hash(lm.tokenizer)}
    embed = lm.model.get_input_embeddings().weight
    rows = torch.linspace(0, embed.shape[0] - 1, SAMPLE_ROWS).long().to(embed.device)
    sample = embed.detach().index_select(0, rows)[:, :SAMPLE_COLS].float().cpu().flatten()
    digest = hashlib.sha256(json.dumps(arch, sort_keys=True).encode()).hexdigest()[:16]
    return {"arch": digest, "weights": [round(float(v), 6) for v in sample]}


def matches(recorded: dict | None, actual: dict) -> bool:
    """Whether a fingerprint recorded with a drafter is this model's."""
    if not isinstance(recorded, dict) or recorded.get("arch") != actual["arch"]:
        return False
    weights = recorded.get("weights")
    if not isinstance(weights, list) or len(weights) != len(actual["weights"]):
        return False
    try:
        return torch.allclose(torch.tensor(weights, dtype=torch.float64),
                              torch.tensor(actual["weights"], dtype=torch.float64), rtol=RTOL, atol=ATOL)
    except (TypeError, ValueError):
        return False


def cached_fingerprint(lm) -> dict:
    """fingerprint(lm), computed once per loaded model."""
    return lm.loaded(("fingerprint",), None, lambda: fingerprint(lm))


def shipped_fits(lm) -> bool:
    """Whether the shipped drafters were trained for this model (assets/drafter-targets.json)."""
    try:
        recorded = json.loads(DRAFTER_TARGETS.read_text(encoding="utf-8")).get("target")
        return matches(recorded, cached_fingerprint(lm))
    except (OSError, ValueError, AttributeError, NotImplementedError, RuntimeError):
        return False          # no file, or weights it cannot read (an embedding offloaded to disk): no match
