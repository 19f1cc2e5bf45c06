"""Parallel drafter ("DSpark" stage 0): one forward over the target's hidden states and tokens of the
last few emitted positions yields γ positions of draft logits, a low-rank sequential bias from the token
at k−1, and a confidence per position; `build_lattice` turns that into a core.lattice.Lattice for stage 1.

Inputs (no extra target pass): for each of the last T ≤ span = layers·(window − 1) + 1 emitted tokens t_j (one
without a backbone), the hidden state h_j the target's LM head read at the position that produced it (captured
from the verification forward by `HeadInputTap`) and, for a drafter with `feature_layers`, the outputs
f_j^1..f_j^E of those decoder layers at that position (same forward, forward hooks); the last pair (h, root)
is the anchor. Tokens are embedded with the target's frozen input embedding. Position k (1..γ) predicts the
k-th token after root. Architecture:

    x_j = silu(W_in [rms(h_j); rms(E[t_j]); rms(f_j^1); …])         (B, T, D)    trunk, per row
    u   = backbone(x)[last]                                         (B, D)       `layers` causal blocks
                                                                                 over the window (none:
                                                                                 u = x_last)
    z_k = h + W2_k silu(W1_k u [+ P_k rms(E[y])])                   (B, γ, H)    per-position block;
                                                                                 with parent_mlp the
                                                                                 parent y enters too
    base_k = z_k · W_headᵀ (all γ positions in one matmul)          (B, γ, V_s)  frozen LM head
                                                                                 (MKL-packed on the CPU)
    logits_k(· | y) = base_k + (E[y] A_k) Rᵀ                        rank-r bias from the parent y
    c_k(y) = σ(a_k · (w_k·[z_k, log max q_k(·|y), entropy]) + b_k)  confidence, Platt-calibrated

A backbone block is pre-norm attention (rotary positions, each row sees the `window` rows up to itself)
and a gated MLP, both residual. With `parent_mlp` z_k depends on the parent y (training: the true
token at k−1), so drafting puts each position's parents through the head as one product
(`NodeScorer`) instead of all γ positions in one. V_s is an optional slice of the vocabulary (the tokens seen in
training); tokens outside it get no draft probability. The frozen target tensors are attached with
`attach(lm)` and never saved.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from decoding.core.config import DSPARK_MAX_GAMMA
from decoding.core.draft_names import PARALLEL_DRAFTER
from decoding.core.errors import ConfigError, check
from decoding.core.lattice import Lattice, LatticeDraft, LatticeRequest
from decoding.runtime import packed_gemm
from decoding.runtime.fingerprint import check_trained_for
from decoding.runtime.hooks import check_feature_layers
from decoding.runtime.paths import shown_path
from decoding.runtime.weights_file import build_from_file, check_finite, header_object, reading, save_weights

WEIGHTS_FORMAT = "decodescope-parallel-drafter/1"


@dataclass(frozen=True)
class DrafterShape:
    hidden_size: int
    vocab_size: int            # the target's vocabulary
    gamma_max: int = 8
    rank: int = 64             # sequential (previous-token) bias
    trunk: int = 512
    width: int = 256           # per-position block
    layers: int = 0            # backbone blocks over the window (0: the anchor row only)
    window: int = 1            # rows of history the backbone sees, the anchor's included
    heads: int = 8             # backbone attention heads
    mlp: int = 1024            # backbone MLP width
    feature_layers: tuple[int, ...] = ()   # target decoder layers whose outputs the trunk also reads
    parent_mlp: bool = False   # the token at k−1 also enters position k's block (not only the logit bias)

    def __post_init__(self):
        object.__setattr__(self, "feature_layers", tuple(self.feature_layers))   # JSON gives a list
        check(isinstance(self.parent_mlp, bool), "parent_mlp", self.parent_mlp, "must be true or false")
        check(all(isinstance(i, int) and i >= 0 for i in self.feature_layers)
              and len(set(self.feature_layers)) == len(self.feature_layers), "feature_layers",
              list(self.feature_layers), "must be distinct decoder-layer indices >= 0")
        for name in ("hidden_size", "vocab_size", "rank", "trunk", "width", "window", "heads", "mlp"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 1, name, value, "must be an integer >= 1")
        check(isinstance(self.layers, int) and self.layers >= 0, "layers", self.layers, "must be an integer >= 0")
        check(self.layers == 0 or (self.trunk % self.heads == 0 and (self.trunk // self.heads) % 2 == 0), "heads",
              self.heads, f"must divide trunk ({self.trunk}) into heads of even size")
        check(isinstance(self.gamma_max, int) and 1 <= self.gamma_max <= DSPARK_MAX_GAMMA, "gamma_max",
              self.gamma_max, f"must be an integer in [1, {DSPARK_MAX_GAMMA}]")

    @property
    def row_width(self) -> int:
        """Width of one input row: the LM-head input, then each feature layer's output."""
        return self.hidden_size * (1 + len(self.feature_layers))


