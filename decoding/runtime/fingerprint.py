"""A model's fingerprint: what a trained drafter must match to be used on it by default ("auto").

Two parts. `arch`: a hash of the architecture (model type, vocabulary, hidden size, layers) and of the
tokenizer's vocabulary. `weights`: 64 numbers sampled from the input embedding (8 rows spread over the
vocabulary, their first 8 values), compared with a tolerance, so the same weights match whether they
were loaded in float32, bfloat16 or float16 and on any device.

A drafter file the trainers write records its target's fingerprint in its metadata (TARGET_KEY);
`check_trained_for` refuses it on any other model, even one of the same shape. Files without one (trained
before it was recorded) are checked by shape alone when they attach.
"""
from __future__ import annotations

import hashlib
import json

import torch

from decoding.core.errors import check
from decoding.runtime.paths import DRAFTER_TARGETS

SAMPLE_ROWS = 8
SAMPLE_COLS = 8
RTOL, ATOL = 2e-2, 2e-3          # bfloat16 keeps about 3 significant digits
TARGET_KEY = "target_fingerprint"   # in a drafter file's metadata: the fingerprint of the model it was trained for
YOUR_MODEL = 'train one for this model (docs/drafters.md "Your model")'


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
    actual = fingerprint_of(lm)
    if actual is None:
        return False
    try:
        recorded = json.loads(DRAFTER_TARGETS.read_text(encoding="utf-8")).get("target")
    except (OSError, ValueError, AttributeError):
        return False          # no file, or not the record it should be: no match
    return matches(recorded, actual)


def fingerprint_of(lm) -> dict | None:
    """cached_fingerprint(lm), or None where its weights cannot be read (an embedding offloaded to disk)."""
    try:
        return cached_fingerprint(lm)
    except (AttributeError, NotImplementedError, RuntimeError):
        return None


def check_trained_for(meta: dict, lm, param: str, value: str) -> None:
    """A drafter file whose metadata records the fingerprint of its target is used on that model only: one
    line naming `param`=`value` otherwise. A file without one passes (its shape is checked when it attaches),
    and so does a model whose fingerprint cannot be taken."""
    recorded = meta.get(TARGET_KEY) if isinstance(meta, dict) else None
    actual = fingerprint_of(lm) if recorded is not None else None
    if actual is None:
        return
    same_arch = isinstance(recorded, dict) and recorded.get("arch") == actual["arch"]
    differs = "same architecture and tokenizer, other weights" if same_arch else "another architecture or tokenizer"
    check(matches(recorded, actual), param, value, f"was trained for another model (its fingerprint: {differs}); "
                                                   f"{YOUR_MODEL}")
