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
belongs to), so rolling back costs nothing.

With shape.heads > 0 the net attends: index t of the context holds the pair (h_t, x_{t+1}); one causal
attention layer (no positional encoding) over every pair read so far, prompt included, comes between
W_in and the MLP blocks (`context_step`). The drafter (decoding.drafters.feature.AttendingDrafter) keeps the keys
and values of the true pairs; a draft step's own pair is attended to within its proposal only, so
rollback still costs nothing. `unrolled` computes every draft step from every anchor at once for
training, reading exactly the keys step-by-step drafting would. q_draft is a proper distribution over the slice (−inf
outside), so the ratio rule stays exact; at temperature 0 an accepted draft equals the target's token.

Weights file (safetensors, float16): the trained modules and `head.vocab_ids`; metadata: format, shape,
the target's name and fingerprint (decoding.runtime.fingerprint) and the training report. The target's
embeddings and head are never stored.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from decoding.core.errors import ConfigError, check
from decoding.drafters.shallow import full_vocabulary
from decoding.runtime import packed_gemm
from decoding.runtime.fingerprint import check_trained_for
from decoding.runtime.paths import FEATURE_WEIGHTS, shown_path
from decoding.runtime.weights_file import (
    build_from_file,
    check_finite,
    header_object,
    read_header,
    reading,
    resolve_weights,
    save_weights,
    trained_for,
)

WEIGHTS_FORMAT = "decodescope-feature-draft/1"
DEFAULT_FEATURE = FEATURE_WEIGHTS


@dataclass(frozen=True)
class FeatureShape:
    hidden_size: int
    width: int = 768
    mlp: int = 1536
    blocks: int = 2
    heads: int = 0               # > 0: one causal attention layer over the context's rows (see AttendingDraft)
    head_dim: int = 64

    def __post_init__(self):
        for name in ("hidden_size", "width", "mlp", "head_dim"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 1, name, value, "must be an integer >= 1")
        for name in ("blocks", "heads"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 0, name, value, "must be an integer >= 0")


def rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def lin(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """layer(x) in the layer's weight dtype, returned in x's; a loaded net's layers run the target's CPU
    GEMM kernels (`FeatureNet.use_kernels_of`)."""
    return layer(x.to(layer.weight.dtype)).to(x.dtype)


class _Block(nn.Module):
    def __init__(self, width: int, mlp: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.gate, self.up, self.down = nn.Linear(width, mlp), nn.Linear(width, mlp), nn.Linear(mlp, width)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        z = self.norm(u)
        return u + lin(self.down, F.silu(lin(self.gate, z)) * lin(self.up, z))


class _Attention(nn.Module):
    """Pre-norm multi-head attention without positional encoding (causal masking orders the context)."""

    def __init__(self, width: int, heads: int, head_dim: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.norm = nn.LayerNorm(width)
        self.q, self.k, self.v = (nn.Linear(width, heads * head_dim) for _ in range(3))
        self.o = nn.Linear(heads * head_dim, width)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """(..., T, h·d) -> (..., h, T, d)"""
        return x.unflatten(-1, (self.heads, self.head_dim)).transpose(-3, -2)

    def project(self, z: torch.Tensor):
        """(..., T, w) -> q, k, v, each (..., h, T, d)."""
        n = self.norm(z)
        return self.split(lin(self.q, n)), self.split(lin(self.k, n)), self.split(lin(self.v, n))

    def merge(self, attended: torch.Tensor) -> torch.Tensor:
        """(..., h, T, d) -> (..., T, w)"""
        return lin(self.o, attended.transpose(-3, -2).flatten(-2))


class FeatureNet(nn.Module):
    """The trained part; `attach(lm)` lends it the target's embeddings and head rows (not parameters)."""

    def __init__(self, shape: FeatureShape, vocab_ids: Sequence[int]):
        super().__init__()
        h, w = shape.hidden_size, shape.width
        self.shape = shape
        self.inp = nn.Linear(2 * h, w)
        self.attention = _Attention(w, shape.heads, shape.head_dim) if shape.heads else None
        self.blocks = nn.ModuleList(_Block(w, shape.mlp) for _ in range(shape.blocks))
        self.out = nn.Linear(w, h)
        nn.init.zeros_(self.out.weight), nn.init.zeros_(self.out.bias)     # untrained: f' = f
        self.scale = nn.Parameter(torch.ones(h))
        ids = torch.as_tensor(list(vocab_ids), dtype=torch.long, device="cpu")     # checked on the CPU even on "meta"
        check(ids.ndim == 1 and len(ids) >= 1 and int(ids.min()) >= 0 and len(torch.unique(ids)) == len(ids),
              "vocab_ids", f"<{ids.numel()} ids>", "must be distinct token ids >= 0")
        self.register_buffer("vocab_ids", ids)
        self.bias = nn.Parameter(torch.zeros(len(self.vocab_ids)))
        self.embed: torch.Tensor | None = None           # (V, H) the target's, not trained
        self.head: torch.Tensor | None = None            # (V_s, H) the target's head rows over the slice
        self.vocab_size = 0
        self.eos_ids: frozenset[int] = frozenset()
        self.token_ms: float | None = None               # ms per drafted token, timed on first use (drafters)
        self.gemm_plan = packed_gemm.DEFAULT_PLAN        # the target's CPU kernels per row count (use_kernels_of)
        self.head_pack: torch.Tensor | None = None       # MKL's packed copy of head (fp32 CPU), or None

    def attach(self, lm) -> FeatureNet:
        emb = lm.model.get_input_embeddings().weight.detach()
        name = getattr(self, "name", "feature")
        check(emb.shape[1] == self.shape.hidden_size, "draft", name,
              f"was trained for another model (hidden size {self.shape.hidden_size}; this one has {emb.shape[1]})")
        self.vocab_size, self.eos_ids = lm.vocab_size, frozenset(lm.eos_ids)
        check(int(self.vocab_ids.max()) < self.vocab_size, "draft", name,
              f"was trained for another model (its tokens reach id {int(self.vocab_ids.max())}; this one has "
              f"{self.vocab_size})")
        device = emb.device
        self.to(device)
        self.embed = emb
        head = lm.model.get_output_embeddings().weight.detach()       # may sit on another device (device_map)
        self.head = head.index_select(0, self.vocab_ids.to(head.device)).to(device)
        return self

    @property
    def attends(self) -> bool:
        return self.attention is not None

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the features it takes and returns (its norms' and residual stream's)."""
        return self.scale.dtype

    def use_kernels_of(self, lm) -> FeatureNet:
        """Run the linear layers and the head slice through the target's CPU GEMM plan (the kernel per
        row count it profiled on this machine; MKL's plain sgemm is slow on some CPUs)."""
        self.gemm_plan = getattr(lm, "gemm_plan", None) or packed_gemm.DEFAULT_PLAN
        packed_gemm.pack_linears(self, self.gemm_plan)
        wanted = self.head is not None and "packed" in self.gemm_plan.kernels
        self.head_pack = packed_gemm.pack_or_none(self.head) if wanted else None
        return self

    def inputs(self, feature: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """(..., H) LM-head inputs and (...,) tokens -> (..., w): z = W_in [rms(f); rms(E[x])]."""
        return lin(self.inp, torch.cat([rms(feature), rms(self.embed[token].to(feature.dtype))], -1))

    def finish(self, feature: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The MLP blocks on u (..., w), then the predicted next LM-head input f + W_out u (..., H)."""
        for block in self.blocks:
            u = block(u)
        return feature + lin(self.out, u)

    def step(self, feature: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """(..., H) LM-head input and (...,) token ids -> (..., H) predicted next LM-head input (a net
        without attention)."""
        return self.finish(feature, self.inputs(feature, token))

    def context_step(self, features: torch.Tensor, tokens: torch.Tensor, keys: torch.Tensor | None,
                     values: torch.Tensor | None):
        """An attending net over n new context rows: (n, H) LM-head inputs f_{i−1} and (n,) tokens x_i,
        each attending to the cached (h, m, d) keys/values and causally to the new rows. -> (predicted
        next LM-head inputs (n, H), the new rows' keys (h, n, d), values (h, n, d))."""
        z = self.inputs(features, tokens)                                          # (n, w)
        q, k, v = self.attention.project(z)                                        # (h, n, d)
        all_k = k if keys is None else torch.cat([keys, k], 1)                     # (h, m+n, d)
        all_v = v if values is None else torch.cat([values, v], 1)
        m, n = all_k.shape[1] - k.shape[1], k.shape[1]
        mask = torch.ones(n, m + n, dtype=torch.bool, device=z.device).tril(m)     # new row i sees ≤ m+i
        attended = F.scaled_dot_product_attention(q, all_k, all_v, attn_mask=mask)  # (h, n, d)
        return self.finish(features, z + self.attention.merge(attended)), k, v

    def slice_logits(self, feature: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V_s) logits over the slice."""
        z = (rms(feature) * self.scale).to(self.head.dtype)
        return packed_gemm.linear(z, self.head, None, self.head_pack, self.gemm_plan).to(feature.dtype) + self.bias

    def full_logits(self, feature: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V) logits, −inf outside the slice."""
        return full_vocabulary(self.slice_logits(feature), self.vocab_ids, self.vocab_size)


def save_feature(net: FeatureNet, path: str | Path, meta: dict | None = None) -> None:
    save_weights(net.state_dict(), path, {"format": WEIGHTS_FORMAT, "shape": json.dumps(asdict(net.shape)),
                                             "meta": json.dumps(meta or {})})


def read_meta(path: str | Path) -> dict:
    with reading("draft", path):
        header = read_header(path, WEIGHTS_FORMAT, "feature-drafter")
        return {"shape": header_object({"shape": header["shape"]}, "shape", "draft", path),
                "meta": header_object(header, "meta", "draft", path)}


def load_feature(target, path: str | Path | None = None) -> FeatureNet:
    """The shipped (or given) feature drafter attached to `target`, in the target's dtype and on its GEMM
    kernels; errors name `draft` (a damaged file: draft=PATH could not be read)."""
    from safetensors.torch import load_file

    path = resolve_weights(path, DEFAULT_FEATURE, "feature-drafter", "python -m decoding train feature")
    with reading("draft", path):
        info = read_meta(path)
        check_trained_for(info["meta"], target, "draft", shown_path(path))
        shape = FeatureShape(**info["shape"])
        hidden = target.model.get_input_embeddings().weight.shape[1]
        check(shape.hidden_size == hidden, "draft", shown_path(path),
              f"was trained for another model (hidden size {shape.hidden_size}; this one has {hidden})")
        state = load_file(str(path))                      # as much memory as the file holds, no more
        check_finite(state, "draft", path)
        ids = state["vocab_ids"].tolist()
        net = build_from_file(lambda: FeatureNet(shape, ids), state, shape.blocks, "draft", path)
    net.eval().requires_grad_(False)
    try:
        net.attach(target)
    except ConfigError as err:       # another shape: named by its file, as every error about it
        raise ConfigError("draft", shown_path(path), err.expected) from None
    net.to(dtype=target.dtype).use_kernels_of(target)
    net.name = f"{target.name}[feature]" + trained_for(info["meta"], target.name)
    return net


def _lagged(x: torch.Tensor, lag: int, fill: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., T, d) moved `lag` places later along T: out[t] = x[t − lag] (`fill`, else 0, for t < lag)."""
    if lag == 0:
        return x
    head = torch.zeros_like(x[..., :lag, :]) if fill is None else fill[..., :lag, :]
    return torch.cat([head, x[..., :-lag, :]], -2)


def true_keys(t: torch.Tensor, T: int, s: int) -> torch.Tensor:
    """(n, T) the true keys step s at index t reads: j ≤ t − s + 1, its anchor and before."""
    return torch.arange(T, device=t.device)[None, :] <= (t - (s - 1))[:, None]


def unrolled(net: FeatureNet, features: torch.Tensor, tokens: torch.Tensor, steps: int, base: int = 0,
             own_tokens: bool = False) -> list[torch.Tensor]:
    """Every draft step of an attending net from every anchor at once (training and evaluation).

    features (B, T, H): the true LM-head input f_t at index t; tokens (B, T): the true token x_{t+1} that
    f_t produced (index t is the input pair (f_t, x_{t+1}), as `context_step` takes them). Step s at index
    t is the s-th draft from anchor a = t − s + 1: its query reads true keys at indices ≤ a and, for
    r = 2..s, step r's key at index a + r − 1, exactly the cache a drafter holds after drafting s − 1
    tokens from a. Steps ≥ 2 take the previous step's predicted feature at t − 1 and the true token
    (`own_tokens`: the previous step's argmax token, as drafting does). Only indices ≥ `base` are computed.
    -> per step (B, T − base, H) predicted next LM-head inputs (index t − base)."""
    att, scale = net.attention, net.attention.head_dim ** -0.5
    q1, k1, v1 = att.project(net.inputs(features, tokens))                        # (B, h, T, d)
    T = features.shape[1]
    t = torch.arange(base, T, device=features.device)
    keys, values, outs = [], [], []
    feat_in, tok_in = features[:, base:], tokens[:, base:]                         # (B, n, ·)
    for s in range(1, steps + 1):
        z = net.inputs(feat_in, tok_in)                                              # (B, n, w)
        q, k, v = att.project(z) if s > 1 else (q1[..., base:, :], k1[..., base:, :], v1[..., base:, :])
        keys.append(k), values.append(v)
        main = (q @ k1.transpose(-1, -2)) * scale                                    # (B, h, n, T)
        main = main.masked_fill(~true_keys(t, T, s), float("-inf"))
        lagged_v = [_lagged(values[r - 1], s - r) for r in range(2, s + 1)]         # step r's row at t − (s − r)
        bands = [((q * _lagged(keys[r - 1], s - r)).sum(-1) * scale) for r in range(2, s + 1)]  # (B, h, n)
        scores = torch.cat([main] + [b[..., None] for b in bands], -1) if bands else main
        weights = scores.softmax(-1)
        attended = weights[..., :T] @ v1                                             # (B, h, n, d)
        for i, lv in enumerate(lagged_v):
            attended = attended + weights[..., T + i, None] * lv
        pred = net.finish(feat_in, z + att.merge(attended))                          # (B, n, H)
        outs.append(pred)
        if s < steps:                                  # the next step at t reads this step's output at t − 1
            feat_in = _lagged(pred, 1, fill=features[:, base:])
            if own_tokens:
                picked = net.vocab_ids[net.slice_logits(pred).argmax(-1)]              # (B, n)
                tok_in = torch.cat([tokens[:, base:base + 1], picked[:, :-1]], 1)
    return outs
