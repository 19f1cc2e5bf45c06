"""Token recycling (Luo et al. 2024, "Turning Trash into Treasure"): a training-free lattice source for
any causal LM. Every target forward already computes, for each token it fed, the distribution of the
token after it; the table keeps, per token id, the top-k of the latest such distribution. A round's
candidates grow from the root through the table, best-first by the product of the recorded
probabilities, so a token the target saw before proposes what the target said next last time.

The table lives in the run's memory (decoding/drafters/memory.py: empty unless the caller passes one that
earlier runs filled); it holds vocab × k token ids (int32) and probabilities (float16): 2.4 MB for a
49,152-token vocabulary at k = 8. It only ever reads forwards that already ran, so the plan stays a
draft-side choice.
"""
from __future__ import annotations

import heapq
import threading
from collections.abc import Sequence

import torch

from decoding.core.draft_names import RECYCLING
from decoding.core.lattice import ROOT, Proposal, SourceNode, SourceRequest
from decoding.drafters.lattice_source import LatticeSource

TABLE_K = 8                 # next tokens kept per token id
CHILDREN = 4                # of those, the most a node proposes
PROMPT_ROWS = 64            # fill the table from the prompt's last 64 positions at the prefill (one LM-head
#                             product; the logits kept are 64 × vocab floats, 12.6 MB for a 49k vocabulary)


class RecyclingTable:
    """Per token id, the target's top-k next tokens and their probabilities (at temperature 1) from the
    latest forward that fed it; -1 where none has yet."""

    def __init__(self, vocab_size: int, k: int = TABLE_K):
        self.next_ids = torch.full((vocab_size, k), -1, dtype=torch.int32)     # (V, k)
        self.probs = torch.zeros((vocab_size, k), dtype=torch.float16)         # (V, k)
        self.lock = threading.Lock()
        self.filled = 0                                                        # rows written so far

    @property
    def nbytes(self) -> int:
        return self.next_ids.nbytes + self.probs.nbytes

    def update(self, tokens: Sequence[int], logits: torch.Tensor) -> None:
        """logits (n, V): the distribution after each of the n tokens fed; a token fed twice keeps its last row."""
        last = {int(t): i for i, t in enumerate(tokens) if 0 <= int(t) < len(self.next_ids)}
        if not last:
            return
        rows = torch.tensor(list(last.values()), device=logits.device)
        top = torch.softmax(logits[rows].float(), -1).topk(self.next_ids.shape[1], -1)     # (m, k)
        ids = torch.tensor(list(last.keys()))
        with self.lock:
            self.filled += int((self.next_ids[ids, 0] < 0).sum())
            self.next_ids[ids] = top.indices.to("cpu", torch.int32)
            self.probs[ids] = top.values.to("cpu", torch.float16)

    def clear(self) -> None:
        """Forget every row (a cold start)."""
        with self.lock:
            self.next_ids.fill_(-1)
            self.probs.zero_()
            self.filled = 0

    def snapshot(self) -> tuple:
        with self.lock:
            return self.next_ids.clone(), self.probs.clone(), self.filled

    def restore(self, state: tuple) -> None:
        """Back to a snapshot() (a benchmark's fixed warm state)."""
        with self.lock:
            next_ids, probs, self.filled = state
            self.next_ids.copy_(next_ids)
            self.probs.copy_(probs)

    def children(self, token: int, most: int) -> list[tuple[int, float]]:
        """(next token, probability) recorded after `token`, best first; empty when never seen."""
        if not 0 <= token < len(self.next_ids):
            return []
        with self.lock:
            ids, probs = self.next_ids[token, :most].tolist(), self.probs[token, :most].tolist()
        return [(t, p) for t, p in zip(ids, probs) if t >= 0]


class RecyclingSource(LatticeSource):
    name = RECYCLING
    prompt_rows = PROMPT_ROWS

    def __init__(self, table: RecyclingTable, children: int = CHILDREN):
        self.table, self.most = table, children

    def propose(self, context: Sequence[int], request: SourceRequest) -> Proposal:
        """Best-first from the root through the table: the `max_nodes` paths of highest probability
        product, at most `gamma` deep; each node's prior is its own recorded probability."""
        nodes: list[SourceNode] = []
        heap: list = []
        order = 0
        if not context:
            return Proposal(source=self.name, nodes=())

        def push(parent: int, token: int, depth: int, survival: float) -> None:
            nonlocal order
            if depth > request.gamma:
                return
            for child, prob in self.table.children(token, self.most):
                heapq.heappush(heap, (-survival * prob, order, parent, child, prob, depth))
                order += 1

        push(ROOT, int(context[-1]), 1, 1.0)
        while heap and len(nodes) < request.max_nodes:
            neg, _, parent, token, prob, depth = heapq.heappop(heap)
            nodes.append(SourceNode(token, parent, min(1.0, max(0.0, prob)), prob))
            push(len(nodes) - 1, token, depth + 1, -neg)
        return Proposal(source=self.name, nodes=tuple(nodes))

    def observe_logits(self, tokens: Sequence[int], logits: torch.Tensor) -> None:
        self.table.update(tokens, logits)
