"""Shallow self-draft for speculative decoding: the target's first L layers (shared, not copied), A
trained adapter layers of the target's own architecture, a trained copy of the final norm, and the
target's LM head restricted to a vocabulary slice (with a trained bias).

The built draft is a standard transformers model (same class as the target), so it also serves as
`assistant_model` in transformers' assisted generation. Its head returns full-vocabulary logits with
−inf outside the slice: q_draft is a proper distribution over the slice, and the ratio rule stays exact.

Weights file (safetensors, float16): the adapter layers (`adapter.{j}.*`), `norm.weight`, `head.bias`,
`head.vocab_ids`; metadata: format, L, A, the target's name and the training report. The target's
embeddings and LM head are never stored (built in memory from the target).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from decoding.core.errors import check
from decoding.runtime import packed_gemm
from decoding.runtime.models import LM
from decoding.runtime.paths import SHALLOW_WEIGHTS
from decoding.runtime.weights_file import (
    check_finite,
    read_header,
    reading,
    resolve_weights,
    save_weights,
    trained_for,
)

WEIGHTS_FORMAT = "decodescope-shallow-draft/1"
DEFAULT_SHALLOW = SHALLOW_WEIGHTS


class SliceHead(nn.Module):
    """LM head over a vocabulary slice: logits (..., V) with −inf outside `vocab_ids`."""

    def __init__(self, weight: torch.Tensor, vocab_ids: torch.Tensor, vocab_size: int):
        super().__init__()
        self.vocab_size = int(vocab_size)
        self.register_buffer("vocab_ids", vocab_ids.long(), persistent=False)           # (V_s,)
        self.register_buffer("weight", weight.detach().index_select(0, self.vocab_ids.to(weight.device)),
                             persistent=False)                                          # (V_s, H)
        self.bias = nn.Parameter(torch.zeros(len(vocab_ids), dtype=weight.dtype, device=weight.device))

    def slice_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.weight.T + self.bias                                       # (..., V_s)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return full_vocabulary(self.slice_logits(hidden), self.vocab_ids, self.vocab_size)      # (..., V)


def full_vocabulary(small: torch.Tensor, vocab_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Slice logits (..., V_s) as full-vocabulary logits (..., V): −inf outside the slice, so softmax gives
    a proper distribution over the slice."""
    out = small.new_full((*small.shape[:-1], vocab_size), float("-inf"))               # (..., V)
    out[..., vocab_ids.to(small.device)] = small
    return out


def check_shape(target_model, layers: int, adapters: int) -> None:
    total = len(target_model.model.layers)
    check(isinstance(layers, int) and 1 <= layers < total, "draft_layers", layers,
          f"must be an integer in [1, {total - 1}]")
    check(isinstance(adapters, int) and 0 <= adapters and layers + adapters <= total, "adapter_layers",
          adapters, f"must be an integer in [0, {total - layers}]")


def build_shallow(target: LM, layers: int, adapters: int, vocab_ids=None, name: str | None = None) -> LM:
    """Untrained shallow draft: target layers [0, L) shared, adapters initialised as copies of target
    layers [L, L + A), norm copied, head sliced to `vocab_ids` (None: the whole vocabulary)."""
    model = target.model
    check_shape(model, layers, adapters)
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers + adapters
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers + adapters]
    with torch.device("meta"):
        draft = type(model)(config)
    src = model.model.layers
    draft.model.embed_tokens = model.model.embed_tokens
    draft.model.layers = nn.ModuleList(list(src[:layers]) + [copy.deepcopy(src[layers + j]) for j in range(adapters)])
    draft.model.norm = copy.deepcopy(model.model.norm)
    draft.model.rotary_emb = model.model.rotary_emb
    ids = torch.arange(target.vocab_size) if vocab_ids is None else torch.as_tensor(list(vocab_ids))
    check(ids.ndim == 1 and len(ids) >= 1 and int(ids.min()) >= 0 and int(ids.max()) < target.vocab_size,
          "vocab_ids", f"<{len(ids)} ids>", f"must be token ids in [0, {target.vocab_size})")
    draft.lm_head = SliceHead(model.get_output_embeddings().weight, ids, target.vocab_size)
    draft.generation_config = copy.deepcopy(model.generation_config)
    draft.eval()
    lm = LM(draft, target.tokenizer, name=name or f"{target.name}[shallow {layers}+{adapters}]", device=target.device,
            lock=target.lock)       # shares target modules, so shares the target's lock
    lm.shallow = {"layers": layers, "adapters": adapters}
    return lm