@dataclass(frozen=True)
class DraftOut:
    z: torch.Tensor            # (B, γ, H) per-position hidden states
    base: torch.Tensor         # (B, γ, V_s) logits before the sequential bias


def rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding over the rows of x (..., T, d), d even; row j sits at position j."""
    d, t = x.shape[-1], x.shape[-2]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))   # (d/2,)
    angle = torch.arange(t, device=x.device, dtype=torch.float32)[:, None] * inv                # (T, d/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    even, odd = x[..., ::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1).flatten(-2)


def window_mask(valid: torch.Tensor, window: int) -> torch.Tensor:
    """Additive attention mask (B, 1, T, T): row i sees valid rows i−window+1..i (always itself)."""
    t = valid.shape[1]
    i = torch.arange(t, device=valid.device)
    band = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)                      # (T, T)
    sees = (band[None] & valid[:, None, :]) | torch.eye(t, dtype=torch.bool, device=valid.device)
    return torch.zeros(sees.shape, device=valid.device).masked_fill(~sees, float("-inf"))[:, None]


class ContextBlock(nn.Module):
    """Pre-norm residual attention (rotary) + gated MLP; output projections start at zero, so an
    untrained block is the identity."""

    def __init__(self, dim: int, heads: int, mlp: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.up = nn.Linear(dim, 2 * mlp, bias=False)
        self.down = nn.Linear(mlp, dim, bias=False)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.down.weight)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(F.rms_norm(x, (d,))).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(rotary(q), rotary(k), v, attn_mask=mask.to(q.dtype))  # (B, nh, T, dh)
        x = x + self.out(att.transpose(1, 2).reshape(b, t, d))
        gate, up = self.up(F.rms_norm(x, (d,))).chunk(2, -1)
        return x + self.down(F.silu(gate) * up)


class ParallelDrafter(nn.Module):
    kind = PARALLEL_DRAFTER     # how the cells it proposes are labelled

    def __init__(self, shape: DrafterShape, vocab_ids: Sequence[int] | None = None, seed: int = 0):
        super().__init__()
        self.shape = shape
        self.dropout = 0.0              # training-time dropout rate (decoding.train.parallel sets it); not saved
        g, h, d, w, r = shape.gamma_max, shape.hidden_size, shape.trunk, shape.width, shape.rank
        ids = (torch.arange(shape.vocab_size, device="cpu") if vocab_ids is None    # checked on the CPU even
               else torch.as_tensor(list(vocab_ids), device="cpu"))                # when built on "meta"
        check(ids.ndim == 1 and len(ids) >= 1 and int(ids.min()) >= 0 and int(ids.max()) < shape.vocab_size
              and len(torch.unique(ids)) == len(ids), "vocab_ids", f"<{len(ids)} ids>",
              f"must be distinct token ids in [0, {shape.vocab_size})")
        self.register_buffer("vocab_ids", ids.long(), persistent=True)           # (V_s,)
        gen = torch.Generator().manual_seed(seed)
        n_in = shape.row_width + h                     # [head input; feature layers; token embedding]
        self.trunk_in = nn.Parameter(torch.randn(n_in, d, generator=gen) / n_in ** 0.5)        # (F + H, D)
        self.trunk_b = nn.Parameter(torch.zeros(d))
        self.w1 = nn.Parameter(torch.randn(g, d, w, generator=gen) / d ** 0.5)             # (γ, D, W)
        self.b1 = nn.Parameter(torch.zeros(g, w))
        parent_in = torch.randn(g, h, w, generator=gen) / h ** 0.5 if shape.parent_mlp else None   # (γ, H, W)
        self.parent_in = None if parent_in is None else nn.Parameter(parent_in)
        self.w2 = nn.Parameter(torch.randn(g, w, h, generator=gen) * 0.02 / w ** 0.5)      # (γ, W, H)
        self.seq_in = nn.Parameter(torch.zeros(g, h, r))                                    # (γ, H, r)
        self.seq_out = nn.Parameter(torch.randn(len(ids), r, generator=gen) * 0.02)        # (V_s, r)
        self.conf_w = nn.Parameter(torch.zeros(g, h + 2))                                   # (γ, H + 2)
        self.conf_b = nn.Parameter(torch.zeros(g))
        self.blocks = nn.ModuleList(ContextBlock(d, shape.heads, shape.mlp) for _ in range(shape.layers))
        self.register_buffer("platt_a", torch.ones(g))     # per-position calibration of the
        self.register_buffer("platt_b", torch.zeros(g))    # confidence logit
        self.embed: torch.Tensor | None = None      # (V, H) frozen target input embedding
        self.head: torch.Tensor | None = None       # (V_s, H) frozen target LM head rows
        self.head_bias: torch.Tensor | None = None  # (V_s,) or None
        self.head_pack: torch.Tensor | None = None  # MKL's packed copy of head (fp32 CPU), or None
        self.gemm_plan = packed_gemm.DEFAULT_PLAN   # the target's CPU kernels per row count (attach)

    # ------------------------------------------------------------------ frozen target parts
    def attach(self, lm) -> ParallelDrafter:
        """Share the target's input embedding and LM head (frozen, not part of the weights); the
        drafter moves to the head's device (its own weights keep their dtype)."""
        model = lm.model if hasattr(lm, "model") else lm
        embed = model.get_input_embeddings().weight
        head = model.get_output_embeddings()
        check(embed.shape[1] == self.shape.hidden_size and head.weight.shape[0] >= self.shape.vocab_size,
              "drafter", f"<hidden {self.shape.hidden_size}, vocab {self.shape.vocab_size}>",
              f"does not fit this model (hidden {embed.shape[1]}, vocab {head.weight.shape[0]})")
        check(head.weight.device.type != "meta", "drafter", "<attach>", "the target's LM head is offloaded "
              "(device_map); give max_memory room for it on a device")
        if self.shape.feature_layers:
            check_feature_layers(self.shape.feature_layers, len(model.get_decoder().layers))
        self.to(head.weight.device)
        ids = self.vocab_ids.to(head.weight.device)
        self.embed = embed.detach()
        self.head = head.weight.detach().index_select(0, ids).to(self.trunk_in.dtype)   # (V_s, H)
        bias = getattr(head, "bias", None)
        self.head_bias = None if bias is None else bias.detach().index_select(0, ids).to(self.trunk_in.dtype)
        self.gemm_plan = getattr(lm, "gemm_plan", None) or packed_gemm.DEFAULT_PLAN
        self._pack_head()
        return self

    def __getstate__(self) -> dict:
        """Copies and pickles leave out the opaque packed head and pack their own (see __setstate__)."""
        return {**super().__getstate__(), "head_pack": None}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._pack_head()

    def _pack_head(self) -> None:
        wanted = self.head is not None and "packed" in self.gemm_plan.kernels
        self.head_pack = packed_gemm.pack_or_none(self.head) if wanted else None

    def _check_attached(self) -> None:
        if self.head is None:
            raise ConfigError("drafter", "<detached>", "call attach(lm) before drafting")

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids.to(self.embed.device), self.embed).to(self.trunk_in.dtype)  # (..., H)

    # ------------------------------------------------------------------ forward
    @property
    def span(self) -> int:
        """Rows of history the anchor's output depends on: each block looks `window` − 1 rows back."""
        return self.shape.layers * (self.shape.window - 1) + 1

    def encode(self, hidden: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """hidden (B, T, F) input rows (F = shape.row_width), tokens (B, T), valid (B, T) bool (None: all)
        -> u (B, T, D): row j's trunk output after the backbone, which lets it see the `window` rows up to j."""
        self._check_attached()
        h = self.shape.hidden_size
        check(hidden.shape[-1] == self.shape.row_width, "hidden", tuple(hidden.shape),
              f"rows must be {self.shape.row_width} wide (LM-head input + {len(self.shape.feature_layers)} "
              "feature layers)")
        hidden = hidden.to(self.trunk_in.dtype)
        head_in, *layer_outs = hidden.split(h, -1)
        feats = torch.cat([F.rms_norm(head_in, (h,)), F.rms_norm(self.embed_tokens(tokens), (h,))]
                          + [F.rms_norm(x, (h,)) for x in layer_outs], -1)             # (B, T, F + H)
        x = F.dropout(F.silu(feats @ self.trunk_in + self.trunk_b), self.dropout, self.training)  # (B, T, D)
        if self.blocks:
            if valid is None:
                valid = torch.ones(tokens.shape, dtype=torch.bool, device=x.device)
            mask = window_mask(valid.to(x.device), self.shape.window)
            for block in self.blocks:
                x = block(x, mask)
        return x

    def draft_positions(self, u: torch.Tensor, hidden: torch.Tensor, gamma: int | None = None,
                        parents: torch.Tensor | None = None) -> DraftOut:
        """u (B, D) encoded anchors, hidden (B, F) their input rows (the LM-head input first) -> the
        first `gamma` (default gamma_max) positions of base logits. A `parent_mlp` drafter needs
        parents (B, ≥ γ): the token at k−1 for each position k (the root first), as in training."""
        g = self.shape.gamma_max if gamma is None else gamma
        hidden = hidden[..., :self.shape.hidden_size].to(self.trunk_in.dtype)
        pre = self.position_pre(u, g)                                                        # (B, γ, W)
        if self.parent_in is not None:
            check(parents is not None and parents.shape[-1] >= g, "parents",
                  None if parents is None else tuple(parents.shape),
                  f"a parent_mlp drafter needs the token before each of the {g} positions")
            pre = pre + self.parent_term(torch.arange(g, device=pre.device), parents[:, :g])
        mid = F.dropout(F.silu(pre), self.dropout, self.training)
        z = hidden[:, None, :] + torch.einsum("bgw,gwh->bgh", mid, self.w2[:g])            # (B, γ, H)
        return DraftOut(z, self.project(z))

    def position_pre(self, u: torch.Tensor, gamma: int) -> torch.Tensor:
        """u (B, D) -> (B, γ, W): each position's block input before the parent term and activation;
        batched over γ (einsum would copy w1 into a (D, γ·W) layout on every call)."""
        return torch.matmul(u, self.w1[:gamma]).transpose(0, 1) + self.b1[:gamma]

    def parent_term(self, position: torch.Tensor | int, parents: torch.Tensor) -> torch.Tensor:
        """parent_mlp: the parent token's part of position k's block input, (...) -> (..., W)."""
        e = F.rms_norm(self.embed_tokens(parents), (self.shape.hidden_size,))                # (..., H)
        return torch.einsum("...h,...hw->...w", e, self.parent_in[position])

    def node_z(self, pre: torch.Tensor, hidden: torch.Tensor, position: int, parents: torch.Tensor) -> torch.Tensor:
        """parent_mlp, drafting: position's hidden state under each parent. pre (W,) that position's
        position_pre row, hidden (H,) the anchor's LM-head input, parents (P,) -> (P, H)."""
        mid = F.silu(pre + self.parent_term(position, parents))                             # (P, W)
        return hidden[:self.shape.hidden_size].to(mid.dtype) + mid @ self.w2[position]

    def project(self, z: torch.Tensor) -> torch.Tensor:
        """All positions through the frozen LM head rows in one matrix product: (..., H) -> (..., V_s);
        through the kernel the target's GEMM plan names for the row count (decoding.runtime.packed_gemm)."""
        return packed_gemm.linear(z, self.head, self.head_bias, self.head_pack, self.gemm_plan)

    def forward(self, hidden: torch.Tensor, root: torch.Tensor, valid: torch.Tensor | None = None,
                gamma: int | None = None, parents: torch.Tensor | None = None) -> DraftOut:
        """Anchor = the last row. hidden (B, H) and root (B,): a window of one row; or hidden (B, T, H),
        root (B, T) the window's rows (oldest first), valid (B, T) which rows exist. Positions 1..gamma
        (default gamma_max); parents as draft_positions takes them."""
        if hidden.ndim == 2:
            hidden, root = hidden[:, None], root[:, None]
        u = self.encode(hidden, root, valid)[:, -1]                                         # (B, D)
        return self.draft_positions(u, hidden[:, -1], gamma, parents)

    def parent_bias(self, position: torch.Tensor | int, parents: torch.Tensor) -> torch.Tensor:
        """Sequential bias (..., V_s) for parents (...) at 0-based position(s) (broadcastable)."""
        e = self.embed_tokens(parents)                                          # (..., H)
        low = torch.einsum("...h,...hr->...r", e, self.seq_in[position])       # (..., r)
        return low @ self.seq_out.T                                             # (..., V_s)

    def teacher_logits(self, out: DraftOut, parents: torch.Tensor) -> torch.Tensor:
        """Training form: parents (B, γ') = true token at k−1 (root first) -> logits (B, γ', V_s)."""
        g = parents.shape[1]
        e = self.embed_tokens(parents)                                          # (B, γ', H)
        low = torch.einsum("bgh,ghr->bgr", e, self.seq_in[:g])                  # (B, γ', r)
        return out.base[:, :g] + low @ self.seq_out.T                           # (B, γ', V_s)

    def confidence_logit(self, position: torch.Tensor | int, z: torch.Tensor,
                         logits: torch.Tensor) -> torch.Tensor:
        """Raw confidence logit that position k's top-1 is accepted: z (..., H), logits (..., V_s).
        = w_k·[rms(z), log max q, entropy of q] + b_k, in two parts (see build_lattice)."""
        logq = torch.log_softmax(logits.float(), -1)                            # (..., V_s)
        return self.confidence_from_z(position, z) + self.confidence_from_q(position, logq)

    def confidence_from_z(self, position: torch.Tensor | int, z: torch.Tensor) -> torch.Tensor:
        """The part of the confidence logit from the position's hidden state: z (..., H) -> (...)."""
        w = self.conf_w[position]                                               # (..., H + 2)
        h = z.shape[-1]
        return (F.rms_norm(z, (h,)).to(w.dtype) * w[..., :h]).sum(-1) + self.conf_b[position]

    def confidence_from_q(self, position: torch.Tensor | int, logq: torch.Tensor) -> torch.Tensor:
        """The part from the draft distribution: logq (..., V_s) log-probabilities -> (...)."""
        w = self.conf_w[position]                                               # (..., H + 2)
        ent = -(logq.exp() * logq).sum(-1)                                      # (...)
        return w[..., -2] * logq.amax(-1).to(w.dtype) + w[..., -1] * ent.to(w.dtype)

    def calibrated(self, position, raw_logit: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.platt_a[position] * raw_logit + self.platt_b[position])

    def lattice(self, hidden: torch.Tensor, history: Sequence[int], request: LatticeRequest) -> LatticeDraft:
        """The DSpark drafter interface (decoding.strategies.dspark): `build_lattice` over the history's rows."""
        return build_lattice(self, hidden, history, request.gamma, request.top_k, request.temperature, request.extra)

    # ------------------------------------------------------------------ weights
    def save(self, path: str | Path, meta: dict | None = None) -> None:
        """float16 safetensors with the shape and `meta` (target model, training run) in the header."""
        save_weights(self.state_dict(), path, {"format": WEIGHTS_FORMAT, "shape": json.dumps(asdict(self.shape)),
                                               "meta": json.dumps(meta or {})})


def load_drafter(path: str | Path, lm=None) -> ParallelDrafter:
    """Load saved weights (float32 in memory); attach to `lm` when given. Missing, foreign or damaged
    files raise a one-line ConfigError naming `drafter` and the file."""
    from safetensors import safe_open

    path = Path(path)
    check(path.is_file(), "drafter", shown_path(path),
          "no drafter weights there (give 'feature', 'parallel' or a parallel drafter's weights file; train one: "
          "python -m decoding train parallel)")
    with reading("drafter", path):
        with safe_open(str(path), framework="pt") as fh:
            header = fh.metadata() or {}
        check(header.get("format") == WEIGHTS_FORMAT, "drafter", shown_path(path), "is not a parallel-drafter file")
        shape = DrafterShape(**header_object({"shape": header["shape"]}, "shape", "drafter", path))
        meta = header_object(header, "meta", "drafter", path)
        if lm is not None:
            check_fits(shape, lm, path)
        with safe_open(str(path), framework="pt") as fh:
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}     # as much memory as the file holds, no more
        check_finite(tensors, "drafter", path)
        ids = tensors["vocab_ids"].tolist()
        drafter = build_from_file(lambda: ParallelDrafter(shape, vocab_ids=ids), tensors, shape.layers, "drafter", path)
        drafter.meta = meta
    if lm is not None:
        check_trained_for(drafter.meta, lm, "drafter", shown_path(path))
    drafter.eval()
    return drafter.attach(lm) if lm is not None else drafter


