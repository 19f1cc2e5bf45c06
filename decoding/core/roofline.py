"""The roofline of a decoder forward: what it must compute and read, and the least time the device's
measured rates allow. Pure arithmetic on plain numbers (no torch), for the Lab and its tests.

A forward over n new tokens per sequence, for b sequences, each after P cached tokens:
  FLOPs  = b · n · 2 · W  +  b · L · 4 · d_q · n · (P + n)
           (every linear weight is one multiply-add per token; attention scores and the weighted sum
           over the P + n keys are two more per query-dimension per key, per layer; the n × (P + n)
           rectangle is counted whole, as the kernels compute it masked)
  bytes  = weights read once  +  b · (P + n) · kv_bytes_per_token  (the cache read back)
where W counts the weights of every matrix product (the LM head included, tied or not) and
kv_bytes_per_token = 2 (keys and values) · L · d_kv · bytes per element. Activations are not counted.

The least time is max(FLOPs / peak FLOP/s, bytes / bandwidth). Below the ridge (arithmetic intensity
FLOPs / bytes < peak FLOP/s / bandwidth) reading dominates: a forward over a few more tokens costs
about the same, which is what speculative decoding relies on.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """What the arithmetic needs to know about a decoder (lab.forward_cost.model_shape reads it)."""
    linear_params: int       # weights of every matrix product one token goes through (LM head included)
    weight_bytes: int        # bytes a forward reads for them (a tied LM head read once)
    layers: int
    q_dim: int               # attention heads × head dim
    kv_dim: int              # key/value heads × head dim
    element_bytes: int       # bytes per cached key or value element

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of the KV cache per token held, all layers, keys and values."""
        return 2 * self.layers * self.kv_dim * self.element_bytes


def forward_flops(shape: ModelShape, new_tokens: int, cached: int, batch: int = 1) -> int:
    """FLOPs of one forward over `new_tokens` per sequence after `cached` tokens, `batch` sequences."""
    linear = 2 * shape.linear_params * new_tokens
    attention = 4 * shape.layers * shape.q_dim * new_tokens * (cached + new_tokens)
    return batch * (linear + attention)


def forward_bytes(shape: ModelShape, new_tokens: int, cached: int, batch: int = 1) -> int:
    """Bytes one such forward must read at least: the weights once, each sequence's cache."""
    return shape.weight_bytes + batch * (cached + new_tokens) * shape.kv_bytes_per_token


def roofline_ms(flops: float, bytes_read: float, flops_per_s: float, bytes_per_s: float) -> float:
    """The least time the device allows, in ms: max(compute time, read time)."""
    return 1000.0 * max(flops / flops_per_s, bytes_read / bytes_per_s)


def bound_by(flops: float, bytes_read: float, flops_per_s: float, bytes_per_s: float) -> str:
    """'memory' when reading takes at least as long as computing, else 'compute'."""
    return "memory" if bytes_read / bytes_per_s >= flops / flops_per_s else "compute"


def ridge_intensity(flops_per_s: float, bytes_per_s: float) -> float:
    """FLOPs per byte read at which computing takes as long as reading."""
    return flops_per_s / bytes_per_s


def ridge_tokens(shape: ModelShape, cached: int, flops_per_s: float, bytes_per_s: float,
                 limit: int = 1 << 16) -> int | None:
    """The fewest new tokens (one sequence after `cached`) whose forward is compute-bound; None when
    none up to `limit` is. The intensity rises with n (the FLOPs grow with n, the bytes barely), so
    doubling finds a compute-bound n and bisection the first one."""
    def compute_bound(n: int) -> bool:
        return bound_by(forward_flops(shape, n, cached), forward_bytes(shape, n, cached),
                        flops_per_s, bytes_per_s) == "compute"

    hi = 1
    while hi < limit and not compute_bound(hi):
        hi *= 2
    hi = min(hi, limit)
    if not compute_bound(hi):
        return None
    lo = hi // 2                  # 0, or an n that is not compute-bound
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if compute_bound(mid) else (mid, hi)
    return hi
