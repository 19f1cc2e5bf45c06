"""Verify a draft tree in ONE target forward, then keep only the accepted path in the KV cache.

Flattened tree (see decoding/core/acceptance.py): node 0 is the root, the last emitted token (not yet in
the cache); parents[i] < i. Each node attends to the whole cached prefix and to its ancestors and
itself; its position is past_len + depth. In transformers 5.24 a 4D mask passed as `attention_mask`
is used as-is (masking_utils._preprocess_mask_arguments); sdpa and eager both ADD a float mask to
the attention scores, so the mask here is additive float (0 allowed, dtype minimum elsewhere) in
the model's dtype: a boolean mask would be added as 0/1 under eager, silently wrong. Flash and flex
attention ignore or reinterpret such masks, so they are refused. Without depth positions the tree
rows see the wrong rotary phases.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from decoding.core.acceptance import children_of
from decoding.core.errors import ConfigError, check
from decoding.runtime.fast_path import KVLease

MASKABLE_ATTENTION = ("sdpa", "eager")


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
              device=None) -> torch.Tensor:
    """Additive mask (1, 1, q, past_len + q): 0 where node i may attend (the prefix, its ancestors,
    itself), the dtype's minimum elsewhere."""
    q = len(parents)
    allowed = torch.ones(q, past_len + q, dtype=torch.bool)  # (q, past + q)
    allowed[:, past_len:] = tree_allowed(parents)
    mask = torch.zeros(q, past_len + q, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.to(device)[None, None]  # (1, 1, q, past + q)


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
    ids = torch.tensor([list(tokens)], dtype=torch.long, device=lm.device)  # (1, q)
    mask = tree_mask(parents, past, lm.dtype, lm.device)                      # (1, 1, q, past + q)
    positions = tree_positions(parents, past, lm.device)                     # (1, q)
    with lm.lock:
        out = lm.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                       **{lm.cache_kw: cache})
    return lm.check_logits(out.logits[0].float())  # (q, V)


@torch.inference_mode()
def compact_cache(cache, past_len: int, keep: Sequence[int]) -> None:
    """Keep the first past_len cached positions and then the tree nodes `keep` (indices into the
    verified block, in the given order, e.g. [0] + accepted path), dropping every other node.
    Works on the layer key/value tensors (B, H, T, D) of full-attention DynamicCache layers, or of a
    fast-path lease's static layers (there only the valid length shrinks); DynamicCache.crop only trims
    the tail."""
    total = cache.get_seq_length()
    check(0 <= past_len <= total, "past_len", past_len, f"must be in [0, {total}]")
    check(all(0 <= k < total - past_len for k in keep) and len(set(keep)) == len(keep), "keep",
          tuple(keep), f"must be distinct node indices in [0, {total - past_len})")
    layers = cache.kv.layers if isinstance(cache, KVLease) else _dynamic_layers(cache)
    moved = next((i for i, k in enumerate(keep) if k != i), len(keep))     # nodes before it stay in place
    end = past_len + len(keep)
    if moved < len(keep):     # copy the few later nodes down (keep is increasing: reads come before writes)
        tail = (past_len + torch.tensor(list(keep[moved:]), dtype=torch.long)).to(layers[0].keys.device)
        for layer in layers:
            layer.keys[..., past_len + moved:end, :] = layer.keys.index_select(-2, tail)
            layer.values[..., past_len + moved:end, :] = layer.values.index_select(-2, tail)
    if isinstance(cache, KVLease):
        cache.crop(end - total)
        return
    for layer in layers:
        layer.keys = layer.keys[..., :end, :]                 # (B, H, past + len(keep), D)
        layer.values = layer.values[..., :end, :]


def _dynamic_layers(cache) -> list:
    from transformers.cache_utils import DynamicLayer

    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise ConfigError("cache", type(layer).__name__,
                              "tree verification supports full-attention DynamicCache layers only")
    return list(cache.layers)