def check_fits(shape: DrafterShape, lm, path: str | Path) -> None:
    """The shape a file's header gives against the target, before anything is built from it."""
    model = lm.model if hasattr(lm, "model") else lm
    hidden, vocab = model.get_input_embeddings().weight.shape[1], model.get_output_embeddings().weight.shape[0]
    check(shape.hidden_size == hidden and shape.vocab_size <= vocab, "drafter", shown_path(path),
          f"was trained for another model (hidden size {shape.hidden_size}, vocabulary {shape.vocab_size}; this one "
          f"has {hidden}, {vocab})")


def drafter_meta(path: str | Path) -> dict:
    from safetensors import safe_open

    with reading("drafter", path), safe_open(str(path), framework="pt") as fh:
        return json.loads((fh.metadata() or {}).get("meta", "{}"))


# ---------------------------------------------------------------------- lattice
def _slice_column(drafter, token: int) -> int | None:
    """Index of `token` in the drafter's vocabulary slice (None: the drafter cannot propose it)."""
    hit = (drafter.vocab_ids == int(token)).nonzero()
    return int(hit[0, 0]) if len(hit) else None


def with_extra(drafter, token: int, ids: list, q_cond: torch.Tensor, mix: torch.Tensor, cols: torch.Tensor,
               q_top: torch.Tensor):
    """Candidates at one position with `token` (prompt lookup's) added when missing; a token outside the
    drafter's vocabulary slice (`drafter.vocab_ids`) gets q = 0. -> (ids, q_cols (P, K'), q_top, index)."""
    q_cols = q_cond[:, cols]                                                         # (P, K)
    if token in ids:
        return ids, q_cols, q_top, ids.index(token)
    col = _slice_column(drafter, token)
    extra_q = q_cond[:, col] if col is not None else torch.zeros_like(q_cond[:, 0])  # (P,)
    extra_mix = mix[col] if col is not None else torch.zeros_like(mix[0])
    return (ids + [int(token)], torch.cat([q_cols, extra_q[:, None]], 1),
            torch.cat([q_top, extra_mix[None]]), len(ids))


