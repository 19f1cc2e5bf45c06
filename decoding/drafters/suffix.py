"""Suffix matching (after SuffixDecoding, Oliaro et al. 2024): a training-free lattice source for any model.
It matches the longest suffix of the context (up to MAX_NGRAM tokens) in the current context and in every
sequence of the run's memory (decoding/drafters/memory.py: earlier runs given the same memory, else none),
and proposes what followed each occurrence, as a tree whose branches carry how often each continuation was
seen. Prompt lookup is the special case of one continuation from the current context.

The store keeps at most MAX_TOKENS tokens (the oldest sequences go first); its index holds, per n-gram,
the latest MAX_HITS places it occurred, and is rebuilt without the evicted sequences' keys once it holds
twice the keys its tokens can make: measured with random text at the cap, 17 MB held and 49 MB at the peak
of a rebuild. It reads only text already in the context or in earlier
runs, so the plan stays a draft-side choice.
"""
from __future__ import annotations

import heapq
import itertools
import threading
from collections import OrderedDict
from collections.abc import Sequence

from decoding.core.draft_names import SUFFIX
from decoding.core.lattice import ROOT, Proposal, SourceNode, SourceRequest
from decoding.drafters.lattice_source import LatticeSource

MAX_NGRAM = 4               # longest suffix matched
MIN_NGRAM = 2               # shortest (a single token predicts little)
MAX_HITS = 16               # places kept per n-gram (the latest)
MAX_TOKENS = 20_000         # tokens kept per memory


class SuffixStore:
    """Sequences the model read or wrote, and per n-gram (MIN_NGRAM..MAX_NGRAM) where it occurred."""

    def __init__(self, max_tokens: int = MAX_TOKENS):
        self.max_tokens = max_tokens
        self.sequences: OrderedDict[int, list[int]] = OrderedDict()
        self.index: dict[tuple[int, ...], list] = {}        # n-gram -> [(sequence id, end), ...] latest last
        self.indexed: dict[int, int] = {}            # sequence id -> positions indexed so far
        self.tokens = 0
        self.ids = itertools.count()
        self.lock = threading.Lock()

    def open(self) -> int:
        """A new sequence (a run); its id."""
        with self.lock:
            sid = next(self.ids)
            self.sequences[sid], self.indexed[sid] = [], 0
            return sid

    def extend(self, sid: int, context: Sequence[int]) -> None:
        """The sequence now reads `context` (which only grows within a run); index its new n-grams."""
        with self.lock:
            seq = self.sequences.get(sid)
            if seq is None:
                return
            self.tokens += len(context) - len(seq)
            seq[len(seq):] = [int(t) for t in context[len(seq):]]
            for end in range(max(self.indexed[sid], MIN_NGRAM), len(seq) + 1):
                for n in range(MIN_NGRAM, min(MAX_NGRAM, end) + 1):
                    hits = self.index.setdefault(tuple(seq[end - n:end]), [])
                    hits.append((sid, end))
                    if len(hits) > MAX_HITS:
                        del hits[0]
            self.indexed[sid] = len(seq) + 1
            self._evict(keep=sid)

    def clear(self) -> None:
        """Forget every sequence (a cold start)."""
        self.restore(((), {}, {}, 0))

    def snapshot(self) -> tuple:
        with self.lock:
            return (tuple((sid, list(seq)) for sid, seq in self.sequences.items()),
                    {k: list(v) for k, v in self.index.items()}, dict(self.indexed), self.tokens)

    def restore(self, state: tuple) -> None:
        """Back to a snapshot() (a benchmark's fixed warm state)."""
        sequences, index, indexed, tokens = state
        with self.lock:
            self.sequences = OrderedDict((sid, list(seq)) for sid, seq in sequences)
            self.index = {k: list(v) for k, v in index.items()}
            self.indexed, self.tokens = dict(indexed), tokens

    def _evict(self, keep: int) -> None:
        while self.tokens > self.max_tokens and len(self.sequences) > 1:
            sid = next(iter(self.sequences))
            if sid == keep:
                break
            self.tokens -= len(self.sequences.pop(sid))
            self.indexed.pop(sid, None)
        if len(self.index) > 2 * (MAX_NGRAM - MIN_NGRAM + 1) * max(self.tokens, 1):   # evicted keys: rebuild
            index = {k: [h for h in v if h[0] in self.sequences] for k, v in self.index.items()}
            self.index = {k: v for k, v in index.items() if v}

    def continuations(self, context: Sequence[int], length: int) -> list[tuple[int, ...]]:
        """What followed the longest matched suffix of `context` (MAX_NGRAM down to MIN_NGRAM tokens), at
        most `length` tokens each, latest first; the context's own end is not a match."""
        with self.lock:
            for n in range(min(MAX_NGRAM, len(context)), MIN_NGRAM - 1, -1):
                hits = self.index.get(tuple(int(t) for t in context[-n:]), ())
                out = [tuple(self.sequences[sid][end:end + length]) for sid, end in reversed(hits)
                       if sid in self.sequences and end < len(self.sequences[sid])]
                out = [c for c in out if c]
                if out:
                    return out
        return []


def continuation_tree(conts: list[tuple[int, ...]], max_nodes: int) -> tuple[SourceNode, ...]:
    """The continuations as a tree, best-first by how often each path was seen; a node's prior is the
    share of its parent's continuations that go through it."""
    trie: dict = {}
    for cont in conts:
        node = trie
        for token in cont:
            node = node.setdefault(token, [0, {}])
            node[0] += 1
            node = node[1]
    nodes: list[SourceNode] = []
    heap = [(-count / len(conts), i, ROOT, token, count, len(conts), kids)
            for i, (token, (count, kids)) in enumerate(trie.items())]
    heapq.heapify(heap)
    order = len(heap)
    while heap and len(nodes) < max_nodes:
        neg, _, parent, token, count, of, kids = heapq.heappop(heap)
        nodes.append(SourceNode(token, parent, count / of, count / of))
        for child, (n, grand) in kids.items():
            heapq.heappush(heap, (neg * n / count, order, len(nodes) - 1, child, n, count, grand))
            order += 1
    return tuple(nodes)


class SuffixSource(LatticeSource):
    name = SUFFIX

    def __init__(self, store: SuffixStore):
        self.store, self.sid = store, None

    def start(self, prompt_ids: Sequence[int]) -> None:
        """A new sequence in the store, its prompt indexed at once (the first round may match inside it)."""
        self.sid = self.store.open()
        self.store.extend(self.sid, prompt_ids)

    def propose(self, context: Sequence[int], request: SourceRequest) -> Proposal:
        if self.sid is None:
            self.start(())
        conts = self.store.continuations(context, request.gamma)
        self.store.extend(self.sid, context)          # after matching: the context's own end is no match
        return Proposal(source=self.name, nodes=continuation_tree(conts, request.max_nodes))

    def observe_context(self, context: Sequence[int]) -> None:
        """The run's text so far into the store, its last round's tokens included (else each run's ending
        would stay a match with nothing after it, taking one of an n-gram's MAX_HITS places for good)."""
        if self.sid is not None:
            self.store.extend(self.sid, context)
