"""Batched decoding in the tests: prompts of unequal lengths, and a stand-in for the lab's batch timing."""
from __future__ import annotations

from decoding.core.measures import ForwardTime

PROMPTS = [[5, 9, 2, 7], [11, 3], [8, 8, 1, 4, 6, 2, 9], [2], [30, 31, 32], [7, 7], [40, 1, 2, 3, 4, 5],
           [12, 13, 14, 15, 16], [60], [33, 3]]


def batches_up_to(limit: int):
    """A stand-in for forward_cost.batch_times that runs out of device memory from `limit` sequences on."""
    def batch_times(lm, batches, repeats, prefix_tokens):
        for b in batches:
            if b >= limit:
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
            yield ForwardTime("batch", b, (1.0,))
    return batch_times
