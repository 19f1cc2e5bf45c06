"""Feature drafter for speculative decoding: an autoregressive drafter over the target's own LM-head
inputs (the idea of EAGLE, Li et al. 2024), small enough to cost a few milliseconds a token on a CPU.

The target's verification forward already computes h_t, the LM-head input that produced the round's
last token x_t. The drafter maps (h_t, x_t) to a predicted next LM-head input ĥ_{t+1} and reads the
target's own LM head (a vocabulary slice, trained bias) off it to draft x_{t+1}; then (ĥ_{t+1}, x_{t+1})
gives ĥ_{t+2}, and so on for γ tokens:

    u   = W_in [rms(f); rms(E[x])]                    E: the target's token embeddings (shared)
    u  += W_o (silu(W_g n(u)) · W_u n(u))             `blocks` gated MLP blocks, n = LayerNorm
    f'  = f + W_out u                                  predicted next LM-head input
    logits(f') = (rms(f') · s) Wᵀ_slice + b            the target's head rows over the slice

No attention, no cache: between rounds the drafter keeps only the latest h_t (and the context length it
belongs to), so rolling back costs nothing. q_draft is a proper distribution over the slice (−inf
outside), so the ratio rule stays exact; at temperature 0 an accepted draft equals the target's token.

Weights file (safetensors, float16): the trained modules and `head.vocab_ids`; metadata: format, shape,
the target's name and the training report. The target's embeddings and head are never stored.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from decoding.errors import ConfigError, check
from decoding.shallow import full_vocabulary
from decoding.weights_file import read_header, save_weights

WEIGHTS_FORMAT = "decodescope-feature-draft/1"
ASSETS = Path(__file__).resolve().parent.parent / "assets"
DEFAULT_FEATURE = ASSETS / "feature-draft-smollm2-135m.safetensors"
FEATURE = "feature"


@dataclass(frozen=True)
class FeatureShape:
    hidden_size: int
    width: int = 768
    mlp: int = 1536
    blocks: int = 2

    def __post_init__(self):
        for name in ("hidden_size", "width", "mlp"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 1, name, value, "must be an integer >= 1")
        check(isinstance(self.blocks, int) and self.blocks >= 0, "blocks", self.blocks, "must be an integer >= 0")


def rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class _Block(nn.Module):
    def __init__(self, width: int, mlp: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.gate, self.up, self.down = nn.Linear(width, mlp), nn.Linear(width, mlp), nn.Linear(mlp, width)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        z = self.norm(u)
        return u + self.down(F.silu(self.gate(z)) * self.up(z))


class FeatureNet(nn.Module):
    """The trained part; `attach(lm)` lends it the target's embeddings and head rows (not parameters)."""

    def __init__(self, shape: FeatureShape, vocab_ids: Sequence[int]):
        super().__init__()
        h, w = shape.hidden_size, shape.width
        self.shape = shape
        self.inp = nn.Linear(2 * h, w)
        self.blocks = nn.ModuleList(_Block(w, shape.mlp) for _ in range(shape.blocks))
        self.out = nn.Linear(w, h)
        nn.init.zeros_(self.out.weight), nn.init.zeros_(self.out.bias)     # untrained: f' = f
        self.scale = nn.Parameter(torch.ones(h))
        self.register_buffer("vocab_ids", torch.as_tensor(list(vocab_ids), dtype=torch.long))
        self.bias = nn.Parameter(torch.zeros(len(self.vocab_ids)))
        self.embed: torch.Tensor | None = None           # (V, H) the target's, not trained
        self.head: torch.Tensor | None = None            # (V_s, H) the target's head rows over the slice
        self.vocab_size = 0
        self.eos_ids: frozenset[int] = frozenset()
        self.token_ms: float | None = None               # ms per drafted token, timed on first use (drafters)

    def attach(self, lm) -> "FeatureNet":
        emb = lm.model.get_input_embeddings().weight.detach()
        check(emb.shape[1] == self.shape.hidden_size, "draft", lm.name,
              f"has hidden size {emb.shape[1]}, the feature drafter was built for {self.shape.hidden_size}")
        self.vocab_size, self.eos_ids = lm.vocab_size, frozenset(lm.eos_ids)
        check(int(self.vocab_ids.max()) < self.vocab_size, "draft", lm.name,
              f"has {self.vocab_size} tokens, the feature drafter's slice reaches id {int(self.vocab_ids.max())}")
        device = emb.device
        self.to(device)
        self.embed = emb
        head = lm.model.get_output_embeddings().weight.detach()       # may sit on another device (device_map)
        self.head = head.index_select(0, self.vocab_ids.to(head.device)).to(device)
        return self

    def step(self, feature: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """(..., H) LM-head input and (...,) token ids -> (..., H) predicted next LM-head input."""
        u = self.inp(torch.cat([rms(feature), rms(self.embed[token].to(feature.dtype))], -1))
        for block in self.blocks:
            u = block(u)
        return feature + self.out(u)

    def slice_logits(self, feature: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V_s) logits over the slice."""
        return (rms(feature) * self.scale) @ self.head.T.to(feature.dtype) + self.bias

    def full_logits(self, feature: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V) logits, −inf outside the slice."""
        return full_vocabulary(self.slice_logits(feature), self.vocab_ids, self.vocab_size)


def save_feature(net: FeatureNet, path: str | Path, meta: dict | None = None) -> None:
    save_weights(net.state_dict(), path, {"format": WEIGHTS_FORMAT, "shape": json.dumps(asdict(net.shape)),
                                             "meta": json.dumps(meta or {})})


def read_meta(path: str | Path) -> dict:
    header = read_header(path, WEIGHTS_FORMAT, "feature-drafter")
    return {"shape": json.loads(header["shape"]), "meta": json.loads(header.get("meta", "{}"))}


def load_feature(target, path: str | Path | None = None) -> FeatureNet:
    """The shipped (or given) feature drafter attached to `target`, in the target's dtype; errors name `draft`."""
    from safetensors.torch import load_file

    path = Path(path) if path is not None else DEFAULT_FEATURE
    if not path.is_file():
        raise ConfigError("draft", str(path), "has no feature-drafter weights file: train one with "
                                              "`python -m decoding train feature`")
    info = read_meta(path)
    state = load_file(str(path))
    net = FeatureNet(FeatureShape(**info["shape"]), state["vocab_ids"].tolist())
    net.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    net.eval().requires_grad_(False)
    net.attach(target)
    net.to(dtype=target.dtype)
    net.name = f"{target.name}[feature]"
    target_name = info["meta"].get("target")
    if target_name and target_name != target.name:
        net.name += f" (trained for {target_name})"
    return net
