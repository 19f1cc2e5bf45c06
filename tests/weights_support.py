"""Weights files for the bad-input tests: good ones of each drafter kind, damaged copies, and halved model folders."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_llama
from dspark_helpers import random_drafter

from decoding.runtime.models import LM, ModelSpec, load


@pytest.fixture(scope="module")
def weights(lm, tmp_path_factory) -> dict[str, Path]:
    """A good weights file of each drafter kind for the word model."""
    from decoding.drafters.feature_net import FeatureNet, FeatureShape, save_feature
    from decoding.drafters.shallow import build_shallow, save_shallow

    tmp = tmp_path_factory.mktemp("weights")
    files = {"shallow": tmp / "shallow.safetensors", "feature": tmp / "feature.safetensors",
             "parallel": tmp / "parallel.safetensors"}
    save_shallow(build_shallow(lm, 1, 1), files["shallow"])
    hidden = int(lm.model.config.hidden_size)
    save_feature(FeatureNet(FeatureShape(hidden, width=16, mlp=32, blocks=1), range(lm.vocab_size)), files["feature"])
    random_drafter(lm, gamma_max=4).save(files["parallel"])
    return files


def rewrite(src: Path, dst: Path, drop: str | None = None, header: dict | None = None) -> None:
    """`src` re-saved as `dst` without tensor `drop`, with header entries replaced by `header`."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(src), "pt") as fh:
        meta, tensors = fh.metadata(), {k: fh.get_tensor(k) for k in fh.keys() if k != drop}
    save_file(tensors, str(dst), metadata={**meta, **(header or {})})


DROPPED = {"shallow": "head.vocab_ids", "feature": "vocab_ids", "parallel": "vocab_ids"}


OTHER_TENSOR = {"shallow": "norm.weight", "feature": "out.weight", "parallel": "w2"}


BAD_HEADER = {"shallow": {"layers": "x"}, "feature": {"shape": "{not json"},
              "parallel": {"shape": json.dumps({"hidden_size": 32, "vocab_size": 64, "gamma_max": 999})}}


def load_weights(kind: str, path: Path, lm: LM):
    from decoding.drafters.factory import load_draft
    from decoding.drafters.parallel import load_drafter

    return load_drafter(path, lm) if kind == "parallel" else load_draft(given(kind, path), lm)


def given(kind: str, path: Path) -> str:
    """How load_weights names the file of `kind` (and so how its errors name it): a draft as "kind:FILE"."""
    return str(path) if kind == "parallel" else f"{kind}:{path}"


def nan_copy(src, dst, name: str) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(src), "pt") as fh:
        meta, tensors = fh.metadata(), {k: fh.get_tensor(k) for k in fh.keys()}
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, str(dst), metadata=meta)


def save_tiny(path) -> str:
    """A 4-layer random llama with a 64-word whitespace tokenizer, as a model directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    make_tiny_llama(vocab_size=64, hidden=32, layers=4, seed=2).save_pretrained(path)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0").save_pretrained(path)
    return str(path)


def half_the_weights(model_dir: str) -> str:
    """A CPU budget of about half the model's bytes: some modules fit, the rest go to disk."""
    plain = load(ModelSpec(name=model_dir, device="cpu"))
    size = sum(p.numel() * p.element_size() for p in plain.model.parameters())
    return f"cpu={size // 2}B"


WORDS = [f"w{i}" for i in range(64)]