def trainable(draft: LM) -> list[nn.Parameter]:
    """The parameters training changes (adapters, norm, head bias); the shared target layers stay frozen."""
    layers, adapters = draft.shallow["layers"], draft.shallow["adapters"]
    mods = list(draft.model.model.layers[layers:layers + adapters]) + [draft.model.model.norm]
    params = [p for m in mods for p in m.parameters()] + [draft.model.lm_head.bias]
    return params


def trained_state(draft: LM) -> dict[str, torch.Tensor]:
    layers, adapters = draft.shallow["layers"], draft.shallow["adapters"]
    state = {}
    for j in range(adapters):
        for key, value in draft.model.model.layers[layers + j].state_dict().items():
            state[f"adapter.{j}.{key}"] = value
    state["norm.weight"] = draft.model.model.norm.weight
    state["head.bias"] = draft.model.lm_head.bias
    state["head.vocab_ids"] = draft.model.lm_head.vocab_ids
    return state


def save_shallow(draft: LM, path: str | Path, meta: dict | None = None) -> None:
    save_weights(trained_state(draft), path, {"format": WEIGHTS_FORMAT, "layers": str(draft.shallow["layers"]),
                                              "adapters": str(draft.shallow["adapters"]),
                                              "meta": json.dumps(meta or {})})


def read_meta(path: str | Path) -> dict:
    with reading("draft", path):
        header = read_header(path, WEIGHTS_FORMAT, "shallow-draft")
        return {"layers": int(header["layers"]), "adapters": int(header["adapters"]),
                "meta": json.loads(header.get("meta", "{}"))}


def load_shallow(target: LM, path: str | Path | None = None) -> LM:
    """The shipped (or given) trained shallow draft built on `target`; errors name `draft` (a damaged
    file: draft=PATH could not be read)."""
    from safetensors.torch import load_file

    path = resolve_weights(path, DEFAULT_SHALLOW, "shallow-draft", "python -m decoding train draft")
    with reading("draft", path):
        info = read_meta(path)
        state = load_file(str(path))
        check_finite(state, "draft", path)
        draft = build_shallow(target, info["layers"], info["adapters"], state["head.vocab_ids"],
                              name=f"{target.name}[shallow {info['layers']}+{info['adapters']}]")
        _load_trained(draft, state)
    if target.packed_linears:                       # the adapters' packs predate their trained weights
        packed_gemm.pack_linears(draft.model, target.gemm_plan)
        draft.packed_linears, draft.gemm_plan = packed_gemm.packed_count(draft.model), target.gemm_plan
    draft.name += trained_for(info["meta"], target.name)
    return draft


def _load_trained(draft: LM, state: dict[str, torch.Tensor]) -> None:
    layers, adapters = draft.shallow["layers"], draft.shallow["adapters"]
    dtype, device = draft.dtype, draft.device
    for j in range(adapters):
        prefix = f"adapter.{j}."
        sub = {k[len(prefix):]: v.to(device, dtype) for k, v in state.items() if k.startswith(prefix)}
        draft.model.model.layers[layers + j].load_state_dict(sub)
    with torch.no_grad():
        draft.model.model.norm.weight.copy_(state["norm.weight"].to(device, dtype))
        draft.model.lm_head.bias.copy_(state["head.bias"].to(device, dtype))
