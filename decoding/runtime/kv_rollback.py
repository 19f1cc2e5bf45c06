"""Rolling a KV cache back after a verification forward: keep the verified prefix and the accepted nodes
of the block just fed, drop every other position. One mechanism for every cache layout a strategy meets
(speculative decoding's crop, DSpark's tree compaction, a draft model's own cache, the cost profiler):

- full-attention layers (transformers' DynamicLayer) hold every position: the kept nodes are copied down
  over the dropped ones and the tail is sliced off;
- sliding-window layers (DynamicSlidingWindowLayer) keep only the last window - 1 positions, so a crop
  past the window could not bring back what they evicted. A rollback cache (`rollback_cache`) turns on
  their past recording: a forward then keeps the window before the block it fed, and `roll_back` trims
  the layer to its window again afterwards (memory: window - 1 + one block per layer, not the context);
- hybrid caches (local and global layers, e.g. gemma2, gemma3) are rolled back layer by layer, each by
  its kind;
- the fast path's static caches (full attention in every layer) copy the kept nodes down and move
  their valid length.

What cannot be rolled back (chunked or linear attention layers) or verified as a tree (a model that takes
no position ids, e.g. bloom's ALiBi) is refused before the run by `check_architecture`, in one line
naming the architecture and the reason."""
from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence

import torch

from decoding.core.errors import ConfigError, check
from decoding.runtime.fast_path import KVLease

FULL = "full_attention"
SLIDING = "sliding_attention"
ROLLBACK_KINDS = (FULL, SLIDING)          # the attention layer kinds a rollback handles
MASKABLE_ATTENTION = ("sdpa", "eager")    # attention that adds a custom 4D float mask to the scores


# ------------------------------------------------------------------------------ what a model's cache holds
def architecture(model) -> str:
    """The model's transformers architecture name (its config's model_type), e.g. 'gemma3_text'."""
    return str(getattr(model.config, "model_type", None) or type(model).__name__)