class NodeScorer:
    """One drafter pass over an anchor (hidden (T, F) rows, tokens (T,)), then per position and parents
    (P,): the logits (P, V_s) and the hidden state's part of the confidence logit. Without parent_mlp all
    γ positions go through the head in one matrix product here; with it, each position's z depends on
    the parent, so each position is one product over its P parents when asked."""

    def __init__(self, drafter: ParallelDrafter, hidden: torch.Tensor, tokens: torch.Tensor, gamma: int):
        self.drafter = drafter
        u = drafter.encode(hidden[None], tokens[None])[:, -1]                        # (1, D)
        if drafter.shape.parent_mlp:
            self.anchor = hidden[-1]                                                 # (F,)
            self.pre = drafter.position_pre(u, gamma)[0]                             # (γ, W)
        else:
            self.out = drafter.draft_positions(u, hidden[-1:], gamma)               # z (1, γ, H)
            self.conf_z = drafter.confidence_from_z(torch.arange(gamma, device=u.device), self.out.z[0])  # (γ,)

    def __call__(self, pos: int, parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.drafter
        if not d.shape.parent_mlp:
            return (self.out.base[0, pos] + d.parent_bias(pos, parents)).float(), self.conf_z[pos]
        z = d.node_z(self.pre[pos], self.anchor, pos, parents)                      # (P, H)
        return (d.project(z) + d.parent_bias(pos, parents)).float(), d.confidence_from_z(pos, z)


@torch.inference_mode()
def build_lattice(drafter: ParallelDrafter, hidden: torch.Tensor, root: int | Sequence[int], gamma: int, top_k: int,
                  temperature: float = 0.0, extra: Sequence[int] = ()) -> LatticeDraft:
    """γ positions of top-K candidates. Candidates at k are the top-K of the drafter's marginal
    (parents weighted by their own marginal); q_draft is that marginal; ŝ_k(x | y): at temperature 0
    c_k(y)·q_k(x|y)/max q_k(·|y) (the calibrated chance the top-1 is the target's argmax, scaled
    for lower candidates), at temperature T > 0 q_k(x|y) at temperature T (the point-mass rule
    accepts x with p_target(x)). `extra` (at most γ tokens, e.g. prompt lookup's continuation) adds
    extra[k] at position k+1 when it is not a candidate already, scored by the drafter like any
    other (0 outside its vocabulary slice) and a parent of the next position. `hidden` (H,) with `root`
    one token, or the last rows of history (T, H) with their T tokens (root last; the drafter reads
    its last `span` rows). Draft side only."""
    check(isinstance(gamma, int) and 1 <= gamma <= drafter.shape.gamma_max, "gamma", gamma,
          f"must be an integer in [1, {drafter.shape.gamma_max}] (the drafter's gamma_max)")
    check(len(extra) <= gamma, "extra", len(extra), f"must hold at most gamma ({gamma}) tokens")
    device = drafter.trunk_in.device
    rows = [int(root)] if isinstance(root, int) else [int(t) for t in root][-drafter.span:]
    hidden = hidden.reshape(-1, hidden.shape[-1])[-len(rows):]                           # (T, H)
    check(hidden.shape[0] == len(rows), "root", len(rows), f"must give one token per hidden row ({hidden.shape[0]})")
    scorer = NodeScorer(drafter, hidden.to(device), torch.tensor(rows, device=device), gamma)
    root = rows[-1]
    parents = torch.tensor([root], device=device)                       # (P,)
    weight = torch.ones(1, device=device, dtype=torch.float32)          # (P,)
    tokens, q_rows, score_rows, conf_rows, extra_at = [], [], [], [], []
    k = min(top_k, len(drafter.vocab_ids))
    own = (k,) * gamma
    for pos in range(gamma):
        logits, conf_z = scorer(pos, parents)                                       # (P, V_s), (P,) or ()
        logq = torch.log_softmax(logits, -1)                                        # (P, V_s)
        q_cond = torch.softmax(logits / temperature, -1) if temperature > 0 else logq.exp()  # (P, V_s)
        mix = (weight[:, None] * q_cond).sum(0) / weight.sum()                      # (V_s,)
        q_top, idx = torch.topk(mix, k)                                             # (K,)
        ids = drafter.vocab_ids[idx].tolist()
        q_cols = q_cond[:, idx]                                                     # (P, K)
        if pos < len(extra):
            ids, q_cols, q_top, at = with_extra(drafter, extra[pos], ids, q_cond, mix, idx, q_top)
            extra_at.append(at)
        conf = drafter.calibrated(pos, conf_z + drafter.confidence_from_q(pos, logq))               # (P,)
        if temperature > 0:
            scores = q_cols                                                         # (P, K')
        else:
            scores = conf.float()[:, None] * q_cols / q_cond.amax(-1, keepdim=True)  # (P, K')
        tokens.append(ids)
        q_rows.append(q_top.clamp(0, 1).tolist())
        score_rows.append(scores.clamp(0, 1).tolist())
        conf_rows.append(tuple(conf.float().tolist()))
        parents, weight = torch.tensor(ids, device=device), q_top
    lattice = Lattice(tokens, q_rows, score_rows)
    return LatticeDraft(lattice, tuple(conf_rows), tuple(extra_at), own)
