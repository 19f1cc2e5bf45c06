"""Verify a draft tree in ONE target forward, then keep only the accepted path in the KV cache.

Flattened tree (see decoding/core/acceptance.py): node 0 is the root, the last emitted token (not yet in
the cache); parents[i] < i. Each node attends to the cached prefix and to its ancestors and itself; its
position is past_len + depth. In transformers 5.24 a 4D mask passed as `attention_mask` is used as-is
(masking_utils._preprocess_mask_arguments); sdpa and eager both ADD a float mask to the attention
scores, so the mask here is additive float (0 allowed, dtype minimum elsewhere) in the model's dtype: a
boolean mask would be added as 0/1 under eager, silently wrong. Flash and flex attention ignore or
reinterpret such masks, so they are refused. Without depth positions the tree rows see the wrong rotary
phases.

A sliding-window layer sees only the keys within its window (a query at position p: p - window < key
position), and its cache returns only the last window - 1 cached positions before the block (its
`get_mask_sizes`), so its mask has those columns and the window cut; a hybrid model (local and global
layers) gets one mask per layer kind, keyed as its config's `layer_types`. A chain on a model that takes
no position ids (bloom, ALiBi) runs as a plain forward; trees there are refused before the run
(decoding.runtime.kv_rollback.check_architecture).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from decoding.core.acceptance import children_of
from decoding.core.errors import check
from decoding.runtime.fast_path import KVLease
from decoding.runtime.kv_rollback import FULL, MASKABLE_ATTENTION, is_sliding, roll_back, takes_positions


def check_attention(model) -> None:
    """Refuse attention implementations that do not add a custom 4D float mask to the scores."""
    impl = getattr(model.config, "_attn_implementation", None)
    check(impl in MASKABLE_ATTENTION, "attn_implementation", impl,
          f"tree verification needs one of {', '.join(MASKABLE_ATTENTION)} (custom 4D masks)")


def depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node; the root is 0."""
    children_of(parents)   # validates the tree
    out = [0] * len(parents)
    for i in range(1, len(parents)):
        out[i] = out[parents[i]] + 1
    return out


def tree_positions(parents: Sequence[int], past_len: int, device=None) -> torch.Tensor:
    """Position ids (1, q): past_len + depth."""
    return torch.tensor([[past_len + d for d in depths(parents)]], dtype=torch.long, device=device)


def tree_allowed(parents: Sequence[int]) -> torch.Tensor:
    """(q, q) bool: True where node i may attend to node j (its ancestors and itself)."""
    children_of(parents)
    q = len(parents)
    allowed = torch.eye(q, dtype=torch.bool)
    for i in range(1, q):
        allowed[i] |= allowed[parents[i]]
    return allowed


def tree_mask(parents: Sequence[int], past_len: int, dtype: torch.dtype = torch.float32,
              device=None, window: int | None = None, kv_start: int = 0) -> torch.Tensor:
    """Additive mask (1, 1, q, past_len - kv_start + q): columns are the cached positions kv_start ..
    past_len - 1, then the q nodes; 0 where node i may attend (a cached position or an ancestor, itself
    included, less than `window` positions back; None: no window), the dtype's minimum elsewhere."""
    q, cached = len(parents), past_len - kv_start
    allowed = torch.ones(q, cached + q, dtype=torch.bool)  # (q, cached + q)
    allowed[:, cached:] = tree_allowed(parents)
    if window is not None:
        at = past_len + torch.tensor(depths(parents))                                  # (q,) node positions
        keys = torch.cat([torch.arange(kv_start, past_len), at])                        # (cached + q,)
        allowed &= (at[:, None] - keys[None, :]) < window
    mask = torch.zeros(q, cached + q, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.to(device)[None, None]  # (1, 1, q, cached + q)


def layer_masks(cache, parents: Sequence[int], past_len: int, dtype: torch.dtype, device,
                layer_types: Sequence[str] | None) -> torch.Tensor | dict[str, torch.Tensor]:
    """The tree mask each layer of `cache` needs: one mask when every layer is of one kind, else one per
    kind in `layer_types` (the model's config.layer_types, which a hybrid model's forward reads)."""
    q, masks = len(parents), {}
    for index, layer in enumerate(cache.layers):
        kind = layer_types[index] if layer_types else FULL
        if kind in masks:
            continue
        if is_sliding(layer):
            kv_length, kv_start = layer.get_mask_sizes(q)
            check(kv_length - q == past_len - kv_start, "cache", type(layer).__name__,
                  f"holds {kv_length - q} positions before the tree, not the window's {past_len - kv_start}")
            masks[kind] = tree_mask(parents, past_len, dtype, device, layer.sliding_window, kv_start)
        else:
            masks[kind] = tree_mask(parents, past_len, dtype, device)
    if not masks:                                  # a cache whose layers come with the first forward
        return tree_mask(parents, past_len, dtype, device)
    return masks if len(masks) > 1 else next(iter(masks.values()))


def is_chain(parents: Sequence[int]) -> bool:
    return all(parent == i - 1 for i, parent in enumerate(parents))


@torch.inference_mode()
def verify_tree(lm, cache, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
    """One target forward over the flattened tree after what `cache` holds; logits (q, V) float32,
    row i for the token after node i's path. The cache then holds prefix + all q nodes (in node
    order); call compact_cache with the accepted path afterwards."""
    check_attention(lm.model)
    check(len(tokens) == len(parents), "tokens", len(tokens), f"must match parents ({len(parents)})")
    past = cache.get_seq_length()
    if isinstance(cache, KVLease):
        with lm.lock:
            logits = lm.fast.forward(cache, tokens, [past + d for d in depths(parents)], tree_allowed(parents))
        return lm.check_logits(logits)
    if is_chain(parents) and not takes_positions(lm.model):
        return lm.forward(list(tokens), cache)             # (q, V): the model's own causal mask and positions
    ids = torch.tensor([list(tokens)], dtype=torch.long, device=lm.device)  # (1, q)
    layer_types = getattr(lm.model.config.get_text_config(decoder=True), "layer_types", None)
    mask = layer_masks(cache, parents, past, lm.dtype, lm.device, layer_types)   # (1, 1, q, kv) or per kind
    positions = tree_positions(parents, past, lm.device)                       # (1, q)
    with lm.lock:
        out = lm.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                       **{lm.cache_kw: cache})
    return lm.check_logits(out.logits[0].float())  # (q, V)


def compact_cache(cache, past_len: int, keep: Sequence[int]) -> None:
    """Keep the first past_len cached positions and then the tree nodes `keep` (indices into the
    verified block, increasing, e.g. [0] + accepted path), dropping every other node: the one rollback
    of every cache layout (decoding.runtime.kv_rollback.roll_back)."""
    roll_back(cache, past_len, keep)