def attention_kinds(model) -> tuple[str, ...]:
    """Each decoder layer's attention kind, as transformers lays out the model's cache ('full_attention',
    'sliding_attention', 'chunked_attention', a linear-attention kind, ...)."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    config = model.config.get_text_config(decoder=True)
    return tuple(get_layer_types_and_kwargs(config)[0])


def takes_positions(model) -> bool:
    """Whether the model takes position ids (a tree's nodes need theirs: past + depth): its forward or its
    base model's names them (a wrapper over the outer forward, e.g. a hook taking **kwargs, hides its own)."""
    for module in (model, getattr(model, "base_model", model)):
        try:
            if "position_ids" in inspect.signature(inspect.unwrap(type(module).forward)).parameters:
                return True
        except (TypeError, ValueError):
            continue
    return False


def rollback_problem(model) -> str | None:
    """Why rejected drafts cannot be rolled back out of this model's cache (None: they can)."""
    other = sorted(set(attention_kinds(model)) - set(ROLLBACK_KINDS))
    if other:
        return f"its {', '.join(other)} layers cannot be rolled back to a shorter context"
    return None


def tree_problem(model) -> str | None:
    """Why a draft tree cannot be verified in one forward of this model (None: it can)."""
    if not takes_positions(model):
        return ("it takes no position ids (keys are placed by their order, as with ALiBi), so a tree's "
                "nodes cannot be given their depths; use select 'chain'")
    kinds = set(attention_kinds(model))
    if len(kinds) > 1 and getattr(model.config.get_text_config(decoder=True), "layer_types", None) is None:
        return f"its layers mix {', '.join(sorted(kinds))} without a per-layer mask"
    return None


def check_architecture(lm, strategy: str, tree: bool = False) -> None:
    """Refuse, before the run, a strategy that rolls back drafts on a model whose cache cannot be rolled
    back, or a tree verification the model cannot do: one line naming the architecture and the reason."""
    problem = rollback_problem(lm.model)
    check(problem is None, "strategy", strategy, f"cannot run on {architecture(lm.model)} models: {problem}")
    if tree:
        impl = getattr(lm.model.config, "_attn_implementation", None)
        check(impl in MASKABLE_ATTENTION, "attn_implementation", impl,
              f"tree verification needs one of {', '.join(MASKABLE_ATTENTION)} (custom 4D masks)")
        problem = tree_problem(lm.model)
        check(problem is None, "select", "tree", f"cannot verify a draft tree on {architecture(lm.model)} "
              f"models: {problem}")


# ------------------------------------------------------------------------------ the cache and its rollback
def rollback_cache(cache):
    """`cache` ready for roll_back: its sliding-window layers record the positions a crop needs (a no-op
    for full-attention layers and the fast path's static caches). Returns the cache."""
    record = getattr(cache, "activate_past_recording", None)
    if record is not None:
        record()
    return cache


@functools.cache
def _layer_classes() -> tuple[type, type]:
    """transformers' (full-attention, sliding-window) dynamic cache layer classes."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    return DynamicLayer, DynamicSlidingWindowLayer


def is_sliding(layer) -> bool:
    return isinstance(layer, _layer_classes()[1])


def roll_back(cache, past_len: int, keep: Sequence[int] = ()) -> None:
    """Keep the first `past_len` positions of `cache` and then the nodes `keep` of the block fed after
    them (indices into that block, increasing: e.g. [0] + a tree's accepted path; () crops the block),
    dropping every other position. Sliding-window layers are trimmed back to their window."""
    total = cache.get_seq_length()
    check(0 <= past_len <= total, "past_len", past_len, f"must be in [0, {total}]")
    fed, keep = total - past_len, list(keep)
    check(all(0 <= k < fed for k in keep) and all(a < b for a, b in zip(keep, keep[1:])), "keep", tuple(keep),
          f"must be increasing node indices in [0, {fed})")
    if isinstance(cache, KVLease):
        _roll_back_static(cache, past_len, fed, keep)
        return
    full, sliding = _layer_classes()
    kinds = [type(layer) for layer in cache.layers]
    bad = next((kind for kind in kinds if kind is not full and kind is not sliding), None)
    if bad is not None:
        raise ConfigError("cache", bad.__name__, "cannot be rolled back (full-attention and sliding-window "
                          "DynamicCache layers, or the fast path's static cache, can)")
    if sliding not in kinds and (not keep or keep[-1] == len(keep) - 1):
        _crop_full(cache.layers, past_len + len(keep), fed == len(keep))   # the common round: a tail crop
        return
    for layer, kind in zip(cache.layers, kinds):
        if layer.is_initialized:
            _roll_back_layer(layer, kind is sliding, past_len, fed, keep)


def _crop_full(layers, end: int, nothing: bool) -> None:
    """Full-attention layers whose kept nodes are in place: each keeps its first `end` positions."""
    if nothing:
        return                                   # nothing dropped: a fully accepted round
    for layer in layers:
        if layer.is_initialized:
            layer.keys = layer.keys[..., :end, :]                   # (B, H, end, D)
            layer.values = layer.values[..., :end, :]


def _roll_back_layer(layer, sliding: bool, past_len: int, fed: int, keep: list[int]) -> None:
    """One layer: its last `fed` positions are the block; what it holds before them is its base."""
    held = layer.keys.shape[-2]
    base = held - fed
    if base < 0 or (sliding and base < min(past_len, layer.sliding_window - 1)):
        raise RuntimeError(f"a cache layer kept {held} positions, too few to roll back {fed} "
                           "(a sliding-window cache must record its past: rollback_cache)")
    if keep and keep[-1] != len(keep) - 1:                     # some kept node is not in place
        _copy_down(layer, base, keep)
    end = base + len(keep)
    start = max(0, end - (layer.sliding_window - 1)) if sliding else 0
    if start or end < held:
        layer.keys = layer.keys[..., start:end, :]                 # (B, H, kept, D)
        layer.values = layer.values[..., start:end, :]
    if sliding:
        layer.cumulative_length = past_len + len(keep)


@torch.inference_mode()
def _copy_down(layer, base: int, keep: list[int]) -> None:
    """Write the kept nodes right after the base (keep is increasing: reads come before writes)."""
    moved = next(i for i, k in enumerate(keep) if k != i)            # nodes before it stay in place
    tail = (base + torch.tensor(keep[moved:], dtype=torch.long)).to(layer.keys.device)
    end = base + len(keep)
    layer.keys[..., base + moved:end, :] = layer.keys.index_select(-2, tail)
    layer.values[..., base + moved:end, :] = layer.values.index_select(-2, tail)


@torch.inference_mode()
def _roll_back_static(lease: KVLease, past_len: int, fed: int, keep: list[int]) -> None:
    """The fast path's static layers: positions past the valid length are never read, so only the kept
    nodes move and the length shrinks."""
    layers = [layer for layer in lease.kv.layers if layer.is_initialized]
    moved = next((i for i, k in enumerate(keep) if k != i), len(keep))
    end = past_len + len(keep)
    if moved < len(keep) and layers:
        tail = (past_len + torch.tensor(keep[moved:], dtype=torch.long)).to(layers[0].keys.device)
        for layer in layers:
            layer.keys[..., past_len + moved:end, :] = layer.keys.index_select(-2, tail)
            layer.values[..., past_len + moved:end, :] = layer.values.index_select(-2, tail)
    lease.crop(end - (past_len + fed))
